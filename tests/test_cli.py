"""The `tilec` command line, run as `python -m tilec` in a subprocess."""
import os
import subprocess

import pytest

from tilec.passes import PASS_NAMES
from test_autotune import ROTATING as _ROTATING
from conftest import ROOT, TILEC


def tilec(*args, cwd=ROOT, timeout=120):
    return subprocess.run([*TILEC, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def ok(*args, timeout=120):
    p = tilec(*args, timeout=timeout)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    return p.stdout


def fails(*args):
    """The stderr of a run that must exit 1 with a clean error and no traceback."""
    p = tilec(*args)
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    assert p.stdout == ""
    return p.stderr


# ---------------------------------------------------------------- emit

def test_emit_cuda():
    out = ok("emit", "examples/copy2d.tile", "--emit", "cuda")
    assert 'extern "C" __global__ void __launch_bounds__(128) copy2d(' in out
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes" in out
    assert "mbarrier_arrive_expect_tx(&tl_bar0, 32768);" in out


def test_emit_cuda_is_the_default():
    assert ok("emit", "examples/copy2d.tile") == ok("emit", "examples/copy2d.tile", "--emit", "cuda")


def test_emit_host():
    out = ok("emit", "examples/copy2d.tile", "--emit", "host")
    assert "def launch(tl_call, A, B):" in out
    assert "tl_tmap_A = tl_call.cuTensorMapEncodeTiled(" in out and "boxDim=(128, 64)," in out
    compile(out, "host.py", "exec")     # it is Python


def test_emit_ptx():
    out = ok("emit", "examples/copy2d.tile", "--emit", "ptx")
    assert ".target sm_90a" in out
    assert ".entry copy2d(" in out
    assert "cp.async.bulk.tensor.2d" in out


def test_emit_ir_defaults_to_the_last_pass():
    out = ok("emit", "examples/copy2d.tile", "--emit", "ir")
    assert out.startswith("kernel copy2d(A: f32[M, N], B: f32[M, N]) {\n")
    assert "  tensormap tmap_A: tiled A box [64, 128]" in out
    assert "  dynamic_smem 32768 bytes\n" in out
    assert PASS_NAMES[-1] == "plan-smem"
    assert out == ok("emit", "examples/copy2d.tile", "--emit", "ir", "--after", PASS_NAMES[-1])


@pytest.mark.parametrize("after, present, absent", [
    ("parse", "copy A[by * BM, bx * BN] -> s", "tma.load"),
    ("fold-consts", "copy A[by * 64, bx * 128] -> s", "tma.load"),
    ("lower-copies", "tma.load.tile s <- A[by * 64, bx * 128]", "tensormap"),
    ("plan-tma", "tensormap tmap_A", "mbarrier"),
    ("insert-barriers", "mbarrier.arrive.expect_tx bar0, 32768 bytes", "dynamic_smem"),
])
def test_emit_ir_after(after, present, absent):
    out = ok("emit", "examples/copy2d.tile", "--emit", "ir", "--after", after)
    assert present in out
    assert absent not in out


def test_emit_tma_table():
    out = ok("emit", "examples/copy2d.tile", "--emit", "tma")
    lines = out.splitlines()
    assert lines[0].startswith("TMA copies of kernel copy2d")
    assert lines[1].split() == ["line", "kind", "tensor", "tile", "box", "swizzle", "smem", "offset", "bytes",
                                "barrier", "expect-tx"]
    assert "load.tile" in lines[2] and "64x128" in lines[2] and lines[2].split()[-1] == "32768"
    assert "store.tile" in lines[3] and "bulk_group" in lines[3]


def test_define_changes_the_box():
    out = ok("emit", "examples/copy2d.tile", "--emit", "ir", "-D", "BN=64")
    assert "tensormap tmap_A: tiled A box [64, 64]" in out
    assert "mbarrier.arrive.expect_tx bar0, 16384 bytes" in out
    cuda = ok("emit", "examples/copy2d.tile", "-D", "BN=64", "-D", "BM=32")
    assert "// consts: BM = 32, BN = 64" in cuda
    assert "tma_load_2d(s, &tl_tmap_A, &tl_bar0, bx * 64, by * 32);" in cuda


def test_define_accepts_hex():
    assert "box [32, 128]" in ok("emit", "examples/copy2d.tile", "--emit", "ir", "-D", "BM=0x20")


# ---------------------------------------------------------------- check

@pytest.mark.parametrize("example", ["copy2d", "scale"])
def test_check_ok(example):
    out = ok("check", f"examples/{example}.tile")
    assert out.startswith(f"examples/{example}.tile: ok (kernel {example}, ")
    assert "cubin for sm_90a" in out


def test_check_gemm_and_conv2d():
    # gemm.tile's check compiles 462 candidates: about 70 s on two CPUs with an empty disk cache
    assert ok("check", "examples/gemm.tile", timeout=600).startswith("examples/gemm.tile: ok (kernel gemm, ")
    assert ok("check", "examples/conv2d.tile").startswith("examples/conv2d.tile: ok (kernel conv2d, ")


class _Refused:
    def __init__(self, text):
        self.text = text

    def render(self):
        return self.text + "\n    the source line\n    ^~~~"


def test_check_groups_the_candidates_one_error_refuses():
    """`tilec check` lists a tune space's refused candidates: one line for those of one
    error that are every candidate it tried with a few consts fixed, else one per
    candidate, grouped by error in the order of each error's first candidate."""
    from tilec.autotune import candidates
    from tilec.cli import _refusals
    tried = candidates({"BM": (128, 192), "BN": (128, 256), "P": (0, 1), "SK": (0, 1)})
    sk = [({"BM": m, "BN": n, "P": 0, "SK": 1}, _Refused("t:5:1: error: sk needs p")) for m in (128, 192)
          for n in (128, 256)]
    regs = [({"BM": 192, "BN": 256, "P": p, "SK": k}, _Refused("t:9:1: error: registers")) for p, k in
            ((0, 0), (1, 0), (1, 1))]
    assert _refusals(tried, [sk[0], regs[0], *sk[1:], *regs[1:]]) == [
        "4 candidates with P=0 SK=1 refused: t:5:1: error: sk needs p",
        "candidate BM=192 BN=256 P=0 SK=0 refused: t:9:1: error: registers",
        "candidate BM=192 BN=256 P=1 SK=0 refused: t:9:1: error: registers",
        "candidate BM=192 BN=256 P=1 SK=1 refused: t:9:1: error: registers"]
    # not every candidate tried with those values: a line each
    assert _refusals(tried, sk[:3]) == [f"candidate BM={c['BM']} BN={c['BN']} P=0 SK=1 refused: t:5:1: error: "
                                        "sk needs p" for c, _ in sk[:3]]
    # every candidate refused by one error: nothing fixed, a line each
    every = [({"BM": m}, _Refused("t:1:1: error: e")) for m in (128, 192)]
    assert _refusals(candidates({"BM": (128, 192)}), every) == ["candidate BM=128 refused: t:1:1: error: e",
                                                                "candidate BM=192 refused: t:1:1: error: e"]
    # a where condition left P=0 SK=1 out: the three of BM=192 BN=256 are every one tried there
    kept = [c for c in tried if not (c["P"] == 0 and c["SK"] == 1)]
    assert _refusals(kept, regs) == ["3 candidates with BM=192 BN=256 refused: t:9:1: error: registers"]


def test_gemm_rule_error_points_at_the_gemm(tmp_path):
    bad = tmp_path / "g.tile"
    text = (ROOT / "examples/gemm.tile").read_text()
    assert text.count("threads 128 * max(1, BM / 64 * (BM % 64 == 0));") == 1
    bad.write_text(text.replace("threads 128 * max(1, BM / 64 * (BM % 64 == 0));", "threads 96;"))
    err = fails("check", str(bad))
    assert err.startswith(f"{bad}:17:9: error: gemm runs on warpgroups of 128 threads; threads is 96")


# test_autotune's rotating loop (a 64 KiB tile: 3 copies fit, 4 do not) with its stages tuned in the program
ROTATING = _ROTATING.lstrip("\n").replace(" S = 3;\n", " S = 3;\n    tune S in (3, 4);\n")
PLAIN = ("this pipelined loop (stages = 4) runs as a plain loop: the stages' copies of the tiles it loads do not "
         "fit in shared memory (shared tiles need 262144 bytes, and 1024 more for 1 mbarrier (static shared memory "
         "counts in 1024-byte steps); a Hopper block has at most 232448 bytes of shared memory)")


def test_check_names_the_candidates_whose_pipelined_loop_runs_plain(tmp_path):
    """A 64 KiB tile rotates in 3 copies, not 4: the declared consts compile quietly, and
    the check lists candidate S=4's note; with S=4 declared, the compiler's warning
    itself, at the loop."""
    (tmp_path / "k.tile").write_text(ROTATING)
    p = tilec("check", "k.tile", cwd=tmp_path)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert p.stdout.splitlines()[1:] == [f"k.tile: candidate S=4 compiles with a warning: k.tile:9:5: {PLAIN}"]
    p = tilec("check", "k.tile", "-D", "S=4", cwd=tmp_path)
    assert p.returncode == 0 and p.stderr == f"k.tile:9:5: warning: {PLAIN}\n", p.stderr
    assert p.stdout == "k.tile: ok (kernel ksum, " + p.stdout.split(", ", 1)[1] and len(p.stdout.splitlines()) == 1


def test_check_parse_error(tmp_path):
    bad = tmp_path / "bad.tile"
    bad.write_text("kernel k(A: f32[M, N]) {\n    grid (bx) = (1)\n    threads 128;\n}\n")
    err = fails("check", str(bad))
    assert err == f"""\
{bad}:3:5: error: unexpected 'threads'; expected ',' or ';'
    threads 128;
    ^~~~~~~
"""


def test_check_semantic_error_in_a_relative_path(tmp_path):
    (tmp_path / "k.tile").write_text("kernel k(A: f32[M, N]) {\n    grid (bx) = (1);\n    threads 100;\n}\n")
    p = tilec("check", "k.tile", cwd=tmp_path)
    assert p.returncode == 1
    assert p.stderr.startswith("k.tile:3:13: error: threads must be a multiple of 32")


def test_check_missing_file():
    err = fails("check", "examples/nope.tile")
    assert err == "error: cannot read examples/nope.tile: no such file or directory\n"


@pytest.mark.parametrize("name", ["mykernel.tl", "mykernel", "kernel.txt"])
def test_file_is_a_path_whatever_its_name(tmp_path, name):
    (tmp_path / name).write_text((ROOT / "examples" / "copy2d.tile").read_text())
    p = tilec("check", name, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"{name}: ok (kernel copy2d")
    p = tilec("emit", name, "--emit", "ir", cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.startswith("kernel copy2d("), p.stderr


@pytest.mark.parametrize("command", [["check"], ["emit"], ["emit", "--emit", "ir"], ["export", "-o", "out"],
                                     ["demo"]])
def test_a_directory_is_no_file(command, tmp_path):
    p = tilec(*command[:1], "examples", *command[1:], cwd=ROOT)
    assert (p.returncode, p.stdout, p.stderr) == (1, "", "error: cannot read examples: is a directory\n")


def test_the_documented_example_paths_work_from_any_directory(tmp_path):
    """`examples/NAME.tile` that does not exist where tilec runs is the packaged
    example (README: the documented commands work from any directory); a file
    that exists there is read, and a missing example is still an error."""
    p = tilec("check", "examples/copy2d.tile", cwd=tmp_path)
    assert (p.returncode, p.stdout, p.stderr) == (
        0, "examples/copy2d.tile: ok (kernel copy2d, 9408-byte cubin for sm_90a)\n", ""), p.stderr
    p = tilec("check", "examples/nope.tile", cwd=tmp_path)
    assert (p.returncode, p.stderr) == (1, "error: cannot read examples/nope.tile: no such file or directory\n")
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "copy2d.tile").write_text("kernel mine() {}\n")
    p = tilec("check", "examples/copy2d.tile", cwd=tmp_path)
    assert p.stderr.startswith("examples/copy2d.tile:1:8: error: kernel 'mine' has no grid declaration"), p.stderr


def test_an_empty_file_is_an_empty_program():
    assert fails("check", "/dev/null").startswith("/dev/null:1:1: error: unexpected end of input; expected 'kernel'")


def test_export_into_a_file_or_nowhere_is_a_one_line_error(tmp_path):
    (tmp_path / "app.cc").write_text("")
    for out, message in [("app.cc", "error: cannot write into app.cc: it is not a directory (-o names the "
                                     "directory to write the files into)\n"),
                         ("app.cc/x", "error: cannot make the directory app.cc/x: not a directory\n"),
                         ("/proc/nope", "error: cannot make the directory /proc/nope: no such file or directory\n")]:
        p = tilec("export", str(ROOT / "examples" / "copy2d.tile"), "-o", out, cwd=tmp_path)
        assert (p.returncode, p.stdout, p.stderr) == (1, "", message)
    assert (tmp_path / "app.cc").read_text() == ""


def test_an_unwritable_stdout_is_a_one_line_error():
    with open("/dev/full", "w") as full:
        p = subprocess.run([*TILEC, "emit", "examples/copy2d.tile"], cwd=ROOT, stdout=full, stderr=subprocess.PIPE,
                           text=True, timeout=120)
    assert (p.returncode, p.stderr) == (1, "error: no space left on device\n")


def test_check_with_define():
    assert ok("check", "examples/copy2d.tile", "-D", "BM=16").startswith("examples/copy2d.tile: ok")
    err = fails("check", "examples/copy2d.tile", "-D", "BN=2")
    assert err.startswith("examples/copy2d.tile:8:5: error: the TMA box's inner dimension is 2 x 4 = 8 bytes")


# ---------------------------------------------------------------- bad command lines

@pytest.mark.parametrize("define, message", [
    ("BM", "error: -D takes NAME=VALUE, got 'BM'\n"),
    ("=4", "error: -D takes NAME=VALUE, got '=4'\n"),
    ("BM=x", "error: -D BM: 'x' is not an integer\n"),
    ("BM=", "error: -D BM: '' is not an integer\n"),
    ("NOPE=3", "error: kernel 'copy2d' has no const or shape symbol 'NOPE' to override (its consts: BM, BN; "
               "its shape symbols: M, N)\n"),
    ("M=0", "error: shape symbol 'M' must be fixed to a positive integer, got 0\n"),
])
@pytest.mark.parametrize("emit", ["ir", "cuda"])
def test_bad_define(define, message, emit):
    assert fails("emit", "examples/copy2d.tile", "--emit", emit, "-D", define) == message


def test_a_const_defined_twice_is_an_error():
    assert fails("check", "examples/copy2d.tile", "-D", "BM=1024", "-D", "BM=64") == \
        "error: -D BM is given twice (BM=1024 and BM=64): give each const once\n"


def test_a_cache_dir_that_is_a_file_warns_once(tmp_path):
    (tmp_path / "afile").write_text("")
    src = tmp_path / "k.tile"
    src.write_text((ROOT / "examples" / "copy2d.tile").read_text().replace("BM = 64", "BM = 32"))
    p = subprocess.run([*TILEC, "check", str(src)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "TILEC_CACHE_DIR": str(tmp_path / "afile")})
    assert p.returncode == 0 and p.stdout.startswith(f"{src}: ok"), p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"warning: TILEC_CACHE_DIR={tmp_path / 'afile'} cannot be "
                                                   "written (not a directory: "), p.stderr
    assert lines[0].endswith("): compiled kernels are not cached on disk (TILEC_CACHE=0 turns it off without this "
                             "warning)")


def test_a_worker_count_that_is_no_number_warns(monkeypatch):
    import warnings
    from tilec.runtime import workers
    monkeypatch.setattr(workers, "_WARNED", set())
    default = min(workers.usable_cpus(), workers.MAX_DEFAULT)
    for value in ("abc", "-2"):
        monkeypatch.setenv("TILEC_COMPILE_WORKERS", value)
        with pytest.warns(RuntimeWarning, match=f"TILEC_COMPILE_WORKERS='{value}' is not a number of workers "
                                                f"\\(0 or more\\): using the default, {default}"):
            assert workers.max_workers() == default
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert workers.max_workers() == default         # said once
    monkeypatch.setenv("TILEC_COMPILE_WORKERS", "0")
    assert workers.max_workers() == 0


def test_after_unknown_pass_lists_the_passes():
    err = fails("emit", "examples/copy2d.tile", "--emit", "ir", "--after", "barrier")
    assert err == (f"error: no pass named 'barrier'; passes: {', '.join(PASS_NAMES)} (each also as after-<pass>; "
                   "aliases: barriers = insert-barriers)\n")
    assert "plan-tma, check-smem, insert-barriers" in err


@pytest.mark.parametrize("after", ["barriers", "after-barriers", "after-insert-barriers"])
def test_after_accepts_the_after_form_and_the_alias(after):
    """design.md §4's k.ir("after-barriers"): "after-<pass>" and the alias "barriers"
    name insert-barriers, on the command line too."""
    assert ok("emit", "examples/copy2d.tile", "--emit", "ir", "--after", after) == \
        ok("emit", "examples/copy2d.tile", "--emit", "ir", "--after", "insert-barriers")


@pytest.mark.parametrize("emit", ["cuda", "host", "ptx", "tma"])
def test_after_without_emit_ir(emit):
    assert fails("emit", "examples/copy2d.tile", "--emit", emit, "--after", "plan-tma") == \
        "error: --after goes with --emit ir\n"


def test_unknown_emit_is_a_usage_error():
    p = tilec("emit", "examples/copy2d.tile", "--emit", "sass")
    assert p.returncode == 2
    assert "invalid choice: 'sass'" in p.stderr
    assert "Traceback" not in p.stderr


def test_check_prints_a_path_limit_warning_at_the_kernel_line(tmp_path):
    """A kernel with more paths than check-barriers explores still checks and compiles
    (exit 0), and the warning reads like the compiler's errors: file:line:col: warning:."""
    from test_check_barriers import _many_branches
    f = tmp_path / "many.tile"
    f.write_text(_many_branches(4))
    for _ in range(2):                      # compiled, then from the disk cache
        p = tilec("check", str(f))
        assert p.returncode == 0, p.stderr
        assert "Traceback" not in p.stderr
        assert p.stderr.startswith(f"{f}:1:1: warning: check-barriers proved kernel many's barrier protocol on "
                                   "its first 4096 paths only"), p.stderr


# ---------------------------------------------------------------- the docs' printed outputs

def _doc_commands(path):
    """(command, printed output) of every `$ tilec ...` line in a ``` block of a doc
    whose files are the examples and whose output is not elided (`...`)."""
    blocks, cur = [], None
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            blocks, cur = (blocks + [cur], None) if cur is not None else (blocks, [])
        elif cur is not None:
            cur.append(line)
    out = []
    for lines in blocks:
        cmd, printed = None, []
        for line in lines + ["$ "]:
            if line.startswith("$ "):
                if cmd is not None and "..." not in printed and all(
                        a.startswith("examples/") for a in cmd.split() if a.endswith(".tile")):
                    out.append((cmd, "".join(p + "\n" for p in printed)))
                cmd, printed = (line[2:] if line.startswith("$ tilec ") else None), []
            elif cmd is not None:
                printed.append(line)
    return out


DOC_COMMANDS = [(doc, cmd, printed) for doc in ("README.md", "docs/language.md", "docs/internals.md")
                for cmd, printed in _doc_commands(ROOT / doc)]


def test_the_docs_show_commands():
    assert any(cmd == "tilec emit examples/scale.tile --emit ir" for _, cmd, _ in DOC_COMMANDS)
    assert len(DOC_COMMANDS) >= 5


@pytest.mark.parametrize("doc, cmd, printed", DOC_COMMANDS, ids=[f"{d}:{c}" for d, c, _ in DOC_COMMANDS])
def test_the_docs_printed_outputs_are_the_real_ones(doc, cmd, printed):
    """"Every output below was produced by the tilec in this repository": each `$ tilec`
    command of the docs prints exactly what the docs show (stdout and stderr)."""
    p = tilec(*cmd.split()[1:])
    assert p.stdout + p.stderr == printed, f"{doc}: `{cmd}` is stale; it prints:\n{p.stdout}{p.stderr}"


def test_the_internals_guide_shows_the_pipeline_as_it_is():
    """docs/internals.md §3 quotes PIPELINE from tilec/passes/__init__.py, comments and
    all: the one ordering of the passes, as the code has it."""
    code = (ROOT / "tilec/passes/__init__.py").read_text()
    doc = (ROOT / "docs/internals.md").read_text()
    quote = lambda text: text[text.index("PIPELINE = ("):text.index("\n)\n", text.index("PIPELINE = ("))]  # noqa: E731
    assert quote(doc[doc.index("## 3. The passes"):]) == quote(code)


def test_the_internals_walk_through_of_copy2d_is_real_output():
    """docs/internals.md §5 follows copy2d.tile through the passes: each line it shows
    after a pass is a line of `--emit ir --after` that pass, and its kernel listing is
    the kernel of `--emit cuda`, letter for letter."""
    doc = (ROOT / "docs/internals.md").read_text()
    walk = doc[doc.index("--after fold-consts:\n"):]
    walk = walk[:walk.index("```")]
    shown, after = {}, None
    for line in walk.splitlines():
        if line.startswith("--after "):
            after = line.split()[1].rstrip(":")
            shown[after] = []
        elif line.strip():
            shown[after].append(line.strip())
    assert {"fold-consts", "lower-copies", "plan-tma", "insert-barriers", "plan-smem"} <= set(shown)
    for name, lines in shown.items():
        printed = {x.strip() for x in tilec("emit", "examples/copy2d.tile", "--emit", "ir", "--after", name).stdout.splitlines()}
        assert [x for x in lines if x not in printed] == [], f"docs/internals.md: --after {name} is stale"
    kernel = doc[doc.index('extern "C" __global__ void __launch_bounds__(128) copy2d('):]
    kernel = kernel[:kernel.index("```")]
    assert kernel in tilec("emit", "examples/copy2d.tile", "--emit", "cuda").stdout
