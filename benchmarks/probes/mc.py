"""Text patch: a 2-CTA cluster (__cluster_dims__(2,1,1)) whose CTAs (consecutive tile numbers)
share operand b. cluster(text) as measured in NOTES.md session 11: each CTA loads half of b's
64-column boxes and multicasts them to both, and the consumers release each stage on both CTAs'
empty barriers (a remote arrive after mapa). The variants mc_probe.py compares: `multicast=False`
(the cluster launch and its barriers alone), `b_loads="self"` (every CTA loads its whole b, the
remote arrives kept), `peer_release="cluster"` (the remote arrive with .release.cluster)."""
import re

HELPERS = r'''
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r;
}
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}
__device__ __forceinline__ void mbarrier_arrive_peer(unsigned long long* bar) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(bar)), "r"(cluster_rank() ^ 1));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
}
__device__ __forceinline__ void tma_load_2d_mc(void* dst, const CUtensorMap* map, unsigned long long* bar,
                                               int c0, int c1, unsigned short mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4}], [%2], %5;"
      :: "r"(smem_addr(dst)), "l"(map), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "h"(mask) : "memory");
}
'''

LOAD = re.compile(r"tma_load_2d\(reinterpret_cast<unsigned char\*>\(b\) \+ (.*?) \* (\d+), &(tl_tmap_\w+), (&tl_full0\[.*?\]), (.*), k \* 64\);")

def cluster(text, multicast=True, b_loads="split", peer_release="cta"):
    text = text.replace("extern \"C\" __global__ void __launch_bounds__",
                        "extern \"C\" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__")
    text = text.replace("template <class A, class B> __device__ __forceinline__ auto tl_min",
                        HELPERS + "\ntemplate <class A, class B> __device__ __forceinline__ auto tl_min", 1)
    i = text.index("  __syncthreads();\n")
    text = text[:i] + "  cluster_sync_all();\n" + text[i + len("  __syncthreads();\n"):]
    assert text.endswith("  }\n}\n"), text[-30:]
    text = text[:-2] + "  cluster_sync_all();\n}\n"
    if peer_release == "cluster":
        text = text.replace("mbarrier.arrive.shared::cluster.b64", "mbarrier.arrive.release.cluster.shared::cluster.b64")
    if not multicast:
        return text
    text = re.sub(r"mbarrier_init\(&tl_empty1\[(\d)\], (\d)\)",
                  lambda m: f"mbarrier_init(&tl_empty1[{m.group(1)}], {2 * int(m.group(2))})", text)
    text, n = re.subn(r"if \(threadIdx.x % 128 == 0\) mbarrier_arrive\((&tl_empty1\[[^;]*\])\);",
                      r"if (threadIdx.x % 128 == 0) { mbarrier_arrive(\1); mbarrier_arrive_peer(\1); }", text)
    assert n == 2, n
    lines = text.split("\n")
    bl = [j for j, l in enumerate(lines) if "tma_load_2d(reinterpret_cast<unsigned char*>(b)" in l]
    nb = len(bl)
    assert nb in (2, 4), bl
    m = LOAD.search(lines[bl[0]])
    stage, stride, tmap, bar, x = m.groups()
    h = nb // 2
    if b_loads == "self":
        new = (f"          for (unsigned tl_j = 0; tl_j < {nb}; ++tl_j)\n"
               f"            tma_load_2d(reinterpret_cast<unsigned char*>(b) + {stage} * {stride} + tl_j * 8192, &{tmap}, {bar}, {x} + tl_j * 64, k * 64);")
    else:
        new = (f"          for (unsigned tl_j = {h} * cluster_rank(); tl_j < {h} * cluster_rank() + {h}; ++tl_j)\n"
               f"            tma_load_2d_mc(reinterpret_cast<unsigned char*>(b) + {stage} * {stride} + tl_j * 8192, &{tmap}, {bar}, {x} + tl_j * 64, k * 64, 3);")
    lines[bl[0]:bl[-1] + 1] = [new]
    return "\n".join(lines)
