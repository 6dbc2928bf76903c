"""The `tilec` command: emit any stage of a kernel, check a program, export a kernel
for use without Python, run the demo."""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from .errors import CheckIncompleteWarning, PipelineWarning, TilecError, os_reason
from .frontend.names import COMPILE_OPTIONS
from .passes import PASS_NAMES

EMITS = ("cuda", "host", "ptx", "ir", "tma")
ARCH_HELP = ("the target: sm_80, sm_86, sm_89 (no TMA: thread copies, no gemm), sm_90a, sm_100a, sm_120a "
             "(default: the GPU's, sm_90a without one)")
MAX_CHECKED = 1024      # autotune.MAX_CHECKED (the command line does not import autotune until it checks)
DEFINE_HELP = "override a const, or fix a shape symbol (-D C=24: the kernel takes 24 only)"


def _consts(pairs, option="-D"):
    out = {}
    for p in pairs or []:
        name, eq, value = p.partition("=")
        if not eq or not name.isidentifier():
            raise TilecError(f"{option} takes NAME=VALUE, got '{p}'")
        if option == "-D" and name in COMPILE_OPTIONS:
            raise TilecError(f"-D {p}: '{name}' is a keyword argument of tilec.compile(), which no const may be "
                             "named (a shape symbol so named cannot be fixed)")
        if name in out:
            raise TilecError(f"{option} {name} is given twice ({name}={out[name]} and {p}): give each "
                             f"{'const' if option == '-D' else 'symbol'} once")
        try:
            out[name] = int(value, 0)
        except ValueError:
            raise TilecError(f"{option} {name}: '{value}' is not an integer") from None
    return out


def _source(args):
    """FILE, which is always a path (whatever its name), read."""
    from .compiler import read_source
    return read_source(args.file)


def _arch(args):
    """--arch, checked (tilec.arch.NAMES); without it the GPU's, sm_90a with none."""
    from .arch import get
    from .runtime.driver import target_arch
    return get(args.arch if args.arch is not None else target_arch()).name


def _cmd_emit(args):
    from .compiler import lower
    from .kernel import compile as compile_kernel
    consts = _consts(args.define)
    arch = _arch(args)
    if args.emit == "ir":
        lowered = lower(_source(args), consts, arch=arch)
        text = lowered.ir_text(args.after or PASS_NAMES[-1])
    elif args.after:
        raise TilecError("--after goes with --emit ir")
    else:
        k = compile_kernel(_source(args), arch=arch, tune=False, **consts)     # a tune statement's declared consts
        text = {"cuda": k.cuda_source, "host": k.host_source, "ptx": k.ptx}.get(args.emit) or k.tma_table()
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _cmd_check(args):
    """The kernel of the declared consts; with a tune statement, every other
    candidate too (those the compiler refuses are listed, not failures), or,
    past --max-candidates, a sample spread over the space (said up front)."""
    from .autotune import checked_candidates, compile_candidates, space_size, statement_space
    from .kernel import compile as compile_kernel, env_debug
    consts, arch = _consts(args.define), _arch(args)
    if args.max_candidates < 0:
        raise TilecError(f"--max-candidates takes a count (0: every candidate), got {args.max_candidates}")
    source = _source(args)
    space, first, where = statement_space(source, consts)
    k = compile_kernel(source, arch=arch, tune=False, **consts, **first)    # as the first candidate
    if not space:
        print(f"{args.file}: ok (kernel {k.name}, {len(k.cubin)}-byte cubin for {k.arch})")
        return
    total, limit = space_size(space), args.max_candidates
    cands, kept, pool, sampled = checked_candidates(source, consts, space, first, where, limit)
    if pool == total:
        excluded = f"; {total - kept} more excluded by the tune condition for every shape" if kept < total else ""
    else:
        excluded = f"; the tune condition excludes {pool - kept} of {pool} drawn from the space for every shape" \
            if kept < pool else ""
    if sampled:
        shape = " x ".join(str(len(v)) for v in space.values())
        if pool < total:
            what = (f"tilec check draws {pool} of them{f' (the tune condition keeps {kept})' if where else ''} and "
                    f"compiles {f'{len(cands)} of those (--max-candidates {limit})' if len(cands) < kept else 'those'}")
        else:
            what = (f"{f'{kept} left by the tune condition; ' if kept < total else ''}tilec check compiles "
                    f"{len(cands)} of them drawn at random (--max-candidates {limit})")
        print(f"{args.file}: warning: tune: the space has {total} candidates ({shape} values); {what}: narrow the "
              "space (a `where` condition, fewer values, -D for a const) or give --max-candidates 0 to check every "
              "one", file=sys.stderr)
    elif len(cands) > _SAY_ABOVE:
        print(f"{args.file}: tune: checking {len(cands)} candidates{excluded}", file=sys.stderr)
    sys.stderr.flush()
    with warnings.catch_warnings():     # said below, a line per candidate (or group of them)
        warnings.simplefilter("ignore", PipelineWarning)
        compiled, errors = compile_candidates(source, [{**consts, **cfg} for cfg in cands[1:]], arch, True,
                                              env_debug())
    refused = [(cands[1 + i], errors[i]) for i in sorted(errors)]
    plain = [(cands[1 + i], note) for i in sorted(compiled) for note in compiled[i].pipeline_notes]
    sample = f"; a sample of the space's {total}" if sampled else ""
    print(f"{args.file}: ok (kernel {k.name}, {len(k.cubin)}-byte cubin for {k.arch}; tune: "
          f"{len(cands) - len(refused)} of {len(cands)} candidates compile{excluded}{sample})")
    for line in _refusals(cands, refused) + _grouped(cands, plain, "compile with a warning", "compiles with a warning"):
        print(f"{args.file}: {line}")


_SAY_ABOVE = 32       # tilec check says up front how many candidates it compiles where more than this


def _refusals(tried: list, refused: list) -> list:
    """A line per refused candidate, "candidate BM=192 ... refused: <error>",
    grouped by error (_grouped)."""
    return _grouped(tried, [(cfg, e.render().splitlines()[0]) for cfg, e in refused], "refused", "refused")


def _grouped(tried: list, said: list, verb: str, verb_one: str) -> list:
    """A line per (candidate, message) of `said`, "candidate BM=192 ... <verb_one>:
    <message>", grouped by message (in the order of each message's first
    candidate); the candidates of one message that are every candidate tried with
    a few consts fixed are one line instead: "16 candidates with PERSISTENT=0
    STREAM_K=1 <verb>: <message>"."""
    by_text = {}
    for cfg, text in said:
        by_text.setdefault(text, []).append(cfg)
    lines = []
    for text, cfgs in by_text.items():
        fixed = {n: v for n, v in cfgs[0].items() if all(c[n] == v for c in cfgs)}
        alike = sum(all(c[n] == v for n, v in fixed.items()) for c in tried)
        if len(cfgs) > 1 and fixed and alike == len(cfgs):     # every candidate tried with those values
            what = " ".join(f"{n}={v}" for n, v in fixed.items())
            lines.append(f"{len(cfgs)} candidates with {what} {verb}: {text}")
        else:
            lines += [f"candidate {' '.join(f'{n}={v}' for n, v in c.items())} {verb_one}: {text}" for c in cfgs]
    return lines


def _cmd_export(args):
    from .autotune import statement_space
    from .codegen.export import export_consts
    source, consts = _source(args), _consts(args.define)
    fixes = [_consts(f.split(","), "--fix") for f in args.fix or []]
    for path in export_consts(source, args.output, consts, arch=args.arch, fallback=args.fallback, name=args.name,
                              fixes=fixes):
        print(path)
    space, first, _ = statement_space(source, consts)
    if space:       # the launcher runs one program: what the tune statement would pick is not in it
        print(f"{args.file}: note: the export holds the tune statement's declared values "
              f"({' '.join(f'{n}={v}' for n, v in first.items())}), not a tuned choice: give the values tuned for "
              "your shapes with -D, or tune in Python and write the choice with k.export(DIR) after a call",
              file=sys.stderr)


def _cmd_demo(args):
    from .demo import main as demo
    demo(None if args.file is None else _source(args))


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """tilec's warnings as a compiler prints them: `file:line:col: warning: message`
    (their text starts with the .tile location); others as Python prints them."""
    if issubclass(category, (CheckIncompleteWarning, PipelineWarning)):
        where, sep, text = str(message).partition(": ")
        print(f"{where}: warning: {text}" if sep and where.count(":") >= 2 else f"warning: {message}",
              file=sys.stderr)
    elif issubclass(category, RuntimeWarning) and Path(filename).resolve().is_relative_to(_PACKAGE):
        print(f"warning: {message}", file=sys.stderr)      # tilec's own (a TILEC_* setting it cannot use)
    else:
        print(warnings.formatwarning(message, category, filename, lineno, line), end="", file=sys.stderr)


_PACKAGE = Path(__file__).resolve().parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tilec", description="tile language -> CUDA C++ with Hopper TMA")
    sub = ap.add_subparsers(dest="command", required=True)
    e = sub.add_parser("emit", help="print one stage of a kernel")
    e.add_argument("file")
    e.add_argument("--emit", choices=EMITS, default="cuda")
    e.add_argument("--after", help="with --emit ir: the pass to print the IR after (default: the last)")
    e.add_argument("-D", dest="define", action="append", metavar="NAME=VALUE", help=DEFINE_HELP)
    e.add_argument("--arch", help=ARCH_HELP)
    e.set_defaults(run=_cmd_emit)
    c = sub.add_parser("check", help="parse, check and compile (with a tune statement, every candidate); exit 0 "
                                     "or print the errors")
    c.add_argument("file")
    c.add_argument("-D", dest="define", action="append", metavar="NAME=VALUE", help=DEFINE_HELP)
    c.add_argument("--arch", help=ARCH_HELP)
    c.add_argument("--max-candidates", type=int, default=MAX_CHECKED, metavar="N",
                   help=f"with a tune statement, compile at most N of its candidates, a sample of them where there are "
                        f"more (default {MAX_CHECKED}; 0: every one)")
    c.set_defaults(run=_cmd_check)
    x = sub.add_parser("export", help="write the kernel as a cubin, a C header and a C++ launcher (no Python "
                                      "needed to run it)")
    x.add_argument("file")
    x.add_argument("-o", dest="output", required=True, metavar="DIR", help="the directory to write into")
    x.add_argument("-D", dest="define", action="append", metavar="NAME=VALUE", help=DEFINE_HELP)
    x.add_argument("--arch", default="sm_90a", help="the cubin's architecture (default sm_90a)")
    x.add_argument("--name", help="name the export NAME (files NAME.h, NAME.cc, function tilec_NAME; default: the "
                                  "kernel's), so that exports of one kernel with different -D link together")
    x.add_argument("--fix", action="append", metavar="SYMBOL=VALUE[,...]",
                   help="also export the program compiled with these shape symbols fixed (NAME_C24.*), which the "
                        "launcher runs for arguments that have them (--fix C=24: 24 channels); repeatable")
    x.add_argument("--no-fallback", dest="fallback", action="store_false",
                   help="leave out the thread-copy variant: an argument that breaks a TMA rule is an error")
    x.set_defaults(run=_cmd_export)
    d = sub.add_parser("demo", help="compile an example, print its CUDA, and on a GPU run and check it")
    d.add_argument("file", nargs="?", default=None)
    d.set_defaults(run=_cmd_demo)
    args = ap.parse_args(argv)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            args.run(args)
            sys.stdout.flush()          # a write error here, not at exit
    except TilecError as err:
        print(err.render(), file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    except OSError as err:          # one line, like a TilecError, never a traceback
        where = f"{err.filename}: " if err.filename is not None else ""
        print(f"error: {where}{os_reason(err)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
