"""Shape symbols fixed at compile time (tilec.compile(src, C=24), -D C=24:
tests/filecheck/fixed_symbol.tile pins the IR and the wrappers), and the launch
that fixes one itself: examples/conv2d.tile, whose channel count C is a shape
symbol and whose K tile is 64 channels, called with 24, 96, 8 or 40 channels
runs the program compiled for them (its im2col loads fit the filter taps, on
TMA), not the thread-copy variant, and with fallback=False too. Channels that
are no whole 16-byte units, or an X that breaks another rule, still run the
thread-copy variant, with the warning. The interpreter and the GPU against
numpy, each output in a sentinel-filled buffer."""
import re
import subprocess
import warnings

import numpy as np
import pytest

import tilec
from tilec.ir import printer
from tilec.kernel import Kernel
from tilec.runtime import host
from tilec.runtime.interpret import InterpretedKernel
from tilec.runtime.tensormap import check_im2col

from conftest import ROOT, TILEC
from guard import guarded
from test_two_sources import VIEWS, im2col, on

CONV = (ROOT / "examples/conv2d.tile").read_text()
COPY2D = (ROOT / "examples/copy2d.tile").read_text()
FIXABLE = [24, 96, 8, 40]       # chunks of 8, 32, 8, 8 channels: 16-, 64-, 16-, 16-byte rows


def conv_problem(n, h, w, c, f, like, x_channels=None):
    """conv2d.tile's arguments for a 3x3, pad-1 convolution of c channels (values
    -1..1: every sum exact in f16), the guarded output and the expected result.
    `x_channels`: X as the first c channels of a wider tensor (its pixels that far apart)."""
    rng = np.random.default_rng(n * h * w * c + f)
    x = rng.integers(-1, 2, (n, h, w, x_channels or c)).astype(np.float16)
    wt = rng.integers(-1, 2, (9 * c, f)).astype(np.float16)
    padded = np.zeros((n, h + 2, w + 2, c))
    padded[:, 1:-1, 1:-1] = x[..., :c]
    cols = np.concatenate([padded[:, i:i + h, j:j + w] for i in range(3) for j in range(3)], axis=-1)
    want = cols.reshape(n * h * w, 9 * c) @ wt.astype(np.float64)
    x, wt = on(like, [x, wt])
    return [x[..., :c], wt], guarded((n * h * w, f), "f16", like=like), want


def run(k, args, y, want, like):
    k(*args, y.view)
    if like == "torch":
        import torch
        torch.cuda.synchronize()
    y.check()
    got = y.view if like == "numpy" else y.view.cpu().numpy()
    assert np.array_equal(got.astype(np.float64), want)


def backend(like):
    return {"backend": "interpret"} if like == "numpy" else {}


def fixes_the_channels(like, c, fallback):
    """conv2d.tile on c channels: no warning, the exact result, and the program
    that ran is the one compiled for c channels, on TMA."""
    k = tilec.compile(CONV, fallback=fallback, tune=False, **backend(like))
    args, y, want = conv_problem(1, 5, 6, c, 64, like)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        run(k, args, y, want, like)
    assert k.last_fix == {"C": c}
    fixed = k.fixed(C=c)
    assert fixed.kernel_ir.fixed == (("C", c),)
    assert "im2col" in fixed.tma_table() and "channelSymbol" not in fixed.host_source
    assert f"; C={c})" in repr(fixed)


@pytest.mark.parametrize("fallback", [True, False])
@pytest.mark.parametrize("c", FIXABLE)
def test_a_launch_fixes_the_channels_in_the_interpreter(c, fallback):
    fixes_the_channels("numpy", c, fallback)


@pytest.mark.gpu
@pytest.mark.parametrize("fallback", [True, False])
@pytest.mark.parametrize("c", FIXABLE)
def test_a_launch_fixes_the_channels_on_the_gpu(c, fallback):
    fixes_the_channels("torch", c, fallback)


def ring_run_once(like, persistent, producer):
    """conv2d.tile on 8 channels asks for 6 stages: with C fixed, K = 72 is two K tiles of
    64, and a ring run once (no persistent loop around it) gets 3 stages, what its
    prologue needs to issue both; one a persistent block runs per tile keeps 6 (the
    next tile's loads use them). The exact result either way, the output guarded."""
    k = tilec.compile(CONV, tune=False, STAGES=6, BM=128, BN=64, PERSISTENT=persistent, PRODUCER=producer,
                      **backend(like))
    args, y, want = conv_problem(2, 5, 6, 8, 64, like)
    run(k, args, y, want, like)
    ir_text = printer.kernel(k.fixed(C=8).kernel_ir)
    stages = 6 if persistent else 3
    assert re.search(rf"for k in pipelined\(2, stages = {stages}\b", ir_text), ir_text
    assert f"layout sw16 stages {stages}" in ir_text


@pytest.mark.parametrize("producer", [0, 1])
@pytest.mark.parametrize("persistent", [0, 1])
def test_a_ring_run_once_has_no_stages_past_its_trips_in_the_interpreter(persistent, producer):
    ring_run_once("numpy", persistent, producer)


@pytest.mark.gpu
@pytest.mark.parametrize("producer", [0, 1])
@pytest.mark.parametrize("persistent", [0, 1])
def test_a_ring_run_once_has_no_stages_past_its_trips_on_the_gpu(persistent, producer):
    ring_run_once("torch", persistent, producer)


@pytest.mark.gpu
def test_the_tuned_example_fixes_the_channels_of_every_candidate():
    """conv2d.tile as shipped (its tune statement) on 24 channels: every candidate
    runs compiled for them (the others' programs compiled in parallel once the
    first needed it), none on thread copies; the choice is right and fixed too."""
    k = tilec.compile(CONV, where="BM == 128 && PRODUCER == 0 && PERSISTENT == 0")
    args, y, want = conv_problem(2, 14, 14, 24, 64, "torch")
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        run(k, args, y, want, "torch")
        run(k, args, y, want, "torch")         # the tuned choice, again
    assert k.best_config["BM"] == 128


def test_the_program_a_launch_fixed_is_exported_with_last_fix(tmp_path):
    """k.export(dir, **k.last_fix) after a launch that fixed C: the program compiled
    with C fixed, as `tilec export -D C=24` writes it."""
    k = tilec.compile(CONV, tune=False, backend="interpret")
    args, y, want = conv_problem(1, 5, 6, 24, 64, "numpy")
    run(k, args, y, want, "numpy")
    k.export(tmp_path, **k.last_fix)
    assert "shape symbols fixed at compile time: C = 24" in (tmp_path / "conv2d.h").read_text()
    assert (tmp_path / "conv2d.cubin").read_bytes() == tilec.compile(CONV, tune=False, arch="sm_90a", C=24).cubin


def test_an_export_with_the_kernels_fixes_does_what_its_calls_did(tmp_path):
    """k.fixes lists the programs a kernel's launches fixed; k.export(dir, fixes=k.fixes)
    writes what `tilec export --fix C=24 --fix C=40` writes."""
    path = str(ROOT / "examples/conv2d.tile")
    k = tilec.compile(path, tune=False, backend="interpret")
    assert k.fixes == []
    for c in (24, 40, 24):
        args, y, want = conv_problem(1, 3, 4, c, 64, "numpy")
        run(k, args, y, want, "numpy")
    assert k.fixes == [{"C": 24}, {"C": 40}] and k.last_fix == {"C": 24}
    k.export(tmp_path / "py", fixes=k.fixes)
    p = subprocess.run([*TILEC, "export", path, "-o", str(tmp_path / "cli"), "--fix", "C=24", "--fix", "C=40"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    files = {f.name: f.read_bytes() for f in (tmp_path / "cli").iterdir()}
    assert sorted(files) == sorted(f"{n}.{e}" for n in ("conv2d", "conv2d_C24", "conv2d_C40")
                                   for e in ("h", "cc", "cubin", "thread_copy.cubin"))
    assert {f.name: f.read_bytes() for f in (tmp_path / "py").iterdir()} == files


def reads_zeros_past_the_last_tap(like):
    """conv2d.tile compiled for 24 channels: its last K tile (columns 192 .. 255 of 216)
    ends past the view's last column. Its chunks past the end copy zeros (the module's
    tl_zeros) instead of an im2col load, against rows of W past its end, which TMA
    fills with zeros too. X lies between an image of Inf before and after
    it, and holds an Inf and a -Inf itself: a load that read memory past X's last image,
    or a pixel's channels, would give 0 * Inf = NaN in an output that is finite or +-Inf."""
    rng = np.random.default_rng(24)
    values = rng.integers(-1, 2, (1, 5, 6, 24)).astype(np.float16)
    values[0, 2, 3, 5], values[0, 4, 5, 17] = np.inf, -np.inf   # one channel each: some outputs are +-Inf
    x = guarded(values.shape, "f16", like=like, pad=((1, 1), 0, 0, 0), sentinel=np.inf, fill=values)
    wt = rng.integers(-1, 2, (216, 64)).astype(np.float16)
    with np.errstate(invalid="ignore"):
        want = im2col(values) @ wt.astype(np.float64)
    assert np.isnan(want).any() and np.isfinite(want).sum() > want.size // 2
    y = guarded((30, 64), "f16", like=like)
    tilec.compile(CONV, tune=False, fallback=False, C=24, **backend(like))(x.view, *on(like, [wt]), y.view)
    if like == "torch":
        import torch
        torch.cuda.synchronize()
    y.check()
    got = y.view if like == "numpy" else y.view.cpu().numpy()
    assert np.array_equal(got.astype(np.float64), want, equal_nan=True)


def test_columns_past_the_last_tap_read_zeros_in_the_interpreter():
    reads_zeros_past_the_last_tap("numpy")


@pytest.mark.gpu
def test_columns_past_the_last_tap_read_zeros_on_the_gpu():
    """On the GPU the columns past the view's end are the copied zeros, not X's memory
    nor another pixel's channels (TmaLoad.zeros_if)."""
    reads_zeros_past_the_last_tap("torch")


# schedules whose K tiles end past the view's 9 * C columns: chunks of 1024, 3072 (copies
# of 2048 and 1024 zero bytes) and 2048 bytes
ZERO_SCHEDULES = [dict(BM=64, BN=64, STAGES=3), dict(BM=192, BN=64, STAGES=2),
                  dict(BM=128, BN=128, STAGES=4, PRODUCER=1, PERSISTENT=1)]


def zeros_past_the_end(like, c, consts):
    """conv2d.tile compiled for c channels: the loads of the columns past 9 * c copy
    zeros, on the load's barrier, in every schedule; three images, so that the
    persistent schedule's blocks take several tiles."""
    k = tilec.compile(CONV, tune=False, fallback=False, C=c, **consts, **backend(like))
    args, y, want = conv_problem(3, 5, 7, c, 64, like)
    run(k, args, y, want, like)


@pytest.mark.parametrize("consts", ZERO_SCHEDULES, ids=str)
@pytest.mark.parametrize("c", [8, 24])
def test_columns_past_the_end_copy_zeros_in_the_interpreter(c, consts):
    cuda = tilec.compile(CONV, tune=False, C=c, **consts).cuda_source
    sizes = {64: [1024], 128: [2048], 192: [2048, 1024]}[consts["BM"]]
    copies = re.findall(r"bulk_copy_zeros\(reinterpret_cast<unsigned char\*>\(a\)[^,]*, (\d+), ", cuda)
    assert copies and copies[:len(sizes)] == [str(n) for n in sizes], copies[:4]
    zeros_past_the_end("numpy", c, consts)


@pytest.mark.gpu
@pytest.mark.parametrize("consts", ZERO_SCHEDULES, ids=str)
@pytest.mark.parametrize("c", [8, 24])
def test_columns_past_the_end_copy_zeros_on_the_gpu(c, consts):
    zeros_past_the_end("torch", c, consts)


def runs_the_thread_copies(c, warning, error):
    """conv2d.tile on c channels in the interpreter: the thread-copy variant runs,
    warning `warning` (a regular expression), and without it the launch raises `error`."""
    k = tilec.compile(CONV, backend="interpret", tune=False)
    args, y, want = conv_problem(1, 4, 5, c, 64, "numpy")
    with pytest.warns(tilec.TmaFallbackWarning, match=warning):
        run(k, args, y, want, "numpy")
    with pytest.raises(tilec.LaunchError, match=error):
        tilec.compile(CONV, backend="interpret", tune=False, fallback=False)(*args, y.view)


def test_a_channel_count_of_no_whole_16_bytes_runs_the_thread_copies():
    """20 f16 channels are 40 bytes a pixel: no im2col load fits them, fixed or not."""
    runs_the_thread_copies(20, r"argument X: 20 channels is not a multiple of the 64 channels of one im2col load "
                               r"\(a TMA im2col load must not straddle two filter taps, and a tap of 20 channels is "
                               r"40 bytes, no multiple of the 16 bytes TMA moves: pad the channels to a multiple of "
                               r"8\); dim 1 stride",
                           "20 channels is not a multiple of the 64 channels")


@pytest.mark.parametrize("strides, fix", [
    ((30 * 24, 6 * 24, 24, 1), {"C": 24}),
    ((30 * 28, 6 * 28, 28, 1), {}),         # pixels 56 bytes apart: no tensor map describes X, C fixed or not
])
def test_the_fix_is_offered_only_where_the_channels_are_the_only_problem(strides, fix):
    x = host.TensorArg("X", 0x7f0000000000, (1, 5, 6, 24), strides, "f16", 0)
    with pytest.raises(tilec.TmaRuleError) as err:
        check_im2col(x, 128, 64, (-1, -1), (-1, -1), (1, 1, 1, 1), channel_symbol="C")
    assert err.value.fix == fix
    assert err.value.message.endswith("where its loads fit the taps)" if fix else
                                      "); row stride 56 bytes is not a multiple of 16 (TMA requires 16-byte aligned "
                                      "strides)")
    with pytest.raises(tilec.TmaRuleError) as err:
        check_im2col(x, 128, 64, (-1, -1), (-1, -1), (1, 1, 1, 1))    # 24 channels, declared in the header
    assert err.value.fix == {}


@pytest.mark.gpu
def test_an_x_that_breaks_another_rule_runs_the_thread_copies(monkeypatch):
    """24 channels of a 28-channel tensor, passed as the view it is: its pixels are
    56 bytes apart, which no tensor map describes, so fixing C would not help. The
    warning names the channel rule too until a launch has fixed C = 24; a call with
    24 channels then goes to that program first, whose wrapper sees the strides alone."""
    k = tilec.compile(CONV, tune=False)
    monkeypatch.setattr(k, "_fixes", [])        # the kernel is cached: no fix remembered from another test
    args, y, want = conv_problem(1, 4, 5, 24, 64, "torch", x_channels=28)
    with pytest.warns(tilec.TmaFallbackWarning, match=r"24 channels is not a multiple of the 64 channels .*; "
                      r"row stride 56 bytes is not a multiple of 16"):
        run(k, args, y, want, "torch")
    assert k._fixes == []
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        run(k, *conv_problem(1, 4, 5, 24, 64, "torch"), "torch")       # a dense X: C = 24 fixed, on TMA
    assert k._fixes == [{"C": 24}]
    args, y, want = conv_problem(1, 4, 5, 24, 64, "torch", x_channels=28)
    with pytest.warns(tilec.TmaFallbackWarning) as record:
        run(k, args, y, want, "torch")
    said = str(record[0].message)
    assert "row stride 56 bytes is not a multiple of 16" in said and "channels is not a multiple" not in said, said


def test_a_fixed_program_that_does_not_compile_runs_the_thread_copies(monkeypatch):
    def refuse(self, **symbols):
        raise tilec.TilecError("refused here")
    monkeypatch.setattr(InterpretedKernel, "fixed", refuse)
    runs_the_thread_copies(24, r"choose a K tile that divides 24, or compile the kernel with C = 24 fixed \(-D C=24\), "
                               r"where its loads fit the taps\); compiled with C = 24, the kernel does not compile "
                               r"either \(refused here\): TMA cannot copy it",
                           "compiled with C = 24, the kernel does not compile either")


def test_a_fixed_symbol_is_checked_at_launch():
    k = tilec.compile(COPY2D, backend="interpret", N=48)
    a = np.arange(6 * 48, dtype=np.float32).reshape(6, 48)
    b = guarded((6, 48), "f32", like="numpy")
    k(a, b.view)
    b.check()
    assert np.array_equal(b.view, a)
    with pytest.raises(tilec.LaunchError) as err:
        k(a[:, :40], b.view[:, :40])
    assert err.value.message == "argument A: dim 1 is 40 but the declaration says 48 (compiled with N = 48)"
    assert repr(k).endswith("(BM=64, BN=128; N=48) on the CPU>")


@pytest.mark.parametrize("value, message", [
    (0, "shape symbol 'N' must be fixed to a positive integer, got 0"),
    (True, "shape symbol 'N' must be fixed to a positive integer, got True"),
    (2**63, "shape symbol 'N' must be fixed to a positive integer, got 9223372036854775808"),
])
def test_a_shape_symbol_is_fixed_to_a_positive_integer(value, message):
    with pytest.raises(tilec.TilecError) as err:
        tilec.compile(COPY2D, backend="interpret", N=value)
    assert err.value.message == message


def test_the_tuned_example_with_its_channels_fixed_by_the_caller():
    """tilec.compile(conv2d.tile, C=24): the tune statement's kernel, for 24 channels only."""
    k = tilec.compile(CONV, backend="interpret", C=24)
    assert k.kernel_ir.fixed == (("C", 24),)
    args, y, want = conv_problem(1, 3, 4, 24, 64, "numpy")
    run(k, args, y, want, "numpy")
    args, y, want = conv_problem(1, 3, 4, 16, 64, "numpy")
    with pytest.raises(tilec.LaunchError, match=r"argument X: dim 3 is 16 but the declaration says 24 \(compiled "
                                                r"with C = 24\)"):
        k(*args, y.view)


# two convolutions summed into one accumulator, their channel counts shape symbols
TWO = VIEWS.replace("const C1 = 16, C2 = 16, ", "const ")


def two_problem(c1, c2, like):
    rng = np.random.default_rng(c1 * c2)
    x, z = (rng.integers(-2, 3, (2, 5, 6, c)).astype(np.float16) for c in (c1, c2))
    wt, vt = (rng.integers(-2, 3, (9 * c, 64)).astype(np.float16) for c in (c1, c2))
    want = im2col(x) @ wt.astype(np.float64) + im2col(z) @ vt.astype(np.float64)
    return on(like, [x, z, wt, vt]), guarded((60, 64), "f32", like=like), want


def fixes_both(like):
    """24 and 40 channels: the launch fixes C1, whose program's launch fixes C2."""
    k = tilec.compile(TWO, fallback=False, **backend(like))
    args, y, want = two_problem(24, 40, like)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        run(k, args, y, want, like)
    assert k.fixed(C1=24).fixed(C2=40).kernel_ir.fixed == (("C1", 24), ("C2", 40))


def test_a_launch_fixes_two_views_channels_in_the_interpreter():
    fixes_both("numpy")


@pytest.mark.gpu
def test_a_launch_fixes_two_views_channels_on_the_gpu():
    fixes_both("torch")


def test_a_call_with_channels_fixed_before_goes_straight_to_that_program(monkeypatch):
    """The GPU backend's Kernel (nothing launches here: the wrapper and the fixed
    program are stood in): once a launch fixed C = 24, a call with 24 channels
    runs k.fixed(C=24) at once, not the wrapper whose im2col check would fail
    first; a call with other channels runs the wrapper."""
    k = tilec.compile(CONV, arch="sm_90a", tune=False)
    assert k._fixable == {"C": (0, 3)}
    monkeypatch.setattr(k, "_fixes", [])
    calls = []

    class Fixed:
        def _launcher(self, *args, stream=None):
            calls.append(("fixed", args[0].shape[3]))
    monkeypatch.setattr(Kernel, "fixed", lambda self, **symbols: Fixed())
    monkeypatch.setattr(Kernel, "_call", lambda self, stream, fallback, args: None)
    monkeypatch.setattr(Kernel, "_launch", property(lambda self: lambda call, *args: calls.append(
        ("wrapper", args[0].shape[3]))))
    x24, x32 = np.zeros((1, 5, 6, 24), np.float16), np.zeros((1, 5, 6, 32), np.float16)
    k._launcher(x24, None, None)
    k._launcher_fixed({"C": 24})(x24, None, None)      # what Call.fall_back does after the wrapper's check
    k._launcher(x24, None, None)
    k._launcher(x32, None, None)
    assert calls == [("wrapper", 24), ("fixed", 24), ("fixed", 24), ("wrapper", 32)]
    assert k._fixes == [{"C": 24}] and k.last_fix == {"C": 24}
