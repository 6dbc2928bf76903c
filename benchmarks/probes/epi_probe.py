"""Same-process probe: where do the last % of the 128x256/4 producer persistent gemm go?
Variants are CUDA text patches of the emitted kernel (consumer branch rewritten)."""
import os, re, sys
os.environ["TILEC_CACHE"] = "0"
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tilec
try:
    import torch
    from common import rewrite_cuda, rounds
except ImportError:         # on a machine without torch: rewrite() alone, to compile its variants
    torch = None
else:
    PATCH = rewrite_cuda()

SRC = open("examples/gemm.tile").read()

def consumer_head(text):
    i = text.index("  } else {  // the 256 consumer threads")
    return text[:i]

LETS_RE = re.compile(r"(      const int tl_t = .*?const int bx = [^\n]*\n)", re.S)

def rewrite(text, mode):
    """mode: 'none' (no epilogue), 'deferred' (smem+TMA store of the previous tile inside k == 0),
    'direct' (st.global from registers, deferred), 'direct_now' (st.global at the end of the tile)."""
    head = consumer_head(text)
    lets = LETS_RE.search(text[len(head):]).group(1)
    ty = "bf16_t" if "bf16_t* __restrict__ C" in text else "f16_t"
    pack = "tl_pack_f16x2" if ty == "f16_t" else "tl_pack_bf16x2"
    loop_hdr = "    for (int tl_tile = 0; tl_tile < tl_cdiv(static_cast<long long>(tl_cdiv(N, 256)) * tl_cdiv(M, 128) - tl_block, tl_blocks); ++tl_tile) {\n"
    m = re.search(r"        wgmma_fence\(\);\n(.*?)        wgmma_commit_group\(\);\n", text, re.S)
    mmas = m.group(1)
    def smem_epi(bx, by):
        out = []
        for c in range(4):
            out.append(f"""
          if (threadIdx.x == 0) bulk_wait_group_read<1>();
          consumers_sync<256>();
          #pragma unroll
          for (int tl_r = {32*c}; tl_r < {32*c+32}; tl_r += 2) {{
            const int tl_i0 = (threadIdx.x / 128) * 64 + (threadIdx.x % 128) / 32 * 16 + (threadIdx.x % 32) / 4 + (tl_r % 4) / 2 * 8;
            const int tl_i1 = (tl_r % 128) / 4 * 8 + (threadIdx.x % 4) * 2 - {64*c};
            *reinterpret_cast<unsigned*>(&tl_acc_out{c%2}[tl_sw128(tl_i0, tl_i1, 128, 64)]) = tl_packed[tl_r / 2];
          }}
          fence_proxy_async_shared();
          consumers_sync<256>();
          if (threadIdx.x == 0) {{ tma_store_2d(&tl_tmap_C, tl_acc_out{c%2}, {bx} * 256 + {64*c}, {by} * 128); bulk_commit_group(); }}
""")
        return "".join(out)
    def direct_epi(bx, by):
        return f"""
          #pragma unroll
          for (int tl_r = 0; tl_r < 128; tl_r += 2) {{
            const int tl_i0 = (threadIdx.x / 128) * 64 + (threadIdx.x % 128) / 32 * 16 + (threadIdx.x % 32) / 4 + (tl_r % 4) / 2 * 8;
            const int tl_i1 = (tl_r % 128) / 4 * 8 + (threadIdx.x % 4) * 2;
            *reinterpret_cast<unsigned*>(&C[static_cast<long long>({by} * 128 + tl_i0) * N + {bx} * 256 + tl_i1]) = tl_packed[tl_r / 2];
          }}
"""
    epi = {"none": lambda bx, by: "", "deferred": smem_epi, "direct": direct_epi, "direct_now": direct_epi}[mode]
    deferred = mode in ("deferred", "direct")
    body = f"""  }} else {{  // the 256 consumer threads (probe: {mode})
    setmaxnreg_inc<232>();
    unsigned tl_packed[64];
    int tl_prev_bx = -1, tl_prev_by = 0;
{loop_hdr}{lets}      #pragma unroll
      for (int tl_r = 0; tl_r < 128; ++tl_r) acc[tl_r] = 0;
      wgmma_fence_operand(acc);
      for (int k = 0; k < tl_cdiv(K, 64); ++k) {{
        mbarrier_wait(&tl_full0[(tl_full0_base + k) % 4], (tl_full0_base + k) / 4 % 2);
        wgmma_fence();
{mmas}        wgmma_commit_group();
        {"if (k == 0 && tl_prev_bx >= 0) {" + epi("tl_prev_bx", "tl_prev_by") + "        }" if deferred else ""}
        wgmma_wait_group<1>();
        if (k >= 1) {{
          if (threadIdx.x % 128 == 0) mbarrier_arrive(&tl_empty1[(tl_full0_base + k - 1) % 4]);
        }}
      }}
      wgmma_wait_group<0>();
      wgmma_fence_operand(acc);
      if (tl_cdiv(K, 64) >= 1) {{
        if (threadIdx.x % 128 == 0) mbarrier_arrive(&tl_empty1[(tl_full0_base + tl_cdiv(K, 64) - 1) % 4]);
      }}
      tl_full0_base += tl_cdiv(K, 64);
      #pragma unroll
      for (int tl_r = 0; tl_r < 128; tl_r += 2) tl_packed[tl_r / 2] = {pack}(acc[tl_r], acc[tl_r + 1]);
      {"" if deferred else "{" + epi("bx", "by") + "}"}
      tl_prev_bx = bx; tl_prev_by = by;
    }}
    {"if (tl_prev_bx >= 0) {" + epi("tl_prev_bx", "tl_prev_by") + "}" if deferred else ""}
    if (threadIdx.x == 0) bulk_wait_group_read<0>();
  }}
}}
"""
    return head + body

def run(size, dtype, modes, n_rounds=7, reps=5):
    M = N = K = size
    a = torch.randn(M, K, device="cuda", dtype=dtype); b = torch.randn(K, N, device="cuda", dtype=dtype)
    ref = a.float() @ b.float()
    fns = {"cublas": lambda: torch.matmul(a, b)}
    for mode in modes:
        PATCH["fn"] = None if mode == "base" else (lambda t, m=mode: rewrite(t, m))
        src = SRC.replace("f16", "bf16") if dtype == torch.bfloat16 else SRC
        k = tilec.compile(f"// probe {mode}\n" + src, tune=False, BN=256, STAGES=4, PERSISTENT=1, PRODUCER=1)
        from cuda.bindings import driver as cu
        f = k._module(0).function
        regs = cu.cuFuncGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, f)[1]
        lmem = cu.cuFuncGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f)[1]
        big = torch.full((M + 2, N + 16), 7.0, device="cuda", dtype=dtype)
        c = big[1:M + 1, 8:N + 8]
        k(a, b, c); torch.cuda.synchronize()
        err = (c.float() - ref).abs().max().item() if mode != "none" else float("nan")
        margin_ok = bool((big[0] == 7).all() and (big[-1] == 7).all() and (big[:, :8] == 7).all() and (big[:, -8:] == 7).all())
        print(f"{size} {dtype} {mode}: regs {regs} lmem {lmem} maxerr {err:.3g} margin_ok {margin_ok} log {k.compile_log[:300]!r}", flush=True)
        fns[mode] = (lambda k=k, c=c: k(a, b, c))
    med = rounds(fns, n=n_rounds, reps=reps)
    for m in fns:
        print(f"  {size} {str(dtype)[6:]} {m:12s} {med[m]*1e3:8.1f} us  vs cuBLAS {med['cublas']/med[m]:.3f}", flush=True)

if torch is None: raise SystemExit
modes = sys.argv[1].split(",") if len(sys.argv) > 1 else ["base", "none", "deferred", "direct", "direct_now"]
for size in (4096, 8192):
    for dtype in (torch.float16, torch.bfloat16):
        run(size, dtype, modes)
