"""Source -> IR after every pass. The one place that runs the pipeline."""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

from .arch import DEFAULT as DEFAULT_ARCH, get as get_arch
from .errors import CheckIncompleteWarning, PipelineWarning, Source, TilecError, os_reason, recursion_checked
from .frontend import parse
from .ir import nodes as ir
from .ir.printer import kernel as print_kernel
from .ir.verify import verify
from .passes import PASS_NAMES, PIPELINE, Options


def load_source(src) -> Source:
    """A path to a .tile file (a str ending in ".tile" on one line, or an
    os.PathLike), or the program text itself (any other str)."""
    if isinstance(src, Source):
        return src
    if isinstance(src, os.PathLike) or (isinstance(src, str) and "\n" not in src and src.endswith(".tile")):
        return read_source(src)
    if not isinstance(src, str):
        raise TypeError(f"a tilec program is a path (a str ending in '.tile', or an os.PathLike such as "
                        f"pathlib.Path) or the program text (a str), got {type(src).__name__}")
    return Source("<string>", src)


def read_source(path) -> Source:
    """The file at `path` (any name: the command line's FILE is always a path), or a
    TilecError "cannot read PATH: is a directory" (the OS's reason). A relative
    `examples/NAME.tile` that does not exist is the example shipped in the
    package (tilec/examples), so the documented commands work from any directory."""
    try:
        return Source(str(path), Path(path).read_text(encoding="utf-8-sig"))     # (a BOM, as editors write)
    except FileNotFoundError as e:
        packaged = _packaged_example(path)
        if packaged is not None:
            return Source(str(path), packaged)
        raise TilecError(f"cannot read {path}: {os_reason(e)}") from None
    except OSError as e:
        raise TilecError(f"cannot read {path}: {os_reason(e)}") from None
    except UnicodeDecodeError:
        raise TilecError(f"cannot read {path}: not UTF-8 text") from None


def _packaged_example(path):
    """The text of the packaged example that the relative path `examples/NAME.tile`
    names, or None (another path, or no such example)."""
    parts = Path(path).parts
    if len(parts) != 2 or parts[0] != "examples" or not parts[1].endswith(".tile"):
        return None
    from ._resources import resource
    try:
        return (resource("examples") / parts[1]).read_text()
    except (OSError, ValueError):
        return None


def program_key(source: Source, consts: dict, **variant) -> tuple:
    """What a kernel built from `source` depends on: the program, its const
    overrides, the test hook's expect-tx skew, and the variant (arch, debug, ...).
    tilec.compile's and the interpreter's kernel caches, the disk cache and the
    names of torch operators are all keyed by it."""
    return (source.name, source.text, tuple(sorted(consts.items())),
            os.environ.get("TILEC_TEST_EXPECT_TX_SKEW", "0")) + tuple(sorted(variant.items()))


class Program:
    """What a compiled Kernel and an InterpretedKernel share: the IR after every
    pass (`self._lowered`), its inspection, and the thread-copy variant."""

    def ir(self, after: str | None = None) -> str:
        """The IR after the pass named `after` (a pass, "after-<pass>", or an alias:
        "after-barriers" is "insert-barriers"); with no name, the list of passes."""
        if after is None:
            return "\n".join(PASS_NAMES) + "\n"
        return self._lowered.ir_text(pass_name(after))     # a wrong name before lowering

    def tma_table(self) -> str:
        """`tilec emit --emit tma`: every TMA copy, its map, box and bytes."""
        from .codegen.report import tma_table
        return tma_table(self._lowered.kernel)

    def export(self, out_dir, name: str | None = None, fallback: bool | None = None, fixes=(), **symbols) -> list:
        """Write this kernel into the directory `out_dir` as `tilec export` does: its
        cubin, a C header and a C++ launcher that need cuda.h and libcuda only
        (docs/language.md §15); the paths written. Shape symbols given here are
        fixed first (k.export("build", C=24) writes k.fixed(C=24)). name: the
        files' and the function's name (default: the kernel's; the function is
        tilec_NAME). fallback (default: as compiled): embed the thread-copy variant.
        fixes: dicts of shape symbols to values, as `tilec export --fix`: each such
        program is exported too and run by the launcher for arguments that have
        them; k.export(dir, fixes=k.fixes) does in C++ what this kernel's calls do."""
        from .codegen.export import check_name, generate
        if name is not None:
            check_name(name)
        kernel = self._compiled()
        if symbols:
            kernel = kernel.fixed(**symbols)
        return generate(kernel, self._fallback_allowed if fallback is None else fallback, name,
                        fixes).write(out_dir)

    def _launcher_fixed(self, symbols):
        """The launcher of this program with `symbols` fixed (k.fixed, compiled on first
        use), for a launch whose arguments need them; remembered in last_fix and, once
        it compiled, in fixes."""
        self.last_fix = dict(symbols)       # autotuning compiles the other candidates' fixed programs at once
        run = self.fixed(**symbols)._launcher
        if symbols not in self._fixes:
            self._fixes.append(dict(symbols))
        return run

    @property
    def fixes(self) -> list:
        """The shape symbols launches of this kernel fixed, one dict per program
        ([{"C": 24}, ...]), in the order they were first needed (§11)."""
        return [dict(f) for f in self._fixes]

    def _settings(self) -> str:
        """The consts, then any shape symbols fixed by the overrides, as repr() shows them."""
        consts = ", ".join(f"{k}={v}" for k, v in self.consts.items())
        fixed = ", ".join(f"{k}={v}" for k, v in self._overrides.items() if k not in self.consts)
        return consts + (f"; {fixed}" if fixed else "")


@dataclass
class Lowered:
    source: Source
    consts: dict
    stages: dict            # pass name -> Kernel after that pass

    @property
    def kernel(self) -> ir.Kernel:
        return self.stages[PASS_NAMES[-1]]

    def ir_text(self, after: str) -> str:
        return print_kernel(self.stages[pass_name(after)])


# Short names of passes, for `k.ir("after-barriers")` (docs/design.md §4).
PASS_ALIASES = {"barriers": "insert-barriers"}


def pass_name(name: str) -> str:
    """The pass that `name` names: a pass of PASS_NAMES ("insert-barriers"), the
    same with "after-" in front ("after-insert-barriers"), or an alias of
    PASS_ALIASES with or without it ("barriers", "after-barriers")."""
    if not isinstance(name, str):
        raise TilecError(f"a pass name is a str, got {name!r}; passes: {', '.join(PASS_NAMES)}")
    for n in (name, name[len("after-"):] if name.startswith("after-") else None):
        if n in PASS_NAMES:
            return n
        if n in PASS_ALIASES:
            return PASS_ALIASES[n]
    aliases = ", ".join(f"{a} = {p}" for a, p in PASS_ALIASES.items())
    raise TilecError(f"no pass named '{name}'; passes: {', '.join(PASS_NAMES)} (each also as after-<pass>; "
                     f"aliases: {aliases})")


@recursion_checked
def lower(src, consts: dict | None = None, tma: bool = True, arch: str = DEFAULT_ARCH) -> Lowered:
    """`tma=False`: the thread-copy variant. An architecture without TMA
    (sm_80 / sm_86 / sm_89) always gets the thread-copy lowering."""
    source = load_source(src)
    consts = dict(consts or {})
    target = get_arch(arch)
    opts = Options(consts, tma and target.tma, int(os.environ.get("TILEC_TEST_EXPECT_TX_SKEW", "0")), target.name)
    k = parse(source)
    stages = {"parse": k}
    verify(k, "parse")
    for p in PIPELINE:
        k = p.run(k, opts)
        verify(k, p.NAME)
        stages[p.NAME] = k
    warn_notes(k.check_notes, k.pipeline_notes)
    return Lowered(source, consts, stages)


def warn_notes(check_notes, pipeline_notes):
    """What check-barriers left unchecked, as tilec.CheckIncompleteWarning, and the
    pipelined loops that run plain, as tilec.PipelineWarning: at every lowering, and
    from a disk-cache entry at every load (kernel.Kernel)."""
    for note in check_notes:
        warnings.warn(CheckIncompleteWarning(note), stacklevel=3)
    for note in pipeline_notes:
        warnings.warn(PipelineWarning(note), stacklevel=3)
