"""Autotuning: a program's `tune` statement (`tune BN in (128, 256), STAGES in (3, 4);`,
docs/language.md §3), or `tilec.compile(src, tune={"BN": (128, 256), ...}, key=("M", "N", "K"))`.

The first call with new key values (the named shape symbols and scalars, read
from the call's arguments the way the host wrapper binds them) compiles the
candidates of the tune space (the cartesian product, in order, less those its
`where` condition, if any, rejects at these key values: Condition; those the
compiler refuses are skipped with their messages), times them on the call's
own arguments with CUDA events (in rounds, every candidate once a round; those
far behind the fastest after the first rounds are timed no more (PRUNE), the closest
few timed again in a run-off; one whose outputs after its warm-up launch differ from
the first candidate's that ran is not timed or chosen, with a TuneMismatchWarning:
_Reference), restores the tensors the kernel writes, runs
the fastest once for the real result and remembers the choice: in memory and
in the disk cache beside the cubins, keyed by the program and its consts, the
architecture, the tune space, the key values, the GPU's name and tilec's build.
With tune_l2="cold" a buffer four times the L2 is written before each timed
launch (the inputs come from DRAM, as a decode step's weights do), and the
choice is one of its own.
A warm start reads the choice and compiles (or loads) only the winner.

Candidates not compiled yet are built by compile workers, python processes
in parallel (runtime/workers.py): in one process lowering holds the GIL and
NVRTC is serialised (runtime/nvrtc.py's lock). What is left is made in
threads (compile_candidates), where one candidate's lowering overlaps
another's NVRTC call: gemm.tile's 64 candidates of session 14 without workers took 24.6 s
one after another and 19.6 s in threads (2-core CPU machine, no GPU).

Not timed (a tune statement's declared values are taken, or the first
candidate of tune= that compiles): TILEC_AUTOTUNE=0, arguments that are not
all CUDA torch tensors and numbers (numpy arrays are copied through the host on
every call; cupy has no event timing here), and backend="interpret" (timing on
the CPU means nothing).

A tune statement's candidates start with its declared values, which
tilec.compile compiles at once (their errors are the program's). Its key is
every shape symbol of the header unless key= is given; consts given to
tilec.compile leave its space. tilec.compile reads the statement, like the
header (`signature`), with regular expressions: a warm start builds no parser."""
from __future__ import annotations

import functools
import itertools
import math
import operator
import os
import random
import re
import statistics
import sys
import threading
import warnings

from . import kernel as kernel_mod
from ._version import __version__
from .compiler import program_key, warn_notes
from .errors import CaptureError, DeviceError, PipelineWarning, TilecError, TuneLaunchWarning, TuneMismatchWarning
from .frontend.names import COMPILE_OPTIONS
from .runtime import cache, host, nvrtc, workers

_CHOICES: dict = {}        # disk key -> chosen consts, shared by every TunedKernel of this process
_CHOICES_LOCK = threading.Lock()


def enabled() -> bool:
    return os.environ.get("TILEC_AUTOTUNE", "1") not in ("0", "", "off", "false")


def check_space(tune) -> tuple:
    """tune= checked: (names, (values, ...) of each), or a TilecError."""
    if not isinstance(tune, dict) or not tune:
        raise TilecError(f"tune= takes a non-empty dict {{const name: (value, ...)}}, got {tune!r}")
    names, values = [], []
    for name, vals in tune.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise TilecError(f"tune=: a key is a const's name, got {name!r}")
        try:
            vals = None if isinstance(vals, (str, bytes, dict)) else tuple(vals)
        except TypeError:
            vals = None
        if not vals:
            raise TilecError(f"tune[{name!r}]: a non-empty tuple of values, e.g. {{{name!r}: (64, 128)}}, "
                             f"got {tune[name]!r}")
        try:
            if any(isinstance(v, bool) for v in vals):
                raise TypeError
            vals = tuple(operator.index(v) for v in vals)      # numpy integers too, as Python ints
        except TypeError:
            bad = next(v for v in vals if isinstance(v, bool) or not hasattr(v, "__index__"))
            raise TilecError(f"tune[{name!r}]: a const's values are integers, got {bad!r}") from None
        if len(set(vals)) != len(vals):
            raise TilecError(f"tune[{name!r}]: a value comes twice in {vals!r}")
        names.append(name)
        values.append(vals)
    return names, values


def check_tune(source, consts: dict, tune, key) -> tuple:
    """tilec.compile's tune= and key= checked against the program, before anything
    is compiled: (tune as {name: (value, ...)}, key as a tuple or None for the
    default). Each tuned name must be a const of the program and not also given
    as a const; each key name a shape symbol or a scalar parameter."""
    names, values = check_space(tune)
    known = _consts_of(source)
    for name in names:
        if name not in known:
            raise TilecError(f"tune=: kernel '{_kernel_name(source)}' has no const '{name}' to tune "
                             f"(its consts: {', '.join(known)})")
    overlap = [name for name in names if name in consts]
    if overlap:
        raise TilecError(f"{', '.join(sorted(overlap))} both tuned and given as a const")
    if key is not None:
        key = _key_tuple(key)
        key_reader(signature(source), key)        # each name a shape symbol or a scalar, or its error
    return dict(zip(names, values)), key


def candidates(tune: dict, first: dict | None = None) -> list:
    """The tune space's cartesian product, in order: a list of {name: value}.
    `first` (a tune statement's declared values) is moved to the front."""
    names, values = check_space(tune)
    return list(iter_candidates(dict(zip(names, values)), first))


def iter_candidates(tune: dict, first: dict | None = None):
    """`candidates`' order one by one, none built before it is asked for (a space
    too large to list is refused after its first candidates compile)."""
    if first is not None:
        yield dict(first)
    for combo in itertools.product(*tune.values()):
        cfg = dict(zip(tune, combo))
        if cfg != first:
            yield cfg


# A cold tune compiles each candidate it times (~0.5 s of CPU each for gemm.tile's), `tilec check`
# each candidate of the space: a space of 6 consts of 10 values each is 10^6 of them, weeks of CPU.
# A tune compiles at most MAX_TUNED candidates (an error beyond: gemm.tile's largest is 228);
# `tilec check` at most MAX_CHECKED (a sample spread over the space beyond: gemm.tile has 588),
# evaluating the `where` condition on at most CHECK_POOL of the space's candidates (spread
# over it: for every shape the condition folds, ~80 us a candidate), and a tune's `where`
# filters a space of at most MAX_SPACE (~4 us a candidate).
MAX_TUNED = 4096
MAX_CHECKED = 1024
CHECK_POOL = 20_000
MAX_SPACE = 1_000_000


def space_size(tune: dict) -> int:
    """The candidates of a tune space (the product of its lists' lengths), counted, not built."""
    return math.prod(len(values) for values in tune.values())


def _shape_of(tune: dict) -> str:
    """'17 x 3 x 4 x 2 x 2 x 2 x 2 values': how a space is made."""
    return f"{' x '.join(str(len(v)) for v in tune.values())} values"


def candidate_at(tune: dict, i: int) -> dict:
    """Candidate i of the space's cartesian product (`candidates`' order, the last
    name varying fastest), without building the others."""
    out = {}
    for name, values in reversed(tune.items()):
        i, j = divmod(i, len(values))
        out[name] = values[j]
    return dict(reversed(out.items()))


def spread(n: int, k: int) -> list:
    """k of range(n)'s indices (all of them where k >= n), in order: a sample drawn with
    a fixed seed, so that every value of every const turns up (an even stride through the
    product would keep the fastest-varying consts in step with it: 1 in 50 of a space of
    10 values a const has only two values of the last two)."""
    return list(range(n)) if k >= n else sorted(random.Random(n * 1_000_003 + k).sample(range(n), k))


def too_many(what: str, n: int, limit: int, tune: dict, why: str = "") -> str:
    """The message of a tune refused for its size: `what` (who), its n candidates."""
    return (f"{what}: {n} candidates to compile and time{why}, more than a tune takes ({limit}; compiling one is "
            f"about half a second of CPU): narrow the space ({_shape_of(tune)}) with a `where` condition or fewer "
            "values, or give some of its consts when compiling (`tilec.compile(src, NAME=VALUE)`)")


def _space(tune: dict) -> tuple:
    return tuple((name, tuple(vals)) for name, vals in tune.items())


def _describe(cfg: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in cfg.items())


# ---- the kernel's signature, without the parser (a warm start must not load lark)

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_HEAD = re.compile(r"\bkernel\s+\w+\s*\(([^)]*)\)")
_PARAM = re.compile(r"\s*(\w+)\s*:\s*\w+\s*(?:\[([^\]]*)\])?\s*(?:,|$)")


def signature(source) -> tuple:
    """((param name, (dim names or None) for a tensor, None for a scalar), ...)
    in argument order. A regular expression over the header; the parser
    (tilec.frontend) when the header is anything it does not read exactly."""
    sig = _header_signature(source.text)
    if sig is not None:
        return sig
    from .frontend import parse
    from .ir import nodes as ir
    k = parse(source)
    return tuple((p.name, tuple(d.name if isinstance(d, ir.Var) else None for d in p.shape)
                  if isinstance(p, ir.TensorParam) else None) for p in k.params)


# A warm start reads a program's header, tune statement and const names from its text
# several times over: each reader's regular expressions run once per text (_TEXT_CACHE).
_TEXT_CACHE = functools.lru_cache(maxsize=64)


@_TEXT_CACHE
def _header_signature(text: str):
    """signature() by the regular expressions, or None where the parser must read it."""
    text = _COMMENT.sub(" ", text)
    m = _HEAD.search(text)
    if not m:
        return None
    params, pos, body = [], 0, m.group(1)
    while pos < len(body) and body[pos:].strip():
        p = _PARAM.match(body, pos)
        if p is None:
            return None
        dims = None if p.group(2) is None else \
            tuple(d.strip() if d.strip().isidentifier() else None for d in p.group(2).split(","))
        params.append((p.group(1), dims))
        pos = p.end()
    return tuple(params)


# ---- the tune statement, without the parser (a warm start must not build it either)

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"          # the grammar's NAME and INT
_INT = re.compile(r"[0-9]+")
_TUNE_WORD = re.compile(r"(?<![A-Za-z0-9_])tune(?![A-Za-z0-9_])")
_VALUES = r"\(\s*[0-9]+(?:\s*,\s*[0-9]+)*\s*\)"
_TUNE_STMT = re.compile(rf"tune\s+({_NAME}\s+in\s*{_VALUES}(?:\s*,\s*{_NAME}\s+in\s*{_VALUES})*)"
                        r"(?:\s*(?<![A-Za-z0-9_])where(?![A-Za-z0-9_])([^;]*))?\s*;")
_TUNE_ITEM = re.compile(rf"({_NAME})\s+in\s*\(([^)]*)\)")
_CONST_STMT = re.compile(r"(?<![A-Za-z0-9_])const(?![A-Za-z0-9_])([^;]*);")
_CONST_ITEM = re.compile(rf"\s*({_NAME})\s*=(.*)", re.S)


def _const_texts(text: str):
    """{const name: its expression's text} of every `const` statement in `text`,
    or None where an item is not `NAME = expr` or a name comes twice."""
    out = {}
    for m in _CONST_STMT.finditer(text):
        items, depth, start, body = [], 0, 0, m.group(1)
        for i, ch in enumerate(body):
            depth += ch == "(" or ch == "["
            depth -= ch == ")" or ch == "]"
            if ch == "," and depth == 0:
                items.append(body[start:i])
                start = i + 1
        items.append(body[start:])
        for item in items:
            c = _CONST_ITEM.fullmatch(item)
            if c is None or c.group(1) in out:
                return None
            out[c.group(1)] = c.group(2).strip()
    return out


def statement(source):
    """The program's tune statement as (space, default, where): space the tuned
    consts and their values as written, ((name, (value, ...)), ...), default
    {name: declared value}, and where the text of its `where` condition (its
    whitespace collapsed) or None; None when there is no statement. A regular
    expression over the text; the parser (tilec.frontend, which raises the
    statement's errors) when the text has `tune` anywhere else, or a rule of the
    statement does not hold (a const named after a tilec.compile() option, which
    its **consts could not pass, is one)."""
    found = _statement_text(source.text)
    if found is _BY_PARSER:
        return _statement_by_parser(source)
    if found is None:
        return None
    space, default, where = found
    return space, dict(default), where


_BY_PARSER = object()


@_TEXT_CACHE
def _statement_text(text: str):
    """statement() by the regular expressions: its answer (default as a tuple of
    items), None, or _BY_PARSER."""
    text = _COMMENT.sub(" ", text)
    words = [w.start() for w in _TUNE_WORD.finditer(text)] if "tune" in text else []
    if not words:
        return None
    m = _TUNE_STMT.match(text, words[0])
    consts = _const_texts(text[:words[0]]) if m is not None and len(words) == 1 else None
    if consts is not None:
        space = tuple((name, tuple(int(v) for v in values.split(","))) for name, values
                      in _TUNE_ITEM.findall(m.group(1)))
        names = [name for name, _ in space]
        if len(set(names)) == len(names) and all(
                _INT.fullmatch(consts.get(name, "")) and len(set(values)) == len(values) and int(consts[name]) in values
                and name not in COMPILE_OPTIONS for name, values in space):
            where = None if m.group(2) is None else " ".join(m.group(2).split())
            return space, tuple((name, int(consts[name])) for name in names), where
    return _BY_PARSER


def _statement_by_parser(source):
    from .frontend import parse
    k = parse(source)
    if not k.tune:
        return None
    declared = {c[0]: c[1] for c in k.consts}
    return k.tune, {name: declared[name].value for name, _ in k.tune}, \
        None if k.tune_where is None else k.tune_where.text


# ---- a tune statement's `where` condition

_WORD = re.compile(r"(?<![A-Za-z0-9_])[A-Za-z_][A-Za-z0-9_]*(?![A-Za-z0-9_]|\s*\()")


def condition_names(where: str) -> set:
    """The names a `where` condition reads (its text; calls are not names)."""
    return set(_WORD.findall(where)) - {"true", "false"}


def default_key(source, where: str | None) -> tuple:
    """A tune's key when key= is not given: every shape symbol of the header, then
    the scalar parameters its condition reads (in argument order)."""
    read = condition_names(where) if where is not None else set()
    return shape_symbols(source) + tuple(name for name, dims in signature(source) if dims is None and name in read)


def _consts_of(source) -> tuple:
    """The program's const names, without the parser where the text allows."""
    names = _const_names(source.text)
    if names is None:
        from .frontend import parse
        return tuple(c[0] for c in parse(source).consts)
    return names


@_TEXT_CACHE
def _const_names(text: str):
    consts = _const_texts(_COMMENT.sub(" ", text))
    return None if consts is None else tuple(consts)


class Condition:
    """A tune condition (a tune statement's `where`, or tilec.compile's where=;
    its text) over the candidates of a program compiled with `consts`:
    `meets(cfg, names)` folds the program's consts (cfg and `consts` override
    the declared values) and the given names' values (a tune's key values) into
    it: True or False, or None where it reads a value not given. Parses the
    program on first use (a tune compiles, or reads compiled candidates,
    anyway), or at once with `check` (where=: its errors are tilec.compile's)."""

    def __init__(self, source, consts: dict, text: str, check: bool = False):
        self.source, self.consts, self.text = source, dict(consts), " ".join(text.split())
        self._parsed = None
        if check:
            self._parse()

    def _parse(self):
        if self._parsed is None:
            from .frontend import parse, parse_condition
            k = parse(self.source)
            own = k.tune_where is not None and " ".join(k.tune_where.text.split()) == self.text
            # the statement's own condition as parsed with the program: its errors point into the file
            cond = k.tune_where.cond if own else parse_condition(self.text, k)
            decls = tuple((c[0], c[1]) for c in k.consts)
            try:
                fast = tuple((name, _evaluator_or_none(e)) for name, e in decls), _evaluator(cond)
            except _NotInteger:
                fast = None
            self._parsed = (decls, cond, fast)
        return self._parsed

    def meets(self, cfg: dict, names: dict):
        """Whether the condition holds for candidate `cfg` at the given names' values."""
        decls, cond, fast = self._parse()
        given = {**self.consts, **cfg}
        if fast is not None:            # every value known (a tune's key values): plain integer arithmetic
            try:
                env = {}
                for name, value in fast[0]:
                    if name in given:
                        env[name] = given[name]
                    elif value is not None:         # (a const of no integer arithmetic is left out)
                        env[name] = value(env)
                env.update(names)
                return bool(fast[1](env))
            except (KeyError, ZeroDivisionError):
                pass                    # a name not given, or a division by zero: folded, as below
        from .ir import nodes as ir
        from .ir.exprs import fold, substitute
        values = {}
        for name, e in decls:
            values[name] = ir.Int(given[name]) if name in given else fold(substitute(e, values))
        values.update((n, ir.Int(v)) for n, v in names.items())
        return _decide(fold(substitute(cond, values)))


class _NotInteger(Exception):
    pass


def _evaluator(e):
    """Integer expression `e` as a function {name: int} -> int, with fold's semantics
    (ir.exprs.INT_BINOPS, INT_CALLS); KeyError for a name not in the dict,
    _NotInteger (when built) for anything that is no integer arithmetic."""
    from .ir import nodes as ir
    from .ir.exprs import INT_BINOPS, INT_CALLS
    if isinstance(e, ir.Int):
        value = e.value
        return lambda env: value
    if isinstance(e, ir.Var):
        name = e.name
        return lambda env: env[name]
    if isinstance(e, ir.BinOp) and e.op in INT_BINOPS:
        op, lhs, rhs = INT_BINOPS[e.op], _evaluator(e.lhs), _evaluator(e.rhs)
        return lambda env: op(lhs(env), rhs(env))
    if isinstance(e, ir.UnaryOp) and e.op in ("-", "!"):
        operand = _evaluator(e.operand)
        return (lambda env: -operand(env)) if e.op == "-" else (lambda env: int(not operand(env)))
    if isinstance(e, ir.Call) and e.func in INT_CALLS and len(e.args) == INT_CALLS[e.func][0] and not e.kwargs:
        f, args = INT_CALLS[e.func][1], tuple(_evaluator(a) for a in e.args)
        return lambda env: f(*(a(env) for a in args))
    raise _NotInteger


def _evaluator_or_none(e):
    try:
        return _evaluator(e)
    except _NotInteger:
        return None


def _decide(e):
    """A folded condition's truth: True, False, or None where it depends on a
    name left in it (`&&` / `||` / `!` decided by the parts that are known)."""
    from .ir import nodes as ir
    if isinstance(e, ir.Int):
        return bool(e.value)
    if isinstance(e, ir.BinOp) and e.op in ("&&", "||"):
        a, b = _decide(e.lhs), _decide(e.rhs)
        short = e.op == "||"               # the value that decides either way: true for ||, false for &&
        if a is short or b is short:
            return short
        return None if a is None or b is None else not short
    if isinstance(e, ir.UnaryOp) and e.op == "!":
        v = _decide(e.operand)
        return None if v is None else not v
    return None


def shape_symbols(source) -> tuple:
    """The shape symbols of the kernel header, in order of first appearance:
    the bare names in tensor shapes that are neither consts nor parameters (a
    tune statement's default key). Without the parser, as `signature`."""
    consts = set(_consts_of(source))
    sig = signature(source)
    params = {name for name, _ in sig}
    out = []
    for _, dims in sig:
        for d in dims or ():
            if d is not None and d not in consts and d not in params and d not in out:
                out.append(d)
    return tuple(out)


def _shape(obj):
    shape = getattr(obj, "shape", None)
    if shape is None and hasattr(obj, "__cuda_array_interface__"):
        shape = obj.__cuda_array_interface__["shape"]
    if shape is None:
        raise TilecError(f"autotune: cannot read the shape of a {type(obj).__name__} argument")
    return tuple(int(s) for s in shape)


@functools.lru_cache(maxsize=64)
def key_reader(sig: tuple, key: tuple):
    """A function args -> the key values: for a shape symbol, the dim of the
    first tensor that declares it (as the host wrapper binds it); for a scalar,
    its value. It runs on every call of a tuned kernel, so it is written out
    for the signature (as dataclasses write __init__), each tensor's `.shape`
    read once: `s0 = args[0].shape; s1 = args[1].shape; kv = (s0[0], s0[1],
    s1[1])` for gemm.tile's (M, K, N). Anything else (no `.shape`, a rank
    short of a key's dim, values that are not ints) goes through _shape."""
    plan = []                       # (argument index, dim index or None for a scalar)
    for name in key:
        for i, (pname, dims) in enumerate(sig):
            if dims is None and pname == name:
                plan.append((i, None))
                break
            if dims is not None and name in dims:
                plan.append((i, dims.index(name)))
                break
        else:
            names = [d for _, dims in sig if dims is not None for d in dims if isinstance(d, str)]
            names = list(dict.fromkeys(names + [p for p, dims in sig if dims is None]))
            raise TilecError(f"autotune key {name!r} is neither a shape symbol nor a scalar parameter of the kernel "
                             f"(it has {', '.join(names) or 'neither'})")
    nparams = len(sig)

    def slow(args):
        out = []
        for i, d in plan:
            if d is None:
                out.append(args[i])
                continue
            name, dims = sig[i]
            shape = _shape(args[i])
            if len(shape) != len(dims):
                raise TilecError(f"argument {name}: {len(shape)} dims, the kernel declares {len(dims)} "
                                 f"({name}[{', '.join(d or '_' for d in dims)}])")
            out.append(shape[d])
        return tuple(out)

    def wrong_count(n):
        return f"the kernel takes {nparams} arguments ({', '.join(p for p, _ in sig)}), got {n}"

    values = [f"args[{i}]" if d is None else f"s{i}[{d}]" for i, d in plan]
    lines = ["def read(args):",
             f"    if len(args) != {nparams}:",
             "        raise TilecError(wrong_count(len(args)))",
             "    try:"] + [f"        s{i} = args[{i}].shape" for i in sorted({i for i, d in plan if d is not None})] + [
             f"        kv = ({''.join(v + ', ' for v in values)})",
             "    except (AttributeError, TypeError, IndexError):",
             "        return slow(args)",
             "    for v in kv:",
             "        if type(v) is not int:",
             "            return slow(args)",
             "    return kv"]
    scope = {"TilecError": TilecError, "slow": slow, "wrong_count": wrong_count}
    exec("\n".join(lines), scope)
    return scope["read"]


# ---- hooks the tests replace

def _compile_one(source, consts: dict, arch: str, fallback: bool, debug: bool, built=None):
    """One candidate's Kernel; `built`: its (meta, cubin) from a compile worker."""
    if built is None:
        return kernel_mod.compile(source, arch=arch, fallback=fallback, debug=debug, tune=False, **consts)
    pkey = program_key(source, consts, arch=arch, fallback=fallback, debug=debug)
    return kernel_mod.cached(pkey, lambda: kernel_mod.Kernel(source, consts, arch, fallback, debug=debug, built=built))


def build_in_workers(source, configs: list, arch: str, fallback: bool, debug: bool, on_done=None) -> tuple:
    """The programs of `configs` (full const sets) not compiled yet, in this
    process or the disk cache, built by compile workers in parallel
    (runtime/workers.py) when there are two or more: ({index: (meta, cubin)}
    of those built, the indices whose builds finished, refused or not).
    `on_done(index)` as each finishes. Pass a built one to _compile_one."""
    todo = [i for i, cfg in enumerate(configs) if not kernel_mod.is_built(source, cfg, arch, fallback, debug)]
    if len(todo) < 2:
        return {}, set()
    finished = set()

    def done(j):
        finished.add(todo[j])
        if on_done is not None:
            on_done(todo[j])
    results = workers.build_all([(source.name, source.text, configs[i], arch, True, debug) for i in todo],
                                on_done=done)
    return {todo[j]: r[1:] for j, r in enumerate(results) if r is not None and r[0] == "ok"}, finished


def compile_candidates(source, configs: list, arch: str, fallback: bool, debug: bool, on_done=None) -> tuple:
    """Each of `configs` (full const sets) as a Kernel, for a tune and for `tilec
    check`: those not compiled yet built by compile workers (build_in_workers),
    then each made in this process, where a refused one is compiled again for
    its error. Here in threads: one candidate's lowering overlaps another's
    NVRTC call when no worker built them (gemm.tile's 64 candidates of session 14, no
    workers, two CPUs: 19.6 s against 24.6 s one by one). ({index: Kernel},
    {index: TilecError}); `on_done(index)` once per config as it finishes."""
    from concurrent.futures import ThreadPoolExecutor, as_completed
    compiled, refused = {}, {}
    if not configs:                 # `tilec check` of a space of one candidate: no other to make
        return compiled, refused
    built, finished = build_in_workers(source, configs, arch, fallback, debug, on_done)
    with ThreadPoolExecutor(max_workers=min(len(configs), os.cpu_count() or 4)) as pool:
        futures = {pool.submit(_compile_one, source, cfg, arch, fallback, debug, built.get(i)): i
                   for i, cfg in enumerate(configs)}
        for f in as_completed(futures):
            i = futures[f]
            try:
                compiled[i] = f.result()
            except TilecError as e:
                refused[i] = e
            if on_done is not None and i not in finished:
                on_done(i)
    return compiled, refused


def _run(kernel, args, stream):
    return kernel(*args, stream=stream)


def _can_time(args) -> bool:
    """Every argument a CUDA torch tensor or a number."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    return all(isinstance(a, (int, float)) or (isinstance(a, torch.Tensor) and a.is_cuda) for a in args)


def _device_name(args) -> str:
    """The model of the GPU the arguments live on (device 0 for numpy arguments alone)."""
    from cuda.bindings import driver as cu
    from .runtime.driver import check
    from .runtime.host import home_device
    check(cu.cuInit(0), "cuInit")
    dev = check(cu.cuDeviceGet(home_device(args) or 0), "cuDeviceGet")
    return check(cu.cuDeviceGetName(64, dev), "cuDeviceGetName").rstrip(b"\0").decode()


TIMING_ROUNDS = 10          # a candidate's time: the median of its launches in this many rounds, each
                            # round one launch of every candidate, in turns
RUNOFF_WITHIN = 0.03        # candidates this close to the fastest (at most RUNOFF_MAX of them) are
RUNOFF_MAX = 3              # timed again, in RUNOFF_ROUNDS rounds of a burst of RUNOFF_BURST launches
RUNOFF_ROUNDS = 5           # each (in turns), of which the last RUNOFF_KEEP count: a finalist's time
RUNOFF_BURST = 4            # is the median of those, taken after launches of its own (as a caller's
RUNOFF_KEEP = 2             # repeated calls run), and the fastest finalist wins
SPIN_CYCLES = 200_000       # a GPU spin (~0.1 ms) before each launch: the launch queues up behind it
PRUNE = ((1, 2.0), (3, 1.25))   # (after round r, above x): after r rounds the candidates over x times the
                                # fastest's median so far are timed no more (their time: that median)
PRUNE_FROM = 50e-6          # where the fastest takes PRUNE_FROM s or more (below, all the rounds cost
                            # little and the noise of one launch is larger)


def _time(kernel, args, stream, flush=None) -> float:
    """The time of one launch on the GPU, CUDA events on the launch stream, the
    launch alone and queued behind a short GPU spin, so that the events time the
    kernel and not the host's launch path (a few us per call, which varies more
    than candidates close in speed differ): as benchmarks/bench.py and Triton's
    do_bench time kernels. `flush` (tune_l2="cold"): a buffer written before the
    spin, so that the launch finds none of its inputs in L2."""
    import torch
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
    s = torch.cuda.current_stream(device) if stream is None else torch.cuda.ExternalStream(stream, device=device)
    spin = getattr(torch.cuda, "_sleep", None)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(s):
        if flush is not None:
            flush.zero_()
        if spin is not None:
            spin(SPIN_CYCLES)
    a.record(s)
    kernel(*args, stream=stream)
    b.record(s)
    b.synchronize()
    return a.elapsed_time(b) * 1e-3


L2_FLUSH_FACTOR = 4         # tune_l2="cold": the buffer written before each timed launch, this many times
                            # the GPU's L2 (200 MiB on the H100's 50 MiB; Triton's do_bench writes 256 MB)


def _l2_flush_buffer(args):
    """A CUDA buffer on the arguments' device L2_FLUSH_FACTOR times its L2 (at least 64 MB)."""
    import torch
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or (50 << 20)
    size = max(L2_FLUSH_FACTOR * l2, 64 << 20)
    try:
        return torch.empty(size, dtype=torch.uint8, device=device)
    except torch.cuda.OutOfMemoryError as e:
        raise TilecError(f"tune_l2=\"cold\" writes a {size >> 20} MB buffer before each timed launch, and "
                         f"{device} has no room for it: free GPU memory before the first call with these "
                         "shapes, or tune with the default tune_l2=\"warm\"") from e


def _rounds(compiled, order, rounds, args, stream, saved, burst=1, keep=1, first=0, flush=None) -> dict:
    """{candidate: its launch times}: `rounds` rounds of `burst` launches of each
    candidate in `order` (every other round in reverse, counting from round
    `first`), the last `keep` of each burst timed, so that the GPU's clock and
    temperature drift over the tuning hits every candidate alike; the tensors
    the kernels write restored after each round; `flush`: as _time's."""
    samples = {i: [] for i in order}
    try:
        for r in range(first, first + rounds):
            for i in (order if r % 2 == 0 else order[::-1]):
                times = [_time(compiled[i], args, stream, flush) for _ in range(burst)]
                samples[i] += times[burst - keep:]
            _restore_all(args, saved)
    finally:
        _restore_all(args, saved)
    return samples


def _slow(samples, above) -> set:
    """The candidates timed no more after a cut of PRUNE: those whose median so far is
    over `above` times the fastest's, where that is PRUNE_FROM seconds or more.
    (gemm.tile at 16384^3 on the H100: all ten rounds of every candidate took 14.4 s
    of a 19.6 s cold tune; at 8192^3 its 16-row tiles take 4-10 times the fastest's.)"""
    medians = {i: statistics.median(t) for i, t in samples.items()}
    fastest = min(medians.values())
    if fastest < PRUNE_FROM:
        return set()
    return {i for i, m in medians.items() if m > fastest * above}


def _timed_rounds(compiled, ready, args, stream, saved, flush=None):
    """({candidate: its launch times}, {candidate: the rounds it had, if cut}):
    TIMING_ROUNDS rounds of the candidates `ready`, less those cut by PRUNE."""
    samples, cut, live, done = {i: [] for i in ready}, {}, list(ready), 0
    for upto, above in tuple(PRUNE) + ((TIMING_ROUNDS, None),):
        upto = min(upto, TIMING_ROUNDS)
        if upto > done:
            for i, more in _rounds(compiled, live, upto - done, args, stream, saved, first=done,
                                   flush=flush).items():
                samples[i] += more
            done = upto
        if above is not None and done < TIMING_ROUNDS:
            slow = _slow({i: samples[i] for i in live}, above)
            cut.update((i, done) for i in slow)
            live = [i for i in live if i not in slow]
    return samples, cut


def _restore_all(args, saved):
    for j, t in saved.items():
        _restore(args[j], t)
    _settle(args)


def _settle(args):
    """Wait for the GPU (CUDA torch arguments): a launch on the caller's stream=
    and the restores and comparisons, on torch's current stream, must not overlap."""
    torch = sys.modules.get("torch")
    if torch is not None:
        for device in {a.device for a in args if isinstance(a, torch.Tensor) and a.is_cuda}:
            torch.cuda.synchronize(device)      # the arguments' device, not the current one


# ---- the candidates' outputs compared

# How far a float output may differ from the reference candidate's, as a fraction of the largest
# magnitude in the reference: candidates sum in other orders (wgmma's K depth, stream-K's partial
# sums in f32), so an output rounded to a 16-bit float may land an ulp away at any element: four
# ulps at 1.0, and never below 2^-13 (an f32 sum of thousands of products in another order differs
# by many of f32's ulps). A candidate that writes nothing, or a wrong tile, is off by far more.
_EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23, "float64": 2.0 ** -52,
        "float8_e4m3fn": 2.0 ** -3, "float8_e5m2": 2.0 ** -2}
MISMATCH_ULPS = 4
MISMATCH_FLOOR = 2.0 ** -13
# Tensor cores add 8-bit products into their f32 accumulators keeping about 14 bits (DeepSeek-V3's
# report on the H800), so an fp8 gemm's candidates that split K otherwise (stream-K) differ by more:
# 4 ulps of an f16 output were exceeded at 1 of 16M elements of a 4096^3 e4m3 gemm (1.5 off, 1.41
# allowed, benchmarks/NOTES.md session 35). A wrong tile is still off by the outputs' magnitude.
MISMATCH_ULPS_F8 = 16
_F8_MMA = re.compile(r"wgmma\.mma_async\S*\.e[45]m[23]\b")


class _Reference:
    """The outputs of the candidate the others are compared with (the first that ran),
    and each float output's tolerance, computed once."""

    def __init__(self, index: int, args, writes, ulps: int = MISMATCH_ULPS):
        self.index = index
        self.outputs = {j: _save(args[j]) for j in writes}
        self.allowed = {j: _tolerance(t, ulps) for j, t in self.outputs.items()}

    def mismatch(self, args, sig) -> str | None:
        """Where the written arguments differ from the reference's, what differs ("output
        C differs at 12 of 4096 elements (the largest difference 3, 0.004 allowed) from"),
        else None. Integer outputs exactly; float ones within the tolerance above, NaN
        where NaN, infinities equal."""
        import numpy as np
        with np.errstate(invalid="ignore"):          # inf - inf in numpy outputs: NaN, handled below
            for j, ref in self.outputs.items():
                out, allowed = args[j], self.allowed[j]
                if _equal(out, ref):
                    continue
                count, worst = _count_off(out, ref, allowed)
                if count:
                    within = "" if allowed is None else \
                        f" ({'' if worst is None else f'the largest difference {worst:.4g}, '}{allowed:.4g} allowed)"
                    return f"output {sig[j][0]} differs at {count} of {_size(out)} elements{within} from"
        return None


def _dtype(a) -> str:
    return str(a.dtype).removeprefix("torch.")


def _equal(a, b) -> bool:
    """Bit for bit (NaN never), the fast path: candidates that sum in the same order."""
    if hasattr(a, "equal"):
        return a.equal(b)
    return bool((a == b).all())


def _tolerance(ref, ulps: int = MISMATCH_ULPS):
    """A float output's tolerance (`ulps` of its dtype, at least MISMATCH_FLOOR, of its
    largest finite magnitude); None for an integer one (exact)."""
    dtype = _dtype(ref)
    if dtype not in _EPS:
        return None
    largest = 0.0
    for r, _ in _chunks(ref, ref):
        r = abs(_as_float(r, dtype))
        r = r[r < float("inf")]
        if _size(r):
            largest = max(largest, float(r.max()))
    return largest * max(ulps * _EPS[dtype], MISMATCH_FLOOR)


def _count_off(out, ref, allowed) -> tuple:
    """(elements off, the largest finite difference among them or None) of an output
    against the reference's: exactly where `allowed` is None."""
    count, worst = 0, None
    for o, r in _chunks(out, ref):
        if allowed is None:
            count += int((o != r).sum())
            continue
        o, r = _as_float(o, _dtype(o)), _as_float(r, _dtype(r))
        diff = abs(o - r)
        infinite = ~(abs(r) < float("inf")) & (r == r)
        bad = (diff > allowed) | ((o != o) != (r != r)) | (infinite & (o != r))
        n = int(bad.sum())
        if n:
            count += n
            off = diff[bad & (diff == diff)]
            if _size(off):
                worst = max(worst or 0.0, float(off.max()))
    return count, worst


MISMATCH_CHUNK = 1 << 24    # elements compared at once: the f32 copies of a 16-bit output of 8192^2
                            # would take a GB of the GPU's memory at once


def _chunks(out, ref):
    """(out, ref) in slices of their outermost dim of about MISMATCH_CHUNK elements."""
    if not len(out.shape):
        yield out, ref
        return
    rows = out.shape[0]
    step = max(1, MISMATCH_CHUNK // max(1, _size(out) // max(rows, 1)))
    for s in range(0, rows, step):
        yield out[s:s + step], ref[s:s + step]


def _size(a) -> int:
    return a.numel() if hasattr(a, "numel") else a.size


def _as_float(a, dtype: str):
    """A float output widened for the comparison: f64 as f64, the rest as f32."""
    if hasattr(a, "double"):
        return a.double() if dtype == "float64" else a.float()
    return a.astype("float64" if dtype == "float64" else "float32")


# ---- progress

class _Progress:
    """One line on stderr, redrawn, when stderr is a terminal; nothing otherwise."""

    def __init__(self, name: str, total: int):
        self.out = sys.stderr
        self.on = bool(getattr(self.out, "isatty", lambda: False)())
        self.name, self.total, self.done = name, total, 0
        self.lock = threading.Lock()

    def step(self, what: str):
        with self.lock:         # compile workers' threads step it too
            self._step(what)

    def _step(self, what: str):
        self.done += 1
        if self.on:
            n = 20 * self.done // max(self.total, 1)
            self.out.write(f"\rtilec autotune {self.name} [{'#' * n}{'.' * (20 - n)}] "
                           f"{self.done}/{self.total} {what}\033[K")
            self.out.flush()

    def finish(self, line: str):
        if self.on:
            self.out.write(f"\rtilec autotune {self.name}: {line}\033[K\n")
            self.out.flush()


# ---- the tuned kernel

class TunedKernel:
    """What `tilec.compile(src, tune=..., key=...)`, or `tilec.compile(src)` of a
    program with a tune statement, returns: call it like a Kernel. `best_config`
    is the tuned consts chosen for the last call's key, `kernel` that Kernel
    (its attributes are readable here too: `k.cuda_source`), `tune_report()` the
    candidates' times and the refused ones' messages. From a tune statement,
    `default` is the Kernel of the declared consts (the first candidate),
    compiled at once: its errors are the program's, and until the first call
    the attributes read through here are its."""

    def __init__(self, source, consts: dict, tune: dict, key: tuple, arch: str, fallback: bool, debug: bool,
                 default: dict | None = None, where: str | None = None, check_where: bool = False,
                 tune_l2: str = "warm"):
        self.source = source
        self.tune_l2 = tune_l2
        self.arch = arch
        self._consts = dict(consts)
        self._tune = {k: tuple(v) for k, v in tune.items()}
        self._first_cfg = None if default is None else dict(default)
        check_space(self._tune)
        self._key = tuple(key)
        self._where = None if where is None else Condition(source, consts, where, check_where)
        if where is not None:
            outside = sorted(condition_names(where) - set(_consts_of(source)) - set(self._key))
            if outside:
                self._where._parse()          # a name that is no shape symbol or scalar: the parser's error
                raise TilecError(f"the tune condition `{where}` reads {', '.join(outside)}, not in the key "
                                 f"({', '.join(self._key) or 'none'}): a choice made for one value would be reused "
                                 f"for another. Add {'it' if len(outside) == 1 else 'them'} to key=, or leave key= "
                                 "out (every shape symbol)")
        self._fallback_allowed, self.debug = fallback, debug
        self._read_key = key_reader(signature(source), self._key)
        self._chosen: dict = {}          # key values -> (Kernel, consts)
        self._reports: dict = {}         # key values -> report lines
        self._lock = threading.Lock()
        self.kernel = None
        self.best_config = None
        self._last_key = None
        self.default = None if default is None else self._compile(self._first_cfg)

    @functools.cached_property
    def _candidates(self) -> list:
        """The space's candidates, declared values first: built when a key is first
        tuned (gemm.tile's 3264 take 2-3 ms, and a warm start needs none)."""
        return candidates(self._tune, self._first_cfg)

    # ---- calling
    def __call__(self, *args, stream=None):
        kv = self._read_key(args)
        hit = self._chosen.get(kv)
        if hit is None:
            with self._lock:
                hit = self._chosen.get(kv)
                if hit is None:
                    k, cfg, ran = self._choose(kv, args, stream)
                    self._chosen[kv] = hit = (k, cfg)
                    self._set_last(kv, hit)
                    if ran:
                        return None
        if kv != self._last_key:
            self._set_last(kv, hit)
        return _run(hit[0], args, stream)

    def _set_last(self, kv, hit):
        self._last_key = kv
        self.kernel, self.best_config = hit[0], dict(hit[1])

    def _program_key(self):
        return program_key(self.source, self._consts, arch=self.arch, fallback=self._fallback_allowed,
                           debug=self.debug)

    def _disk_key(self, kv, args) -> str:
        space = _space(self._tune) if self._first_cfg is None else \
            (_space(self._tune), "first", tuple(self._first_cfg.items()))
        if self._where is not None:
            space = (space, "where", self._where.text)
        if self.tune_l2 != "warm":
            space = (space, "tune_l2", self.tune_l2)
        return cache.key("autotune", __version__, self._program_key(), space, self._key, kv,
                         _device_name(args), nvrtc.identity())

    def _compile(self, cfg):
        self._refuse_tuned_and_given(cfg)
        return _compile_one(self.source, {**self._consts, **cfg}, self.arch, self._fallback_allowed, self.debug)

    def _refuse_tuned_and_given(self, names):
        overlap = set(names) & set(self._consts)
        if overlap:
            raise TilecError(f"{', '.join(sorted(overlap))} both tuned and given as a const")

    def _first(self, kv, why: str):
        errors = []
        for cfg in iter_candidates(self._tune, self._first_cfg):
            try:
                k = self._compile(cfg)
            except TilecError as e:
                errors.append((cfg, e))
                continue
            self._reports[kv] = [f"{_describe(c)}: refused: {e}" for c, e in errors] + \
                                [f"{_describe(cfg)}: chosen untimed ({why})"]
            return k, cfg
        raise errors[0][1]

    def _choose(self, kv, args, stream):
        """(Kernel, its tuned consts, whether it already ran on these arguments)."""
        if kernel_mod._capturing():
            raise CaptureError(
                f"autotuned kernel {self._name()} was called during CUDA graph capture with key "
                f"{dict(zip(self._key, kv))} it has not been tuned for: tuning compiles and times candidates, "
                "which cannot be captured. Tune before capturing: call it once with the same shapes first")
        if not enabled():
            return (*self._first(kv, "TILEC_AUTOTUNE=0"), False)
        if not _can_time(args):
            return (*self._first(kv, "arguments not all CUDA torch tensors: not timed"), False)
        dkey = self._disk_key(kv, args)
        cfg = _CHOICES.get(dkey)
        report = None
        if cfg is None:
            hit = cache.load(dkey)
            if hit is not None:
                cfg, report = hit[0].get("best"), hit[0].get("report")
        if cfg is not None:
            try:
                k = self._compile(cfg)
            except TilecError:
                k = None              # a stale choice: tune again
            if k is not None:
                _CHOICES[dkey] = cfg
                self._reports[kv] = report or [f"{_describe(cfg)}: chosen earlier (cached)"]
                return k, cfg, False
        k, cfg, report = self._tune_now(kv, args, stream)
        with _CHOICES_LOCK:
            _CHOICES[dkey] = cfg
        cache.store(dkey, {"best": cfg, "report": report}, b"")
        self._reports[kv] = report
        return k, cfg, True

    def _meeting(self, kv) -> tuple:
        """The candidates the tune statement's `where` condition keeps for key values
        kv, and the report's line on the others (None without a condition). Where
        it keeps none (consts given to tilec.compile can do that), all of them."""
        total, who = space_size(self._tune), f"autotune {self._name()} at {_describe(dict(zip(self._key, kv)))}"
        if self._where is None:
            if total > MAX_TUNED:
                raise TilecError(too_many(who, total, MAX_TUNED, self._tune))
            return self._candidates, None
        if total > MAX_SPACE:
            raise TilecError(too_many(who, total, MAX_TUNED, self._tune, f" before the tune condition `"
                                      f"{self._where.text}`, more than a tune filters ({MAX_SPACE}) and"))
        names = dict(zip(self._key, kv))
        cands = [cfg for cfg in self._candidates if self._where.meets(cfg, names) is not False]
        left = len(self._candidates) - len(cands)
        if len(cands) > MAX_TUNED or (not cands and total > MAX_TUNED):
            raise TilecError(too_many(who, len(cands) or total, MAX_TUNED, self._tune,
                                      f" (the tune condition `{self._where.text}` is {'true' if cands else 'false'} "
                                      f"for {len(cands) or total} of the space's {total})"))
        if not cands:
            return self._candidates, f"the tune condition `{self._where.text}` is false for every candidate at " \
                f"{_describe(names)}: all were tried"
        return cands, (f"{left} other candidate{'s' if left > 1 else ''}: not tried, the tune condition "
                       f"`{self._where.text}` is false for them at {_describe(names)}" if left else None)

    def _compile_fixed(self, fix: dict, cands: list):
        """The programs of `cands` with the shape symbols of `fix` fixed, compiled in
        parallel: what their launches on these arguments run (runtime.host.Call.fall_back),
        else compiled one by one as each warms up. A refused one is refused again there."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PipelineWarning)
            compile_candidates(self.source, [{**self._consts, **cfg, **fix} for cfg in cands], self.arch,
                               self._fallback_allowed, self.debug)

    def _tune_now(self, kv, args, stream):
        self._refuse_tuned_and_given(self._tune)      # it would refuse every candidate
        cands, pruned = self._meeting(kv)
        n = len(cands)
        progress = _Progress(self._name(), 2 * n)
        with warnings.catch_warnings():     # a candidate's plain pipelined loop: said of the winner only
            warnings.simplefilter("ignore", PipelineWarning)
            compiled, refused = compile_candidates(self.source, [{**self._consts, **cfg} for cfg in cands],
                                                   self.arch, self._fallback_allowed, self.debug,
                                                   lambda i: progress.step("compiling"))
        if not compiled:
            progress.finish("no candidate compiles")
            raise refused[min(refused)]
        progress.total = n + len(compiled)
        try:
            flush = _l2_flush_buffer(args) if self.tune_l2 == "cold" else None
        except TilecError:
            progress.finish("no room for the L2 flush buffer")
            raise
        sig = signature(self.source)
        writes = _written_args(sig, compiled.values())
        try:        # before any output is saved or restored: a tensor that requires grad is refused
            host.mark_written(args, tuple((i, sig[i][0]) for i in writes), next(iter(compiled.values())).name)
        except TilecError:
            progress.finish("an output requires grad")
            raise
        saved = {i: _save(args[i]) for i in writes}
        ready, reference, mismatched, failed = [], None, {}, []
        fixing = True
        try:
            for i in sorted(compiled):
                try:
                    compiled[i].last_fix = {}
                    _run(compiled[i], args, stream)     # warm-up: module load, tensor maps
                    if compiled[i].last_fix and fixing:     # it ran compiled with a shape symbol fixed:
                        fixing = False                      # so will the others, compiled in parallel now
                        self._compile_fixed(compiled[i].last_fix, [cands[j] for j in compiled if j > i])
                except TilecError as e:        # a launch the candidate refuses (e.g. a grid too big for the shape)
                    refused[i] = e
                    if isinstance(e, DeviceError):  # the driver refused what the compiler accepted: a tilec bug
                        failed.append(i)
                else:
                    _settle(args)
                    if reference is None:      # the first that runs: the declared consts, where they do
                        ulps = MISMATCH_ULPS_F8 if _F8_MMA.search(compiled[i].cuda_source) else MISMATCH_ULPS
                        reference = _Reference(i, args, writes, ulps)
                    else:
                        why = reference.mismatch(args, sig)
                        if why is not None:
                            mismatched[i] = f"{why} {_describe(cands[reference.index])}'s"
                    if i not in mismatched:
                        ready.append(i)
                _restore_all(args, saved)
                progress.step("timing")
        finally:
            _restore_all(args, saved)
        if mismatched:
            self._warn_mismatch(kv, cands, reference.index, mismatched)
        if failed:
            n = len(failed)
            warnings.warn(TuneLaunchWarning(
                f"autotune {self._name()} at {_describe(dict(zip(self._key, kv)))}: {n} candidate"
                f"{'s' if n > 1 else ''} the compiler accepted failed to launch and {'were' if n > 1 else 'was'} "
                f"skipped ({_describe(cands[failed[0]])}: {refused[failed[0]]}); this is a bug in tilec; "
                "k.tune_report() lists them"), stacklevel=4)
        if not ready:
            progress.finish("no candidate runs")
            raise refused[min(refused)]
        samples, dropped = _timed_rounds(compiled, ready, args, stream, saved, flush)
        times = {i: statistics.median(t) for i, t in samples.items()}
        finalists = self._runoff(compiled, times, args, stream, saved, flush)
        del flush
        best = min(finalists or times, key=lambda i: (times[i], i))
        for i in compiled:
            if i != best:
                compiled[i]._prepared.clear()      # drop the references to the caller's tensors
        winner = compiled[best]
        if winner is not self.default:      # the declared consts' kernel said its notes when compiled
            warn_notes((), winner.pipeline_notes)
        _run(winner, args, stream)
        report = []
        for i, cfg in enumerate(cands):
            if i in times:
                mark = (f" ({dropped[i]} round{'s' if dropped[i] > 1 else ''})" if i in dropped else "") + \
                    (" (run-off)" if i in finalists else "") + ("  <- chosen" if i == best else "")
                report.append(f"{_describe(cfg)}: {times[i] * 1e3:.4f} ms{mark}")
            elif i in mismatched:
                report.append(f"{_describe(cfg)}: not chosen: {mismatched[i]}")
            else:
                report.append(f"{_describe(cfg)}: refused: {refused[i]}")
        if pruned is not None:
            report.append(pruned)
        left = len(self._candidates) - n
        progress.finish(f"{_describe(cands[best])} ({times[best] * 1e3:.4f} ms; "
                        f"{len(times)} timed, {len(refused)} refused"
                        f"{f', {len(mismatched)} with other outputs' if mismatched else ''}"
                        f"{f', {left} not tried' if left else ''})")
        return winner, cands[best], report

    def _warn_mismatch(self, kv, cands, ref, mismatched: dict):
        n, (i, why) = len(mismatched), min(mismatched.items())
        warnings.warn(TuneMismatchWarning(
            f"autotune {self._name()} at {_describe(dict(zip(self._key, kv)))}: {n} candidate"
            f"{'s' if n > 1 else ''} computed other outputs than {_describe(cands[ref])}, the first that ran, "
            f"and {'were' if n > 1 else 'was'} not chosen ({_describe(cands[i])}: {why}). The candidates of a "
            "program must compute the same result up to the order of float sums: unless a tuned const changes "
            "what the kernel computes, this is a bug in tilec; k.tune_report() lists them"), stacklevel=5)

    @staticmethod
    def _runoff(compiled, times, args, stream, saved, flush=None) -> list:
        """The finalists (the candidates within RUNOFF_WITHIN of the fastest, at most
        RUNOFF_MAX), timed again in bursts: their times become the medians of those
        (`times` updated). Empty when fewer than two are that close.

        In the rounds each launch follows other candidates' launches; on an H100 at its
        power limit a kernel's speed depends on what ran just before it, and at 8192^3
        two gemm candidates the rounds timed within 0.1% ran 1.6% apart when each
        followed launches of its own (benchmarks/NOTES.md, session 12)."""
        first = min(times.values())
        close = sorted((i for i in times if times[i] <= first * (1 + RUNOFF_WITHIN)), key=lambda i: (times[i], i))
        close = close[:RUNOFF_MAX]
        if len(close) < 2:
            return []
        for i, more in _rounds(compiled, close, RUNOFF_ROUNDS, args, stream, saved, RUNOFF_BURST,
                               RUNOFF_KEEP, flush=flush).items():
            times[i] = statistics.median(more)
        return close

    # ---- inspection
    def _name(self) -> str:
        return _kernel_name(self.source)

    def tune_report(self, key=None) -> str:
        """One line per candidate for the last key (or `key`, a tuple of values):
        its time, the chosen one marked, or the compiler's message."""
        kv = self._last_key if key is None else tuple(key)
        lines = self._reports.get(kv)
        if lines is None:
            return "not tuned yet for this key\n"
        head = f"autotune {self._name()} key {dict(zip(self._key, kv))}" + \
            (" (tune_l2=\"cold\": the L2 flushed before each timed launch)" if self.tune_l2 == "cold" else "") + ":"
        return "\n".join([head] + ["  " + line.replace("\n", "\n      ") for line in lines]) + "\n"

    def __getattr__(self, name):
        if name.startswith("_") or name in ("kernel", "best_config", "default"):
            raise AttributeError(name)
        k = self.kernel if self.kernel is not None else self.default
        if k is None:
            raise AttributeError(f"{name}: the tuned kernel has not been called yet, so no candidate is chosen")
        return getattr(k, name)

    def as_torch_op(self, mutates=None):
        raise TilecError(f"autotuned kernel {self._name()} is not a torch operator: which kernel runs depends on the "
                         "call's key values. Register one Kernel: tilec.compile(src, tune=False) (the declared "
                         "consts) or with every tuned const given, or k.kernel.as_torch_op() after a call")

    def __repr__(self):
        space = ", ".join(f"{k}={v}" for k, v in self._tune.items())
        first = "" if self._first_cfg is None else f" default {_describe(self._first_cfg)}"
        cold = " tune_l2=cold" if self.tune_l2 == "cold" else ""
        return f"<tilec.TunedKernel {self._name()} tune {space}{first} key {self._key}{cold} for {self.arch}>"


def _kernel_name(source) -> str:
    m = re.search(r"\bkernel\s+(\w+)", _COMMENT.sub(" ", source.text))
    return m.group(1) if m else source.name


def _save(a):
    return a.clone() if hasattr(a, "clone") else a.copy()


def _restore(a, saved):
    if hasattr(a, "copy_"):
        a.copy_(saved)
    else:
        a[...] = saved


def _written_args(sig, kernels) -> list:
    names = set()
    for k in kernels:
        names.update(k._writes)
    return [i for i, (pname, _) in enumerate(sig) if pname in names]


def _key_tuple(key) -> tuple:
    """key= as given to tilec.compile (None, one name, or names) as a tuple."""
    if key is None:
        return ()
    if isinstance(key, str):
        return (key,)
    try:
        names = tuple(key)
    except TypeError:
        names = None
    if names is None or isinstance(key, (bytes, dict)) or not all(isinstance(n, str) for n in names):
        raise TilecError(f"key= takes the name, or a tuple of names, of shape symbols and scalar parameters "
                         f"(e.g. key=(\"M\", \"N\"); () tunes once for all shapes), got {key!r}")
    if len(set(names)) != len(names):
        raise TilecError(f"key=: a name comes twice in {names!r}")
    return names


def tuned(source, consts, tune, key, arch, fallback, debug, where=None, tune_l2="warm") -> TunedKernel:
    """tilec.compile's tune= path: one TunedKernel per program, space, key and
    where= condition (cached), keyed by `key` (default: every shape symbol of the
    header, as a tune statement is: a choice made for one shape is not another's)."""
    tune, key = check_tune(source, consts, tune, key)
    key = default_key(source, where) if key is None else key
    pkey = program_key(source, consts, arch=arch, fallback=fallback, debug=debug, tune=_space(tune), tune_key=key,
                       tune_where=where, tune_l2=tune_l2)
    return kernel_mod.cached(pkey, lambda: TunedKernel(source, consts, tune, key, arch, fallback, debug,
                                                       where=where, check_where=True, tune_l2=tune_l2))


def statement_space(source, consts) -> tuple:
    """The program's tune statement less the consts given in `consts`: (space
    {name: values}, its declared values {name: value}, its `where` condition's
    text or None); ({}, {}, None) when there is no statement or every tuned
    const is given."""
    found = statement(source)
    if found is None:
        return {}, {}, None
    space, declared, where = found
    tune = {name: values for name, values in space if name not in consts}
    return tune, {name: declared[name] for name in tune}, where if tune else None


def checked_candidates(source, consts, space: dict, first: dict, where: str | None, limit: int = MAX_CHECKED):
    """What `tilec check` compiles of a tune space: (the candidates, the declared values
    first; how many the `where` condition keeps of those it was evaluated on; how many
    it was evaluated on, the declared values included; whether the candidates are a
    sample of the space). The condition is evaluated on every candidate of a space of
    at most CHECK_POOL (any_shape_candidates), else on CHECK_POOL drawn from it
    (`spread`); more than `limit` left are cut to `limit` drawn from them. `limit` 0:
    every candidate, whatever the space."""
    total = space_size(space)
    if total <= CHECK_POOL or not limit:
        cands = any_shape_candidates(source, consts, space, first, where)
        pool = total
    else:
        skip = 0                # the declared candidate's place in the product, drawn first
        for name, values in space.items():
            skip = skip * len(values) + values.index(first[name])
        cands = [dict(first)] + [candidate_at(space, i + (i >= skip)) for i in spread(total - 1, CHECK_POOL - 1)]
        pool = len(cands)
        if where is not None:
            condition = Condition(source, consts, where)
            cands = cands[:1] + [cfg for cfg in cands[1:] if condition.meets(cfg, {}) is not False]
    kept = len(cands)
    if limit and kept > limit:
        cands = cands[:1] + [cands[1 + i] for i in spread(kept - 1, limit - 1)]
    return cands, kept, pool, len(cands) < total and (len(cands) < kept or pool < total)


def any_shape_candidates(source, consts, space: dict, first: dict, where: str | None) -> list:
    """The candidates of a tune statement's space, its declared values first (kept
    whatever the condition says), less those its `where` condition excludes for
    every shape (decided from the consts alone): what `tilec check` compiles, and
    any of which a tune may pick."""
    cands = candidates(space, first)
    if where is None:
        return cands
    condition = Condition(source, consts, where)
    return cands[:1] + [cfg for cfg in cands[1:] if condition.meets(cfg, {}) is not False]


def from_statement(source, consts, key, arch, fallback, debug, where=None, tune_l2="warm"):
    """tilec.compile of a program with a tune statement (and no tune=): a
    TunedKernel over the statement's space less the consts given in `consts`,
    its declared values first, keyed by `key` (default: every shape symbol of
    the header), filtered by its `where` condition (or `where`, given); None
    when the program has no tune statement or every tuned const is given."""
    tune, first, own = statement_space(source, consts)
    if not tune:
        return None
    key = default_key(source, own if where is None else where) if key is None else _key_tuple(key)
    pkey = program_key(source, consts, arch=arch, fallback=fallback, debug=debug, tune=_space(tune), tune_key=key,
                       tune_first=tuple(first.items()), tune_where=where, tune_l2=tune_l2)
    return kernel_mod.cached(pkey, lambda: TunedKernel(source, consts, tune, key, arch, fallback, debug, first,
                                                       own if where is None else where, where is not None, tune_l2))


def first_interpreted(source, consts, tune, key, fallback, arch):
    """backend="interpret": the first candidate the compiler accepts, untimed
    (tune= and key= checked as for the cuda backend)."""
    from .runtime.interpret import interpret
    tune, _ = check_tune(source, consts, tune, key)
    errors = []
    for cfg in iter_candidates(tune):
        lines = [f"{_describe(c)}: refused: {e}" for c, e in errors] + \
            [f"{_describe(cfg)}: chosen untimed (backend=\"interpret\" does not time: the first candidate the "
             "compiler accepts)"]
        try:        # lowered once: the compiler's errors, or the kernel
            return interpret(source, {**consts, **cfg}, fallback, arch, tuned=cfg,
                             tune_report=_interpreted_report(source, lines))
        except TilecError as e:
            errors.append((cfg, e))
    raise errors[0][1]


def interpreted_statement(source, consts, fallback, arch):
    """backend="interpret" of a program with a tune statement (and no tune=): the
    declared consts, untimed (None without a statement, or with every tuned
    const given)."""
    from .runtime.interpret import interpret
    space, first, _ = statement_space(source, consts)
    if not space:
        return None
    lines = [f"{_describe(first)}: chosen untimed (backend=\"interpret\" does not time: the tune statement's "
             "declared values)"]
    return interpret(source, consts, fallback, arch, tuned=first, tune_report=_interpreted_report(source, lines))


def _interpreted_report(source, lines) -> str:
    head = f"autotune {_kernel_name(source)}: not tuned (the interpret backend does not time):"
    return "\n".join([head] + ["  " + line.replace("\n", "\n      ") for line in lines]) + "\n"
