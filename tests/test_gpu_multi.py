"""Kernels on every GPU of a machine: a kernel called on tensors of cuda:1 loads
its cubin there, encodes maps for that device's pointers, launches on that
device's current torch stream, keeps per-device launches apart, and refuses
tensors of two devices. The tests that need two GPUs skip saying so on a machine
with one; the one-GPU tests check that the device index is threaded through."""
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
    assert set(k._loaded) == {0, 1}


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
            assert torch.allclose(y.view, x * 6.0 + 1.0)
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
