"""Text patch: an n-CTA cluster (__cluster_dims__(n,1,1)) whose CTAs share operand b, for
kernels whose tiles all read the same b (a conv with F == BN: every tile reads all the
weights). Generalises mc.py (n = 2) to n = 2, 4, 8: b's 64-column boxes are loaded by the
first ranks (box j by rank j) with .multicast::cluster to every CTA; each stage's empty
barrier counts the consumers of the whole cluster, and every consumer warpgroup releases a
stage on every CTA's barrier (mapa + remote arrive). A cluster barrier after the barriers'
init; at exit a cluster barrier or a producer tail (`end`). Every CTA of a cluster must run
the same number of tiles (the grid: conv_cluster_probe.py). For a gemm, the CTAs of a
cluster must get tiles with the same bx (gemm_cluster_probe.py)."""
import re

from mc import HELPERS as MC_HELPERS, LOAD   # cluster_rank, cluster_sync_all, tma_load_2d_mc

HELPERS = MC_HELPERS + r'''
__device__ __forceinline__ void mbarrier_arrive_rank(unsigned long long* bar, unsigned r) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(bar)), "r"(r));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive_cluster(unsigned long long* bar) {
  #pragma unroll
  for (unsigned r = 0; r < CLUSTER_N; ++r) mbarrier_arrive_rank(bar, r);
}
'''


def cluster(text, n, multicast=True, lockstep=True, lanes=False, syncs=True, end="sync"):
    """multicast=False: every CTA loads its own b; lockstep=False: each stage released on
    the CTA's own barrier only (no remote arrives; only with multicast=False); lanes: the
    release's n arrives made by n lanes of the warpgroup's first warp (CUTLASS does this),
    not n in turn by its first thread. syncs=False (only with lockstep=False): the
    cluster launch alone, the block's own __syncthreads kept, no cluster barriers.
    end: how a CTA keeps from exiting while peers may still arrive on its barriers or
    multicast into it: "sync" a cluster barrier of all threads at the end, "tail" the
    producer thread waits for every stage's last release (CUTLASS's producer tail), "none"
    nothing (only for lockstep=False)."""
    text = text.replace("extern \"C\" __global__ void __launch_bounds__",
                        f"extern \"C\" __global__ void __cluster_dims__({n}, 1, 1) __launch_bounds__")
    text = text.replace("template <class A, class B> __device__ __forceinline__ auto tl_min",
                        f"#define CLUSTER_N {n}u\n" + HELPERS + "\ntemplate <class A, class B> __device__ __forceinline__ auto tl_min", 1)
    if not syncs:
        assert not lockstep
        return text
    i = text.index("  __syncthreads();\n")
    text = text[:i] + "  cluster_sync_all();\n" + text[i + len("  __syncthreads();\n"):]
    assert text.endswith("  }\n}\n"), text[-30:]
    if end == "sync":
        text = text[:-2] + "  cluster_sync_all();\n}\n"
    elif end == "tail":
        stages = int(re.search(r"mbarrier_init\(&tl_full0\[(\d)\], \d\);\n(?!    mbarrier_init\(&tl_full0)", text).group(1)) + 1
        anchor = "  } else {  // the 256 consumer threads"
        if anchor not in text:
            anchor = "  } else {  // the "
        i = text.index(anchor)
        j = text.rindex("      }\n", 0, i) + len("      }\n")
        tail = (f"      for (int tl_t = 0; tl_t < {stages}; ++tl_t)  // producer tail: every stage's last release\n"
                f"        if (tl_full0_base + tl_t >= {stages}) mbarrier_wait(&tl_empty1[(tl_full0_base + tl_t) % {stages}], "
                f"((tl_full0_base + tl_t) / {stages} - 1) % 2);\n")
        text = text[:j] + tail + text[j:]
    else:
        assert not lockstep
    if not lockstep:
        assert not multicast
        return text
    text = re.sub(r"mbarrier_init\(&tl_empty1\[(\d)\], (\d)\)",
                  lambda m: f"mbarrier_init(&tl_empty1[{m.group(1)}], {n * int(m.group(2))})", text)
    release = (r"if (threadIdx.x % 128 < CLUSTER_N) mbarrier_arrive_rank(\1, threadIdx.x % 128);" if lanes
               else r"if (threadIdx.x % 128 == 0) mbarrier_arrive_cluster(\1);")
    text, c = re.subn(r"if \(threadIdx.x % 128 == 0\) mbarrier_arrive\((&tl_empty1\[[^;]*\])\);", release, text)
    assert c == 2, c
    if not multicast:
        return text
    lines = text.split("\n")
    bl = [j for j, l in enumerate(lines) if "tma_load_2d(reinterpret_cast<unsigned char*>(b)" in l]
    nb = len(bl)
    assert nb in (2, 4) and bl == list(range(bl[0], bl[0] + nb)), bl
    stage, stride, tmap, bar, x = LOAD.search(lines[bl[0]]).groups()
    mask = (1 << n) - 1
    if n >= nb:     # box j from rank j
        new = (f"          if (cluster_rank() < {nb})\n"
               f"            tma_load_2d_mc(reinterpret_cast<unsigned char*>(b) + {stage} * {stride} + cluster_rank() * 8192, &{tmap}, {bar}, {x} + cluster_rank() * 64, k * 64, {mask});")
    else:           # n == 2, nb == 4: boxes 2r, 2r + 1 from rank r
        h = nb // n
        new = (f"          for (unsigned tl_j = {h} * cluster_rank(); tl_j < {h} * cluster_rank() + {h}; ++tl_j)\n"
               f"            tma_load_2d_mc(reinterpret_cast<unsigned char*>(b) + {stage} * {stride} + tl_j * 8192, &{tmap}, {bar}, {x} + tl_j * 64, k * 64, {mask});")
    lines[bl[0]:bl[-1] + 1] = [new]
    return "\n".join(lines)
