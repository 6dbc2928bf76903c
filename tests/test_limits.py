"""Programs whose tiles cannot fit are rejected with their line, before later
passes would expand them (found by the fuzz test: a K tile of 2^31 made
plan-tma build one TMA load per 128-byte chunk, and a barrier's expect-tx over
2^20 - 1 bytes reached the IR verifier)."""
import pytest

from tilec import SemanticError
from tilec.compiler import lower
from tilec.errors import Source
from conftest import ROOT

GEMM = (ROOT / "examples/gemm.tile").read_text()


def error(text, **consts):
    with pytest.raises(SemanticError) as e:
        lower(Source("t.tile", text), consts)
    return e.value.render()


def test_a_shared_tile_larger_than_shared_memory():
    msg = error(GEMM, BK=2**31)
    assert msg.startswith("t.tile:10:5: error: shared tile 'a' is 549755813888 bytes; a Hopper block has at most "
                          "232448 bytes of shared memory")


def test_a_local_tile_larger_than_the_registers():
    text = """
kernel regs(A: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    local r: f32[512, 512];
    fill(r, 0);
}"""
    assert error(text).startswith("t.tile:5:5: error: local tile 'r' puts 2048 elements in each of the 128 "
                                  "threads, whose registers hold at most 255: use a shared tile, a smaller tile or "
                                  "more threads")


@pytest.mark.parametrize("threads, fits", [(128, True), (96, False), (32, False)])
def test_a_local_tile_fits_a_threads_registers_or_is_refused(threads, fits):
    """255 elements a thread at most (an f32[128, 256] tile on 32 threads, 1024 a thread,
    spilled to local memory, took NVRTC 200 s before)."""
    text = f"""
kernel regs(A: f32[M, N]) {{
    grid (bx) = (1);
    threads {threads};
    local r: f32[128, 255];
    fill(r, 0);
}}"""
    if fits:
        lower(Source("t.tile", text), {})
    else:
        assert "whose registers hold at most 255" in error(text)


def test_loads_on_one_barrier_over_the_transaction_count():
    tiles = "\n".join(f"    shared s{i}: f32[224, 256];" for i in range(5))
    loads = "\n".join(f"    copy(A[{224 * i}, 0], s{i});" for i in range(5))
    stores = "\n".join(f"    copy(s{i}, B[{224 * i}, 0]);" for i in range(5))
    text = f"""
kernel big(A: f32[M, N], B: f32[M, N]) {{
    grid (bx) = (1);
    threads 128;
{tiles}
{loads}
{stores}
}}"""
    # shared memory (227 KB) runs out long before an mbarrier's transaction count (1 MB):
    # check-smem refuses the tiles first, before insert-barriers adds up their bytes
    assert error(text).startswith("t.tile:5:5: error: shared tiles need 1146880 bytes; a Hopper block has at most "
                                  "232448 bytes of shared memory")
    from tilec.ir import nodes as ir
    from tilec.passes import insert_barriers
    loads = [ir.TmaLoad("A", f"s{i}", (), bytes=224 * 256 * 4) for i in range(5)]
    with pytest.raises(SemanticError, match="these TMA loads bring 1146880 bytes to one mbarrier, whose "
                                                  "transaction count holds at most 1048575"):
        insert_barriers._expect_tx(loads)


def test_tiles_beside_their_mbarriers_static_bytes():
    """The driver counts a kernel's mbarriers as static shared memory in steps of 1024
    bytes (the dynamic base's alignment; measured on the H200): 231424 bytes of tiles
    fit beside one mbarrier in a Hopper block's 232448, and 128 bytes more do not,
    which the message explains (before, such tiles compiled and their launch failed)."""
    text = """
kernel edge(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[226, 256];
    shared u: f32[1, 32];
    copy(A[0, 0], s);
    copy(A[0, 0], u);
    copy(s, B[0, 0]);
    copy(u, B[0, 0]);
}"""
    alone = text.replace("    shared u: f32[1, 32];\n", "").replace("    copy(A[0, 0], u);\n", "").replace(
        "    copy(u, B[0, 0]);\n", "")
    assert "dynamic_smem 231424 bytes" in lower(alone).ir_text("plan-smem")
    assert error(text).startswith("t.tile:5:5: error: shared tiles need 231552 bytes, and 1024 more for 1 mbarrier "
                                  "(static shared memory counts in 1024-byte steps); a Hopper block has at most "
                                  "232448 bytes of shared memory")


@pytest.mark.parametrize("loop, trips", [("range(9223372036854775807)", 9223372036854775807),
                                         ("range(3, 9223372036854775807, 2)", 4611686018427387902)])
def test_a_loop_of_more_trips_than_an_int_holds(loop, trips):
    """The kernel counts trips in an int: a longer loop would never end (it compiled)."""
    text = f"""
kernel t(X: f32[64], Y: f32[64]) {{
    grid (bx) = (1);
    threads 64;
    shared s: f32[64];
    copy(X, s);
    for t in {loop} {{
        parallel (i) in (64) {{ s[i] = s[i] + 1.0; }}
    }}
    copy(s, Y);
}}"""
    assert error(text).splitlines()[0] == (f"t.tile:7:5: error: this loop runs {trips} trips; a loop's trip count is a "
                                           "32-bit int in the kernel (at most 2147483647)")
