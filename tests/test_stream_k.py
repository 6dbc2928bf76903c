"""`grid ..., persistent = 1, stream_k = 1` (make-persistent's stream-K schedule):
the tiles of the last, partial wave split their K steps over all blocks, which
hand partial sums through the launch's workspace. Errors with their line, the IR
after the pass, the CUDA, the interpreter against numpy with guarded outputs
(3 resident blocks: ranges inside one tile, across two, three blocks on a tile),
and the GPU (guarded outputs; kernels of different slot sizes sharing a
stream's workspace)."""
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as hs

import tilec
from conftest import ROOT
from gemm_shapes import check_gemm_against_numpy
from guard import guarded
from tilec.codegen import export as tilec_export

GEMM = re.sub(r"\n\s*tune [^;]*;", "\n", (ROOT / "examples/gemm.tile").read_text())
GRID_LINE = next(i for i, line in enumerate(GEMM.splitlines(), 1) if line.strip().startswith("grid"))


def error(src, **consts):
    with pytest.raises(tilec.TilecError) as e:
        tilec.compile(src, arch="sm_90a", **consts)
    return str(e.value)


def test_stream_k_needs_a_persistent_grid():
    msg = error(GEMM, PERSISTENT=0, STREAM_K=1)
    col = GEMM.splitlines()[GRID_LINE - 1].index("STREAM_K,") + 1
    assert f"<string>:{GRID_LINE}:{col}: error: stream_k = 1 splits the tiles of a persistent grid's last wave: " \
           "it needs persistent = 1" in msg


@pytest.mark.parametrize("value", ["2", "M"])
def test_stream_k_must_be_a_compile_time_flag(value):
    msg = error(GEMM.replace("stream_k = STREAM_K", f"stream_k = {value}"), PERSISTENT=1)
    assert f"<string>:{GRID_LINE}:" in msg and "stream_k must be a compile-time 0 or 1" in msg


def test_stream_k_given_twice():
    msg = error(GEMM.replace("stream_k = STREAM_K", "stream_k = 1, stream_k = 0"), PERSISTENT=1)
    assert f"<string>:{GRID_LINE}:" in msg and "stream_k is given twice" in msg


NO_FILL = GEMM.replace("    fill(acc, 0);\n", "    fill(acc, 1);\n")
TWO_LOOPS = GEMM.replace("    copy(acc, C[by * BM, bx * BN]);",
                         "    for j in pipelined(cdiv(K, BK), stages = 2) {\n        copy(A[by * BM, j * BK], a);\n"
                         "    }\n    copy(acc, C[by * BM, bx * BN]);")
TILE_EXTENT = GEMM.replace("pipelined(cdiv(K, BK),", "pipelined(cdiv(K, BK) - bx,")


@pytest.mark.parametrize("src, line_of, message", [
    (NO_FILL, "for k in pipelined", "stream_k = 1: fill 'acc' with 0 before the pipelined loop"),
    (TWO_LOOPS, "for j in pipelined", "stream_k = 1 splits the K steps of one pipelined loop in the kernel's body; "
                                      "this kernel has 2 there"),
    (TILE_EXTENT, "for k in pipelined", "stream_k = 1: the pipelined loop's extent depends on bx"),
])
def test_kernels_stream_k_cannot_split_are_refused_at_their_line(src, line_of, message):
    msg = error(src, PERSISTENT=1, STREAM_K=1, PRODUCER=0)
    line = next(i for i, text in enumerate(src.splitlines(), 1) if line_of in text)
    assert f"<string>:{line}:" in msg and message in msg


def test_ir_after_the_pass():
    k = tilec.compile(GEMM, BM=128, BN=256, STAGES=3, PERSISTENT=1, STREAM_K=1)
    ir = k.ir("make-persistent")
    expect = [
        "grid (tl_block) = (cdiv(N, 256) * cdiv(M, 128)), persistent = 1, stream_k = 1, group = 8",
        "let tl_sk_parts = select(tl_tiles < tl_blocks, tl_tiles * max(1, min(tl_blocks / tl_tiles, tl_steps / 16)), "
        "tl_blocks)",
        "let tl_sk_begin = i64(min(tl_block, tl_sk_parts)) * tl_sk_steps / tl_sk_parts (64-bit)",
        "for tl_unit in range(tl_sk_units + cdiv(tl_tiles - tl_sk_tiles - tl_block, tl_blocks))",
        "let by = tl_group_row + tl_t % (8 * cdiv(N, 256)) % tl_group_rows",     # gemm.tile's group = 8
        "for k in pipelined(tl_k_steps, stages = 3, producer = 1)",
        "copy A[by * 128, (k + tl_k_lo) * 64] -> a",
        "if tl_k_hi < tl_steps {",
        "partial_store(acc) -> workspace slot tl_block, release",
        "for tl_part in range(tl_block - tl_first_block)",
        "partial_add(acc) <- workspace slot tl_block - 1 - tl_part, acquire",
        "copy acc -> C[by * 128, bx * 256]",
    ]
    at = 0
    for line in expect:
        found = ir.find(line, at)
        assert found >= 0, f"{line!r} not found (in order) in:\n{ir}"
        at = found


def test_cuda_hands_partial_sums_through_the_workspace():
    k = tilec.compile(GEMM, BM=128, BN=256, STAGES=3, PERSISTENT=1, STREAM_K=1)
    cu = k.cuda_source
    assert "unsigned char* const tl_workspace" in cu
    assert "unsigned* const tl_slot_ready = reinterpret_cast<unsigned*>(tl_workspace);" in cu
    # 128 x 256 f32 partial sums per block: 8192 float4 per slot, register r of thread i at r / 4 * 256 + i
    assert "float4* const tl_slot = reinterpret_cast<float4*>(tl_workspace + 65536) + " \
           "static_cast<long long>(tl_block) * 8192;" in cu
    assert "__stcg(&tl_slot[tl_r / 4 * 256 + threadIdx.x], make_float4(acc[tl_r]" in cu
    assert "if (threadIdx.x == 0) tl_slot_release(&tl_slot_ready[tl_block]);" in cu
    assert "if (threadIdx.x == 0) tl_slot_acquire(&tl_slot_ready[tl_block - 1 - tl_part]);" in cu
    assert "ld.acquire.gpu.global.u32" in cu and "fence.acq_rel.gpu" in cu
    assert k.compile_log == ""
    assert "tl_rt.Workspace(131072)" in k.host_source


def test_stream_k_zero_is_the_persistent_kernel():
    """The same CUDA but for the source lines quoted in comments."""
    plain = GEMM.replace(", stream_k = STREAM_K", "")

    def code(src):
        return [line for line in tilec.compile(src, PERSISTENT=1).cuda_source.splitlines()[1:]
                if not line.lstrip().startswith("//")]
    assert code(GEMM) == code(plain)


def test_export_of_stream_k_takes_a_workspace(tmp_path):
    """The exported launcher takes the workspace after the stream and has a query for
    its size (tests/test_export.py runs both against the stub driver and on the GPU)."""
    tilec_export.export(GEMM, tmp_path, PERSISTENT=1, STREAM_K=1)
    header = (tmp_path / "gemm.h").read_text()
    assert "    CUstream stream,\n    CUdeviceptr workspace,\n    size_t workspace_bytes,\n    CUdeviceptr A," in header
    assert "int tilec_gemm_workspace_bytes(size_t* bytes, char* err, size_t err_len);" in header
    plain = tmp_path / "plain"
    tilec_export.export(GEMM, plain, PERSISTENT=1)
    assert "workspace" not in (plain / "gemm.h").read_text() + (plain / "gemm.cc").read_text()


@settings(max_examples=14, deadline=None)
@given(tiles_m=hs.integers(1, 4), tiles_n=hs.integers(1, 2), ksteps=hs.integers(1, 7), stages=hs.integers(1, 4),
       producer=hs.integers(0, 1), ragged=hs.booleans())
def test_stream_k_gemm_interpreted_equals_numpy(tiles_m, tiles_n, ksteps, stages, producer, ragged):
    """1 to 8 tiles over 3 blocks: the remainder's tiles (plus a wave when it is
    under half of one) split their 1 to 7 K steps; a block stores at most one
    partial, a finisher adds up to two, each slot is added exactly once (the
    interpreter checks both)."""
    k = tilec.compile(GEMM, backend="interpret", BM=128, BN=128, STAGES=stages, PRODUCER=producer, PERSISTENT=1,
                      STREAM_K=1)
    check_gemm_against_numpy(k, tiles_m * 128 - (8 if ragged else 0), tiles_n * 128 - (8 if ragged else 0),
                             ksteps * 64)


@pytest.mark.parametrize("tiles_m, tiles_n, ksteps, stored", [
    (1, 1, 48, [0, 1]), (1, 1, 32, [0]), (1, 1, 20, []), (1, 2, 48, [])])
def test_fewer_tiles_than_blocks_split_their_k_steps_interpreted(tiles_m, tiles_n, ksteps, stored, monkeypatch):
    """Fewer tiles than the 3 blocks: each tile's K steps cut into as many equal
    pieces as the blocks per tile allow, none under 16 (make_persistent.SK_MIN_STEPS):
    48 steps of one tile three ways (blocks 0 and 1 store partials, block 2 adds
    both), 32 steps two ways (the third block idle), 20 steps not split, and two
    tiles on three blocks not split (one block per tile)."""
    from tilec.ir import nodes
    from tilec.runtime.interpret import blocks
    slots = []
    store = blocks._STMT[nodes.PartialStore]

    def counted(self, s, env):
        slots.append(int(self.ev(s.slot, env)))
        store(self, s, env)
    monkeypatch.setitem(blocks._STMT, nodes.PartialStore, counted)
    k = tilec.compile(GEMM, backend="interpret", BM=128, BN=128, STAGES=3, PRODUCER=1, PERSISTENT=1, STREAM_K=1)
    check_gemm_against_numpy(k, tiles_m * 128 - 8, tiles_n * 128, ksteps * 64)
    assert sorted(slots) == stored


@pytest.mark.parametrize("m, n", [(256, 196), (1000, 70)])
def test_no_k_steps_stores_every_tile_interpreted(m, n):
    """K = 0 (A and B empty: the thread-copy variant runs): no tile is stream-K's
    share, so every tile is stored, zeros; before, the remainder's tiles (here 4 % 3
    and 8 % 3 of the 3 blocks) were left to stream-K units that 0 K steps never make,
    and their part of C kept what it held (on the GPU: all of C, 6 tiles on 132 blocks)."""
    import warnings
    k = tilec.compile(GEMM, backend="interpret", BM=128, BN=128, STAGES=3, PRODUCER=1, PERSISTENT=1, STREAM_K=1)
    c = guarded((m, n), "f16", like="numpy", fill=5.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tilec.TmaFallbackWarning)
        k(np.zeros((m, 0), np.float16), np.zeros((0, n), np.float16), c.view)
    assert not c.view.any()
    c.check()


def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    return torch


GPU_CONFIGS = [dict(BM=128, BN=256, STAGES=3, PRODUCER=1), dict(BM=128, BN=256, STAGES=4, PRODUCER=0),
               dict(BM=128, BN=128, STAGES=4, PRODUCER=1), dict(BM=192, BN=128, STAGES=4, PRODUCER=1)]
GPU_SHAPES = [(128, 256, 64), (4096, 4096, 4096), (4095, 4104, 4096), (1000, 3000, 640), (256, 512, 64 * 77),
              (8192, 1024, 128), (130 * 128, 256, 1024)]


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", GPU_CONFIGS, ids=lambda c: "{BM}x{BN}x{STAGES}p{PRODUCER}".format(**c))
def test_stream_k_gemm_on_the_gpu(cfg):
    """One tile to 2080 tiles, K of 1 to 77 steps, each shape three times in a
    row (the flags a launch leaves must be clear for the next); guarded outputs."""
    torch = _torch()
    k = tilec.compile(GEMM, PERSISTENT=1, STREAM_K=1, **cfg)
    for m, n, kk in GPU_SHAPES:
        a = torch.randn(m, kk, device="cuda").half()
        b = torch.randn(kk, n, device="cuda").half()
        want = a.float() @ b.float()
        c = guarded((m, n), "f16")
        for _ in range(3):
            c.view.zero_()
            k(a, b, c.view)
            torch.cuda.synchronize()
            c.check()
            err = ((c.view.float() - want).norm() / want.norm()).item()
            assert err < 2e-3, (m, n, kk, err)


def _slot_size_kernels():
    """Two stream-K gemms whose workspace slots differ: 128x256 (128 KiB) and 128x128 (64 KiB)."""
    return (tilec.compile(GEMM, PERSISTENT=1, STREAM_K=1, BM=128, BN=256, STAGES=3, PRODUCER=1),
            tilec.compile(GEMM, PERSISTENT=1, STREAM_K=1, BM=128, BN=128, STAGES=4, PRODUCER=1))


def _sk_gemm_checked(torch, k, a, b, want):
    """k(a, b) into a guarded output: its margin intact, the result near `want`."""
    c = guarded((a.shape[0], b.shape[1]), "f16")
    k(a, b, c.view)
    torch.cuda.synchronize()
    c.check()
    assert ((c.view.float() - want).norm() / want.norm()).item() < 2e-3


@pytest.mark.gpu
def test_kernels_of_different_slot_sizes_share_a_stream_workspace():
    """128x256 (128 KiB slots) then 128x128 (64 KiB slots) on one stream's workspace
    and back: the flags sit at the same place for both, never in the other's slots."""
    torch = _torch()
    big, small = _slot_size_kernels()
    a = torch.randn(4096, 4096, device="cuda").half()
    b = torch.randn(4096, 4096, device="cuda").half()
    want = a.float() @ b.float()
    for k in (big, small, big, small):
        _sk_gemm_checked(torch, k, a, b, want)


@pytest.mark.gpu
def test_stream_k_launch_captured_in_a_cuda_graph():
    """Warmed up on the default stream, then captured on torch's capture stream,
    whose workspace does not exist yet: it is made outside the capture (which
    refuses cuMemAlloc in global mode), and the graph replays right, as does an
    eager call after it."""
    torch = _torch()
    k = tilec.compile(GEMM, PERSISTENT=1, STREAM_K=1, BM=128, BN=128, STAGES=4, PRODUCER=1)
    a = torch.randn(1000, 640, device="cuda").half()
    b = torch.randn(640, 3000, device="cuda").half()
    c = guarded((1000, 3000), "f16")
    k(a, b, c.view)                                   # the warm-up call
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        k(a, b, c.view)
    for _ in range(3):
        a.copy_(torch.randn_like(a))
        want = a.float() @ b.float()
        c.view.zero_()
        graph.replay()
        torch.cuda.synchronize()
        c.check()
        assert ((c.view.float() - want).norm() / want.norm()).item() < 2e-3
    c.view.zero_()
    k(a, b, c.view)
    torch.cuda.synchronize()
    c.check()
    assert ((c.view.float() - want).norm() / want.norm()).item() < 2e-3


def _stream_workspace(stream):
    from tilec.runtime import host
    found = [buf for (_, handle), buf in host._WORKSPACES.items() if handle == stream.cuda_stream]
    assert len(found) == 1
    return found[0]


class _FakeDriver:
    """The driver calls host.workspace makes, recorded: allocations count up from 0x1000,
    `capturing` says whether the stream is in a capture."""

    def __init__(self, monkeypatch):
        from cuda.bindings import driver as cu
        from tilec.runtime import driver, host
        self.cu, self.capturing, self.calls, self.next = cu, False, [], 0x1000
        ok = cu.CUresult.CUDA_SUCCESS
        status = cu.CUstreamCaptureStatus

        def alloc(nbytes, *stream):
            self.calls.append(("alloc", nbytes) + (("async",) if stream else ()))
            self.next += 0x1000
            return ok, self.next
        monkeypatch.setattr(cu, "cuStreamIsCapturing", lambda stream: (
            ok, status.CU_STREAM_CAPTURE_STATUS_ACTIVE if self.capturing else status.CU_STREAM_CAPTURE_STATUS_NONE))
        monkeypatch.setattr(cu, "cuMemAllocAsync", alloc)
        monkeypatch.setattr(cu, "cuMemAlloc", alloc)
        monkeypatch.setattr(cu, "cuMemsetD8Async", lambda ptr, v, n, stream: (self.calls.append(("zero", ptr)), ok)[1])
        monkeypatch.setattr(cu, "cuMemFreeAsync", lambda ptr, stream: (self.calls.append(("free", ptr)), ok)[1])
        monkeypatch.setattr(cu, "cuThreadExchangeStreamCaptureMode", lambda mode: (ok, mode))
        monkeypatch.setattr(cu, "cuStreamCreate", lambda flags: (ok, 7))
        monkeypatch.setattr(cu, "cuStreamSynchronize", lambda stream: (ok,))
        monkeypatch.setattr(cu, "cuStreamDestroy", lambda stream: (ok,))
        monkeypatch.setattr(driver, "make_current", lambda device: None)
        monkeypatch.setattr(host, "_WORKSPACES", {})
        monkeypatch.setattr(host, "_RETIRED", [])


def test_workspaces_grow_free_the_outgrown_and_keep_what_a_graph_uses(monkeypatch):
    """host.workspace against a recording driver: a stream's workspace is reused while
    it is large enough; a larger need allocates and zeroes a new one in stream order and
    frees the old one on the stream; one a capture used, or made during a capture, is
    kept (never freed), and no free is issued while the stream is capturing."""
    from tilec.runtime import host
    fake = _FakeDriver(monkeypatch)
    first = host.workspace(0, 5, 100)
    assert host.workspace(0, 5, 80) == first and fake.calls == [("alloc", 100, "async"), ("zero", first)]
    grown = host.workspace(0, 5, 200)
    assert fake.calls[2:] == [("alloc", 200, "async"), ("zero", grown), ("free", first)]
    assert host.workspace(0, 6, 50) not in (first, grown)          # another stream: its own
    fake.calls.clear()
    fake.capturing = True
    assert host.workspace(0, 5, 150) == grown and fake.calls == []  # a graph now points at it
    fake.capturing = False
    bigger = host.workspace(0, 5, 300)
    assert ("free", grown) not in fake.calls and host._RETIRED[-1].ptr == grown
    fake.capturing = True
    during = host.workspace(0, 5, 400)                              # made beside the capture
    assert not [c for c in fake.calls if c[0] == "free"] and host._RETIRED[-1].ptr == bigger
    fake.capturing = False
    host.workspace(0, 5, 500)
    assert ("free", during) not in fake.calls and host._RETIRED[-1].ptr == during


@pytest.mark.gpu
def test_an_outgrown_workspace_is_freed_and_a_captured_one_kept():
    """On a stream of its own: 64 KiB slots, then 128 KiB slots outgrow the
    workspace, and the old one is freed on the stream (not kept); on another
    stream a graph captured with the stream's workspace keeps it when a larger
    launch outgrows it there, and replays right afterwards."""
    from tilec.runtime import host
    torch = _torch()
    big, small = _slot_size_kernels()
    a = torch.randn(1000, 640, device="cuda").half()
    b = torch.randn(640, 3000, device="cuda").half()
    want = a.float() @ b.float()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        _sk_gemm_checked(torch, small, a, b, want)
        first = _stream_workspace(s)
        _sk_gemm_checked(torch, big, a, b, want)
        grown = _stream_workspace(s)
        assert grown.nbytes > first.nbytes and first not in host._RETIRED and not grown.captured
        _sk_gemm_checked(torch, small, a, b, want)
        assert _stream_workspace(s) is grown
    s2 = torch.cuda.Stream()
    c = guarded((1000, 3000), "f16")
    with torch.cuda.stream(s2):
        small(a, b, c.view)                         # the warm-up call a capture needs
        torch.cuda.synchronize()
        c.check()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s2):
            small(a, b, c.view)
        kept = _stream_workspace(s2)
        assert kept.captured
        _sk_gemm_checked(torch, big, a, b, want)
        assert kept in host._RETIRED and _stream_workspace(s2) is not kept
    c.view.zero_()
    graph.replay()
    torch.cuda.synchronize()
    c.check()
    assert ((c.view.float() - want).norm() / want.norm()).item() < 2e-3


SELECT = """
kernel sel(A: f32[N], B: f32[N]) {
    grid (bx) = (select(N > 256, cdiv(N, 256), 1));
    threads 128;
    shared s: f32[256];
    copy(A[bx * 256], s);
    parallel (i) in (256) {
        s[i] = select(s[i] > 0.0, s[i], 0.5 * s[i]);
    }
    copy(s, B[bx * 256]);
}
"""


@pytest.mark.parametrize("n", [256, 512, 768])
def test_select_in_grids_and_elements(n):
    """select(c, a, b), the stream-K schedule's C `?:`, is the language's too:
    in a grid size (the host wrapper's Python) and per element (interpreter)."""
    k = tilec.compile(SELECT, backend="interpret")
    a = np.linspace(-1, 1, n).astype(np.float32)
    b = guarded((n,), "f32", like="numpy")
    k(a, b.view)
    b.check()
    np.testing.assert_array_equal(b.view, np.where(a > 0, a, np.float32(0.5) * a))
    cu = tilec.compile(SELECT, arch="sm_90a")
    assert "s[i] = (s[i] > 0.0f ? s[i] : 0.5f * s[i]);" in cu.cuda_source
    assert "tl_grid = ((tl_rt.cdiv(N, 256) if N > 256 else 1), 1, 1)" in cu.host_source


def test_a_ring_too_big_is_refused_before_the_barrier_passes(monkeypatch):
    """gemm.tile's 128x256 tile on 8 stages needs 384 KB: check-smem refuses it, with
    plan-smem's message at the largest tile's line, before insert-barriers and
    check-barriers (seconds for a deep producer ring) run."""
    from tilec.passes import check_barriers, insert_barriers

    def never(k, opts):
        raise AssertionError("the barrier passes ran for a kernel whose tiles cannot fit")
    monkeypatch.setattr(insert_barriers, "run", never)
    monkeypatch.setattr(check_barriers, "run", never)
    line = next(i for i, text in enumerate(GEMM.splitlines(), 1) if text.strip().startswith("shared b"))
    msg = error(GEMM, BM=128, BN=256, STAGES=8, PRODUCER=1, PERSISTENT=1, STREAM_K=1)
    assert msg.splitlines()[0] == (f"<string>:{line}:5: error: shared tiles need 393216 bytes, 1024 more to align "
                                   "swizzled tiles; a Hopper block has at most 232448 bytes of shared memory")
