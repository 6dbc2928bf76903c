"""tilec kernels as torch operators (tilec.torch, Kernel.as_torch_op): the schema
and fake implementation from the signature, torch.compile(fullgraph=True)
tracing on meta tensors, and clear errors, on the CPU; on the GPU (marked gpu)
compiled graphs against plain calls, CUDA graph capture and replay, a side
stream and 8 threads. Every GPU output is a view inside a sentinel-filled
buffer whose padding is checked (tests/guard.py)."""
import contextlib
import re
import threading
import warnings
from pathlib import Path

import pytest

import tilec
from guard import guarded

torch = pytest.importorskip("torch")
import tilec.torch  # noqa: E402  (imports torch)

ROOT = Path(__file__).resolve().parent.parent
COPY2D = str(ROOT / "examples/copy2d.tile")
SCALE = str(ROOT / "examples/scale.tile")
GEMM = str(ROOT / "examples/gemm.tile")

# an integer scalar, and a shape that is an expression of a symbol
ADD_N = """
kernel add_n(X: i32[N], Y: i32[2 * N], n: i32) {
    grid (bx) = (cdiv(N, 256));
    threads 128;
    shared s: i32[256];
    copy(X[bx * 256], s);
    parallel (i) in (256) {
        s[i] = s[i] + n;
    }
    copy(s, Y[bx * 256]);
}
"""


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, device="meta", dtype=dtype)


def readme_snippet() -> str:
    """The python block of the README's "A kernel as a torch operator" section."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## A kernel as a torch operator"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


# ------------------------------------------------------------------ CPU

def test_schema_from_the_signature():
    op = tilec.compile(COPY2D).as_torch_op()
    assert re.fullmatch(r"tilec::copy2d_[0-9a-f]{12}", op.name)
    assert str(op.op._schema) == f"{op.name}(Tensor A, Tensor(a0!) B) -> ()"
    assert op.op is getattr(torch.ops.tilec, op.name.split("::")[1]).default
    scale = tilec.compile(SCALE).as_torch_op()
    assert str(scale.op._schema).endswith("(Tensor X, Tensor(a0!) Y, float alpha) -> ()")
    gemm = tilec.compile(GEMM, tune=False).as_torch_op()
    assert str(gemm.op._schema).endswith("(Tensor A, Tensor B, Tensor(a0!) C) -> ()")
    assert gemm.mutates == ("C",)
    add_n = tilec.compile(ADD_N).as_torch_op()
    assert str(add_n.op._schema).endswith("(Tensor X, Tensor(a0!) Y, SymInt n) -> ()")


def test_mutates_names_the_written_tensors():
    k = tilec.compile(GEMM, tune=False)
    op = tilec.torch.op(k, mutates=("C", "A"))
    assert op.mutates == ("A", "C")              # in the signature's order
    assert str(op.op._schema).endswith("(Tensor(a0!) A, Tensor B, Tensor(a1!) C) -> ()")
    assert op is not k.as_torch_op()             # its own operator
    assert k.as_torch_op(mutates="C") is k.as_torch_op()
    with pytest.raises(tilec.TilecError, match=r"mutates names 'D', not a tensor parameter of kernel gemm "
                                               r"\(A, B, C\)"):
        k.as_torch_op(mutates=("D",))
    with pytest.raises(tilec.TilecError, match="takes a kernel from tilec.compile"):
        tilec.torch.op(object())


def test_one_operator_per_kernel():
    k = tilec.compile(COPY2D)
    op = k.as_torch_op()
    assert op is k.as_torch_op() is tilec.torch.op(k)
    assert op.kernel is k
    assert tilec.compile(COPY2D, BM=32).as_torch_op() is not op
    # the same program compiled again (a cleared cache): the same operator, run by the newest kernel
    again = tilec.kernel.Kernel(k.source, k._overrides, k.arch)
    try:
        assert again.as_torch_op() is op and op.kernel is again
    finally:
        k.as_torch_op()
    assert op.kernel is k


def test_fake_impl_checks_dtypes_ranks_and_shapes():
    scale = tilec.compile(SCALE).as_torch_op()
    scale(meta(100, 200), meta(100, 200), 0.5)          # meta tensors: the fake implementation
    scale.op(meta(100, 200), meta(100, 200), 2)
    with pytest.raises(tilec.LaunchError, match="argument X: dtype torch.float16 does not match the declared f32"):
        scale(meta(100, 200, dtype=torch.float16), meta(100, 200), 1.0)
    with pytest.raises(tilec.LaunchError, match="argument Y: rank 3 does not match the declared rank 2"):
        scale(meta(100, 200), meta(100, 200, 1), 1.0)
    with pytest.raises(tilec.LaunchError, match=r"argument Y: dim 1 is 201 but N = 200 \(from X dim 1\)"):
        scale(meta(100, 200), meta(100, 201), 1.0)
    gemm = tilec.compile(GEMM, tune=False).as_torch_op()
    gemm(meta(256, 64, dtype=torch.float16), meta(64, 128, dtype=torch.float16), meta(256, 128, dtype=torch.float16))
    with pytest.raises(tilec.LaunchError, match=r"argument B: dim 0 is 32 but K = 64 \(from A dim 1\)"):
        gemm(meta(256, 64, dtype=torch.float16), meta(32, 128, dtype=torch.float16),
             meta(256, 128, dtype=torch.float16))
    add_n = tilec.compile(ADD_N).as_torch_op()
    add_n(meta(300, dtype=torch.int32), meta(600, dtype=torch.int32), 5)
    with pytest.raises(tilec.LaunchError, match=r"argument Y: dim 0 is 300 but the declaration says 2 \* N = 600"):
        add_n(meta(300, dtype=torch.int32), meta(300, dtype=torch.int32), 5)


def test_cpu_tensors_raise_tilecs_error():
    op = tilec.compile(COPY2D).as_torch_op()
    a, b = torch.zeros(64, 128), torch.zeros(64, 128)
    for call in (op, op.op):                  # the TorchOp and the operator through the dispatcher
        with pytest.raises(tilec.LaunchError, match="argument A: a tensor on the CPU was passed where a GPU "
                                                    "tensor is required"):
            call(a, b)


def test_fullgraph_compile_traces_one_node():
    op = tilec.compile(SCALE).as_torch_op()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(x, y):
        op(x, y, 0.5)
        return y * 2

    out = torch.compile(f, fullgraph=True, backend=backend)(meta(64, 256), meta(64, 256))
    assert out.shape == (64, 256) and out.device.type == "meta"
    (gm,) = graphs
    calls = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert calls[0] is op.op and len(calls) == 2
    # through AOTAutograd's functionalization too, with dynamic shapes
    out = torch.compile(f, fullgraph=True, backend="aot_eager", dynamic=True)(meta(64, 256), meta(64, 256))
    assert out.shape == (64, 256)


def test_fullgraph_compile_reports_a_shape_mismatch():
    op = tilec.compile(COPY2D).as_torch_op()
    f = torch.compile(lambda a, b: op(a, b), fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match=r"argument B: dim 0 is 65 but M = 64 \(from A dim 0\)"):
        f(meta(64, 128), meta(65, 128))


def test_make_fx_traces_the_operator():
    from torch.fx.experimental.proxy_tensor import make_fx
    op = tilec.compile(COPY2D).as_torch_op()
    gm = make_fx(lambda a, b: op(a, b), tracing_mode="fake")(meta(64, 128), meta(64, 128))
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [op.op]


def test_a_call_inside_a_capture_must_be_a_replay(monkeypatch):
    """Without a GPU: a capture made to look under way. Neither a plain call nor
    the operator reads its arguments."""
    k = tilec.compile(COPY2D)
    op = k.as_torch_op()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    a, b = torch.zeros(64, 128), torch.zeros(64, 128)
    for call in (k, op, op.op):
        with pytest.raises(tilec.CaptureError, match="kernel copy2d was called during CUDA graph capture with "
                                                     "arguments it has not been called with before") as e:
            call(a, b)
        assert "Call the kernel once with the same arguments before the capture" in str(e.value)
        assert isinstance(e.value, tilec.LaunchError)


def test_readme_snippet(monkeypatch):
    """The README's snippet, on meta tensors through AOTAutograd (no GPU here);
    test_readme_snippet_on_the_gpu runs it as it is."""
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compile_(fn, backend="aot_eager", **kw))
    monkeypatch.chdir(ROOT)
    env = {"tilec": tilec, "torch": torch, "x": meta(100, 300), "y": meta(100, 300)}
    exec(readme_snippet(), env)
    assert env["op"] is tilec.compile("examples/scale.tile").as_torch_op()


# ------------------------------------------------------------------ GPU

def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, device="cuda").to(dtype)


@contextlib.contextmanager
def no_fallback():
    """The outputs are aligned views: a TMA fallback would be a test bug."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        yield


# a case: its program, its guarded output, the tensor arguments (the output's view last), the
# scalars, and a function that gives the expected output
def copy2d_case():
    x = rand(200, 300)
    y = guarded((200, 300), "f32")
    return COPY2D, y, (x, y.view), (), lambda: x


def scale_case():
    x = rand(100, 500)
    y = guarded((100, 500), "f32")
    return SCALE, y, (x, y.view), (0.5,), lambda: x * 0.5 + 1.0


def gemm_case():
    a = rand(256, 192, dtype=torch.float16)
    b = rand(192, 384, dtype=torch.float16)
    c = guarded((256, 384), "f16")
    return GEMM, c, (a, b, c.view), (), lambda: (a.float() @ b.float()).half()


CASES = {"copy2d": copy2d_case, "scale": scale_case, "gemm": gemm_case}


def assert_output(case, got, want):
    if case == "gemm":
        err = ((got.float() - want.float()).norm() / want.float().norm()).item()
        assert err < 1e-2, f"gemm: relative error {err}"
    else:
        torch.testing.assert_close(got, want)


def _backends():
    import importlib.util
    inductor = pytest.param("inductor", marks=pytest.mark.skipif(
        importlib.util.find_spec("triton") is None, reason="inductor on CUDA needs triton"))
    return ["aot_eager", inductor]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("case", sorted(CASES))
def test_fullgraph_compile_matches_the_plain_call(case, backend):
    torch._dynamo.reset()        # f is one code object for every case: no recompile limit to reach
    src, guard, (*ins, out), scalars, want = CASES[case]()
    k = tilec.compile(src, tune=False)            # gemm.tile: its declared consts, a plain Kernel
    op = k.as_torch_op()
    ref_guard = guarded(out.shape, out.dtype)
    ref = ref_guard.view

    def f(*args):
        op(*args)
        return args[len(ins)] * 2

    with no_fallback():
        k(*ins, ref, *scalars)
        doubled = torch.compile(f, fullgraph=True, backend=backend)(*ins, out, *scalars)
    torch.cuda.synchronize()
    assert torch.equal(out, ref)                 # the same kernel: the same bits
    assert torch.equal(doubled, ref * 2)
    assert_output(case, out, want())
    guard.check()
    ref_guard.check()


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_operator_through_the_dispatcher_matches_the_plain_call(case):
    src, guard, (*ins, out), scalars, want = CASES[case]()
    op = tilec.compile(src, tune=False).as_torch_op()
    with no_fallback():
        op.op(*ins, out, *scalars)                # a first call: the operator's CUDA kernel
        torch.cuda.synchronize()
        assert_output(case, out, want())
        out.zero_()
        op(*ins, out, *scalars)                   # the replay
    torch.cuda.synchronize()
    assert_output(case, out, want())
    guard.check()


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(CASES))
def test_cuda_graph_capture_and_replay_with_new_inputs(case):
    src, guard, (*ins, out), scalars, want = CASES[case]()
    op = tilec.compile(src, tune=False).as_torch_op()
    args = (*ins, out, *scalars)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), no_fallback():
        op(*args)                                 # the warm-up call: compiles, loads, encodes tensor maps
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op(*args)
    for _ in range(3):
        for t in ins:                             # new data in the captured inputs
            t.copy_(torch.randn(t.shape, device="cuda").to(t.dtype))
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert_output(case, out, want())
        guard.check()


@pytest.mark.gpu
def test_a_call_not_warmed_up_raises_inside_a_capture():
    # consts and a shape no other test uses: no earlier call can have had these arguments
    k = tilec.compile(COPY2D, BM=16, BN=32)
    op = k.as_torch_op()
    x = rand(48, 72)
    guard = guarded((48, 72), "f32")
    y = guard.view
    for call in (op, k):
        with pytest.raises(tilec.CaptureError, match="Call the kernel once with the same arguments before the "
                                                     "capture"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                call(x, y)
    torch.cuda.synchronize()
    guard.check()
    assert bool((y == guard.sentinel).all()), "nothing ran"
    op(x, y)                                      # the warm-up; now the capture holds the replay
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op(x, y)
    y.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, x)
    guard.check()


@pytest.mark.gpu
def test_runs_on_the_current_side_stream():
    """The op is queued behind a long sleep on the side stream: once the default
    stream is idle the output is still untouched; after the side stream, done.
    Twice: the first call and the replay."""
    op = tilec.compile(SCALE).as_torch_op()
    x = rand(300, 700)
    guard = guarded((300, 700), "f32")
    y = guard.view
    warm = guarded((300, 700), "f32")
    op(x, warm.view, 2.0)                         # compiled and loaded before the timed part
    side = torch.cuda.Stream()
    for _ in range(2):
        y.fill_(3.0)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(1_000_000_000)       # ~0.5 s of spinning on the side stream
            op(x, y, 2.0)
        torch.cuda.current_stream().synchronize()
        assert bool((y == 3.0).all()), "the op did not run on the side stream"
        side.synchronize()
        torch.testing.assert_close(y, x * 2.0 + 1.0)
        guard.check()
    torch.testing.assert_close(warm.view, x * 2.0 + 1.0)
    warm.check()


@pytest.mark.gpu
def test_eight_threads_at_once():
    """8 threads on their own streams, 20 calls each; half call the TorchOp, half
    the operator through the dispatcher."""
    op = tilec.compile(SCALE).as_torch_op()
    xs = [rand(128 + 32 * i, 256) for i in range(8)]
    outs = [guarded((128 + 32 * i, 256), "f32") for i in range(8)]
    streams = [torch.cuda.Stream() for _ in range(8)]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    start, errors = threading.Barrier(8), []

    def work(i):
        try:
            call = op if i % 2 == 0 else op.op
            start.wait()
            with torch.cuda.stream(streams[i]):
                for r in range(20):
                    call(xs[i], outs[i].view, float(r % 3))
            streams[i].synchronize()
        except Exception as e:  # re-raised below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for x, y in zip(xs, outs):
        torch.testing.assert_close(y.view, x * 1.0 + 1.0)     # the last call's alpha: 19 % 3
        y.check()


@pytest.mark.gpu
def test_readme_snippet_on_the_gpu(monkeypatch):
    pytest.importorskip("triton", reason="the snippet's torch.compile (inductor) needs triton on CUDA")
    monkeypatch.chdir(ROOT)
    x = rand(100, 300)
    y = guarded((100, 300), "f32")
    exec(readme_snippet(), {"tilec": tilec, "torch": torch, "x": x, "y": y.view})
    torch.cuda.synchronize()
    torch.testing.assert_close(y.view, 2 * x + 1)
    y.check()


# ------------------------------------------------------------------ autograd


def _written_under_grad(call, x, y):
    with pytest.raises(tilec.LaunchError, match=r"argument Y requires grad, and kernel scale writes it: autograd "
                                                r"does not see a tilec kernel's writes, so gradients through Y "
                                                r"would be wrong: write it under torch.no_grad\(\)"):
        call(x, y, 2.0)


@pytest.mark.gpu
def test_a_written_tensor_that_requires_grad_is_refused_unless_grad_mode_is_off():
    """As torch refuses an in-place op on a leaf that requires grad: the plain kernel,
    the TorchOp and the operator through the dispatcher, first call and replay (a replay
    of a launch first made under no_grad); under torch.no_grad() (an optimizer step) it
    runs. Nothing is written when it raises."""
    k = tilec.compile(SCALE)
    op = k.as_torch_op()
    x = rand(64, 256)
    for call in (k, op):
        guard = guarded((64, 256), "f32", fill=5.0)
        y = guard.view.requires_grad_()
        _written_under_grad(call, x, y)             # a first call
        torch.cuda.synchronize()
        assert bool((y == 5.0).all())
        with torch.no_grad():
            call(x, y, 2.0)
        torch.cuda.synchronize()
        assert torch.equal(y.detach(), x * 2.0 + 1.0)
        _written_under_grad(call, x, y)             # its replay, now with grad mode on
        guard.check()
    y = torch.full((64, 256), 5.0, device="cuda", requires_grad=True)
    with pytest.raises((tilec.LaunchError, RuntimeError), match="requires grad"):
        op.op(x, y, 2.0)        # through the dispatcher: its autograd fallback may refuse first, or tilec does
    torch.cuda.synchronize()
    assert bool((y == 5.0).all())


@pytest.mark.gpu
def test_a_tensor_saved_for_backward_and_overwritten_makes_backward_raise():
    """The kernel bumps the version counter of every torch tensor it writes, on the first
    call and on replays, as torch's in-place ops do: backward through an op that saved the
    overwritten tensor raises instead of using the kernel's values. Inference tensors have
    no version counter and are written as they are."""
    k = tilec.compile(SCALE)
    op = k.as_torch_op()
    x = rand(64, 256)
    for call in (k, op):
        w = torch.randn(64, 256, device="cuda", requires_grad=True)
        guard = guarded((64, 256), "f32", fill=torch.randn(64, 256, device="cuda"))
        y = guard.view
        loss = (w * y).sum()                        # saves y for w's gradient
        v = y._version
        call(x, y, 2.0)
        call(x, y, 2.0)                             # the replay
        assert y._version >= v + 2                  # (through the dispatcher torch may bump it too)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()
        torch.cuda.synchronize()
        guard.check()
    with torch.inference_mode():
        guard = guarded((64, 256), "f32")
        k(x, guard.view, 2.0)
        k(x, guard.view, 2.0)
        torch.cuda.synchronize()
        assert torch.equal(guard.view, x * 2.0 + 1.0)
        guard.check()


@pytest.mark.gpu
def test_a_tuned_kernel_refuses_an_output_that_requires_grad_before_it_times_anything(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEC_CACHE_DIR", str(tmp_path / "cache"))
    k = tilec.compile(SCALE, tune={"BM": (16, 32)}, key=("M", "N"))
    x = rand(64, 256)
    guard = guarded((64, 256), "f32", fill=5.0)
    y = guard.view.requires_grad_()
    _written_under_grad(k, x, y)
    assert bool((y == 5.0).all())
    with torch.no_grad():
        k(x, y, 2.0)
    torch.cuda.synchronize()
    assert torch.equal(y.detach(), x * 2.0 + 1.0)
    guard.check()


def test_the_interpreter_refuses_a_cpu_tensor_that_requires_grad():
    k = tilec.compile(SCALE, backend="interpret")
    x = torch.randn(8, 16)
    guard = guarded((8, 16), "f32", device="cpu", fill=0.0)
    y = guard.view.requires_grad_()
    _written_under_grad(k, x, y)
    assert bool((y == 0.0).all())
    with torch.no_grad():
        k(x, y, 2.0)
    assert torch.equal(y.detach(), x * 2.0 + 1.0)
    guard.check()
