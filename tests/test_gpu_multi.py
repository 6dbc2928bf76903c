"""Kernels on every GPU of a machine: a kernel called on tensors of cuda:1 loads
its cubin there, encodes maps for that device's pointers, launches on that
device's current torch stream, keeps per-device launches apart, and refuses
tensors of two devices, and leaves the caller's current device as it found it.
Two-GPU tests: copy2d, im2col and gemm.tile on cuda:1 against cuda:0, two threads
each driving one device, mixed devices refused, a CUDA graph captured on cuda:1,
persistent and stream-K gemms on each device in turn, a tune on cuda:1 on a stream
of its own, the torch operator, cupy arrays and numpy arguments beside cuda:1
tensors, in place and overlap checks; they skip saying so on a machine with one
GPU, where the one-GPU tests check that the device index is threaded through."""
import threading

import numpy as np
import pytest

import tilec
from conftest import ROOT
from guard import guarded
from tilec.errors import LaunchError

pytestmark = pytest.mark.gpu


def devices():
    try:
        import torch
        return torch.cuda.device_count()
    except ImportError:
        return 0


two_gpus = pytest.mark.skipif("devices() < 2", reason="needs two GPUs; this machine has fewer")


def copy_on(device, shape=(300, 515)):
    import torch
    k = tilec.compile(str(ROOT / "examples" / "copy2d.tile"))
    a = guarded(shape, "f32", device=device, fill=torch.randn(*shape, device=device)).view   # rows TMA can read
    b = guarded(shape, "f32", device=device)
    k(a, b.view)
    k(a, b.view)                    # the replayed launch too
    torch.cuda.synchronize(device)
    b.check()
    return k, a, b.view


def test_cuda0_by_its_index_loads_and_launches_there():
    import torch
    k, a, b = copy_on("cuda:0")
    assert torch.equal(a, b)
    assert set(k._loaded) == {0}
    assert {p.device for p in k._prepared.values()} == {0}


@two_gpus
def test_a_call_leaves_the_callers_current_device_as_it_was():
    """A launch makes its tensors' device's context current; torch and cupy read their
    current device from it, so a call on cuda:1 must leave cuda:0 current (and the
    other way round inside `with torch.cuda.device(1)`), on the first call and on replays."""
    import torch
    k = tilec.compile(str(ROOT / "examples" / "copy2d.tile"))
    assert torch.cuda.current_device() == 0
    for dev, current in (("cuda:1", 0), ("cuda:0", 1)):
        with torch.cuda.device(current):
            a = torch.randn(64, 128, device=dev)
            b = guarded((64, 128), "f32", device=dev)
            for _ in range(2):                  # the first call, then the replay
                k(a, b.view)
                assert torch.cuda.current_device() == current
                assert torch.empty(1, device="cuda").device.index == current
            torch.cuda.synchronize(dev)
            assert torch.equal(a, b.view)
            b.check()
    assert torch.cuda.current_device() == 0


def test_a_torch_device_switch_between_calls_does_not_move_the_launch():
    """torch.cuda.set_device switches the thread's CUDA context behind tilec's back."""
    import torch
    k, a, b = copy_on("cuda:0")
    last = devices() - 1
    with torch.cuda.device(last):
        torch.ones(4, device=f"cuda:{last}").sum().item()
        b.zero_()
        k(a, b)                     # replays the launch on cuda:0's tensors
        torch.cuda.synchronize(0)
    assert torch.equal(a, b)


@two_gpus
@pytest.mark.parametrize("example", ["copy2d", "im2col", "gemm"])
def test_a_kernel_on_cuda1_matches_cuda0(example):
    import torch
    k = tilec.compile(str(ROOT / "examples" / f"{example}.tile"))
    gen = torch.Generator().manual_seed(0)
    if example == "copy2d":
        shapes = [((257, 300), torch.float32)]
        out_shape, out_dt = (257, 300), "f32"
    elif example == "im2col":
        shapes = [((2, 14, 14, 64), torch.float16)]
        out_shape, out_dt = (2 * 14 * 14, 9 * 64), "f16"
    else:
        shapes = [((256, 192), torch.float16), ((192, 320), torch.float16)]
        out_shape, out_dt = (256, 320), "f16"
    inputs = [torch.randn(*s, generator=gen).to(dt) for s, dt in shapes]
    results = {}
    for dev in ("cuda:0", "cuda:1"):
        out = guarded(out_shape, out_dt, device=dev)
        k(*[x.to(dev) for x in inputs], out.view)
        torch.cuda.synchronize(dev)
        out.check()
        results[dev] = out.view.cpu()
    assert torch.equal(results["cuda:0"], results["cuda:1"])
    assert set(getattr(k, "kernel", k)._loaded) == {0, 1}       # gemm.tile is tuned: its chosen kernel


@two_gpus
def test_two_threads_each_driving_one_device():
    import torch
    k = tilec.compile(str(ROOT / "examples" / "scale.tile"))
    errors = []

    def drive(dev):
        try:
            x = torch.randn(512, 700, device=dev)
            y = guarded((512, 700), "f32", device=dev)
            for i in range(1000):
                k(x, y.view, float(i % 7))
            torch.cuda.synchronize(dev)
            y.check()
            want = guarded((512, 700), "f32", device=dev)
            k(x, want.view, float(999 % 7))     # the last call's alpha, into a tensor of its own
            torch.cuda.synchronize(dev)
            want.check()
            assert torch.equal(y.view, want.view) and y.view.device == x.device
            assert torch.allclose(y.view, x * float(999 % 7) + 1.0, atol=1e-6)    # one rounding against two
        except Exception as e:      # reported by the main thread
            errors.append((dev, e))

    threads = [threading.Thread(target=drive, args=(f"cuda:{d}",)) for d in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@two_gpus
def test_tensors_of_two_devices_are_refused_before_any_launch():
    import torch
    k = tilec.compile(str(ROOT / "examples" / "copy2d.tile"))
    a = torch.randn(64, 128, device="cuda:0")
    b = torch.full((64, 128), -1.0, device="cuda:1")
    with pytest.raises(LaunchError, match="argument B is on cuda:1 but A is on cuda:0"):
        k(a, b)
    torch.cuda.synchronize(1)
    assert bool((b == -1.0).all())


@two_gpus
def test_a_cuda_graph_captured_on_cuda1():
    import torch
    k = tilec.compile(str(ROOT / "examples" / "copy2d.tile"))
    with torch.cuda.device(1):
        a = torch.randn(200, 300, device="cuda:1")
        b = guarded((200, 300), "f32", device="cuda:1")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            k(a, b.view)            # the warm-up call: compiles, loads, encodes
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            k(a, b.view)
        a.copy_(torch.randn(200, 300, device="cuda:1"))
        graph.replay()
        torch.cuda.synchronize(1)
    b.check()
    assert torch.equal(a, b.view)
    assert np.array_equal(a.cpu().numpy(), b.view.cpu().numpy())


GEMM_SRC = (ROOT / "examples" / "gemm.tile").read_text()


def _gemm_inputs(dev, m, n, kk, seed=0):
    import torch
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(m, kk, generator=gen).half().to(dev)
    b = torch.randn(kk, n, generator=gen).half().to(dev)
    return a, b, a.float() @ b.float()


def _close(c, want):
    return ((c.float() - want).norm() / want.norm()).item() < 2e-3


@two_gpus
def test_persistent_and_stream_k_gemms_on_each_device_in_turn():
    """A persistent grid sized by each device's SMs, and stream-K's workspace per
    (device, stream): cuda:1, cuda:0, cuda:1 again, each output guarded."""
    import torch
    from tilec.runtime import host
    kernels = [tilec.compile(GEMM_SRC, tune=False, PERSISTENT=1, STREAM_K=s, BM=128, BN=256, STAGES=3, PRODUCER=1)
               for s in (0, 1)]
    for dev in ("cuda:1", "cuda:0", "cuda:1"):
        a, b, want = _gemm_inputs(dev, 1000, 1536, 4096)
        for k in kernels:
            c = guarded((1000, 1536), "f16", device=dev)
            k(a, b, c.view)
            torch.cuda.synchronize(dev)
            c.check()
            assert _close(c.view, want), (dev, k)
    assert {d for d, _ in host._WORKSPACES} >= {0, 1}
    assert all(set(k._loaded) == {0, 1} for k in kernels)


@two_gpus
def test_a_tuned_gemm_tunes_on_cuda1_on_a_stream_of_its_own_and_cuda0_reuses_the_choice(monkeypatch, tmp_path):
    """gemm.tile as shipped, first called on cuda:1 (the current device is cuda:0)
    with stream= a stream of cuda:1: the candidates are timed and their outputs
    restored there. The same key on cuda:0 (the same GPU model) takes the choice."""
    import torch
    from tilec import autotune
    from tilec import kernel as kernel_mod
    monkeypatch.setenv("TILEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TILEC_AUTOTUNE", raising=False)
    kernel_mod._CACHE.clear()
    autotune._CHOICES.clear()
    assert torch.cuda.current_device() == 0
    k = tilec.compile(str(ROOT / "examples" / "gemm.tile"))
    a, b, want = _gemm_inputs("cuda:1", 768, 1024, 2048)
    c = guarded((768, 1024), "f16", device="cuda:1", fill=float("nan"))
    s = torch.cuda.Stream(device=1)
    k(a, b, c.view, stream=s.cuda_stream)
    s.synchronize()
    c.check()
    assert _close(c.view, want)
    chosen, tuned = dict(k.best_config), len(autotune._CHOICES)
    a0, b0, want0 = _gemm_inputs("cuda:0", 768, 1024, 2048, seed=1)
    c0 = guarded((768, 1024), "f16", device="cuda:0", fill=float("nan"))
    k(a0, b0, c0.view)
    torch.cuda.synchronize(0)
    c0.check()
    assert _close(c0.view, want0)
    assert k.best_config == chosen and len(autotune._CHOICES) == tuned


@two_gpus
def test_the_torch_operator_on_cuda1_plain_and_in_a_cuda_graph():
    import torch
    import tilec.torch  # noqa: F401
    op = tilec.compile(str(ROOT / "examples" / "scale.tile")).as_torch_op()
    with torch.cuda.device(1):
        x = torch.randn(300, 700, device="cuda:1")
        y = guarded((300, 700), "f32", device="cuda:1")
        op(x, y.view, 2.0)
        torch.cuda.synchronize(1)
        assert torch.equal(y.view, x * 2.0 + 1.0)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            op(x, y.view, 2.0)
        x.copy_(torch.randn(300, 700, device="cuda:1"))
        graph.replay()
        torch.cuda.synchronize(1)
    y.check()
    assert torch.equal(y.view, x * 2.0 + 1.0)


@two_gpus
def test_cupy_arrays_on_device1_with_device0_current():
    cupy = pytest.importorskip("cupy")
    k = tilec.compile(str(ROOT / "examples" / "copy2d.tile"))
    with cupy.cuda.Device(1):
        a = cupy.random.standard_normal((300, 516), dtype=cupy.float32)       # rows TMA can read
        b = guarded((300, 516), "f32", like="cupy")
    assert cupy.cuda.runtime.getDevice() == 0
    k(a, b.view)
    with cupy.cuda.Device(1):
        cupy.cuda.Device(1).synchronize()
        b.check()
        assert bool((a == b.view).all())
    assert set(k._loaded) == {1}


@two_gpus
def test_numpy_arguments_go_to_the_device_of_the_gpu_tensors_wherever_they_stand():
    """copy2d(A, B) with A a numpy array and B on cuda:1: A is copied to cuda:1 (the
    device of the GPU tensors), not to cuda:0, though it comes first."""
    import torch
    k = tilec.compile(str(ROOT / "examples" / "copy2d.tile"))
    a = np.random.default_rng(0).standard_normal((200, 300)).astype(np.float32)
    b = guarded((200, 300), "f32", device="cuda:1")
    k(a, b.view)
    torch.cuda.synchronize(1)
    b.check()
    assert np.array_equal(b.view.cpu().numpy(), a)
    assert set(k._loaded) == {1}


@two_gpus
def test_in_place_and_overlap_checks_on_cuda1():
    import torch
    k = tilec.compile(str(ROOT / "examples" / "scale.tile"))
    x = guarded((256, 512), "f32", device="cuda:1", fill=torch.randn(256, 512))
    want = guarded((256, 512), "f32", device="cuda:1")
    k(x.view, want.view, 3.0)           # out of place, for comparison (the kernel's fma rounds once)
    k(x.view, x.view, 3.0)              # in place: mark-in-place allows it
    torch.cuda.synchronize(1)
    x.check()
    want.check()
    assert torch.equal(x.view, want.view)
    with pytest.raises(LaunchError, match="share memory but are not the same view"):
        k(x.view[:-1], x.view[1:], 3.0)
