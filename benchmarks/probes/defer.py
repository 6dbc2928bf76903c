"""Text rewrite of an emitted persistent producer kernel: the epilogue of tile i is run inside
tile i+1's first K step, after its wgmmas are issued (accumulator packed to registers first)."""
import re

def deferred(text):
    i = text.index("  } else {  // the ")
    head, cons = text[:i], text[i:]
    nacc = int(re.search(r"float acc\[(\d+)\];", text).group(1))
    m = re.search(r"      tl_full0_base \+= [^\n]*\n", cons)
    end_mark = "\n    }\n    if (threadIdx.x == 0) {\n      bulk_wait_group_read<0>();"
    e = cons.index(end_mark)
    epi = cons[m.end():e + 1]
    pack = re.search(r"(tl_pack_\w+)\(acc\[tl_r\], acc\[tl_r \+ 1\]\)", epi).group(1)
    lets = "const int bx = " in cons
    ep = re.sub(re.escape(pack) + r"\(acc\[tl_r\], acc\[tl_r \+ 1\]\)", "tl_packed[tl_r / 2]", epi)
    ep = re.sub(r"\btl_tile\b", "tl_prev_tile", ep)
    if lets:
        ep = re.sub(r"\bbx\b", "tl_prev_bx", ep)
        ep = re.sub(r"\bby\b", "tl_prev_by", ep)
    capture = (f"      #pragma unroll\n      for (int tl_r = 0; tl_r < {nacc}; tl_r += 2) tl_packed[tl_r / 2] = {pack}(acc[tl_r], acc[tl_r + 1]);\n"
               f"      tl_prev_tile = tl_tile;" + (" tl_prev_bx = bx; tl_prev_by = by;" if lets else "") + "\n")
    new = cons[:m.end()] + capture + cons[e:]
    s = re.search(r"    setmaxnreg_inc<\d+>\(\);\n", new)
    new = new[:s.end()] + f"    unsigned tl_packed[{nacc // 2}];\n    int tl_prev_tile = -1, tl_prev_bx = 0, tl_prev_by = 0;\n" + new[s.end():]
    c = new.index("        wgmma_commit_group();\n") + len("        wgmma_commit_group();\n")
    new = new[:c] + "        if (k == 0 && tl_prev_tile >= 0) {  // the previous tile's epilogue, under this tile's first wgmmas\n" + ep + "        }\n" + new[c:]
    e = new.index(end_mark) + len("\n    }\n")
    new = new[:e] + "    if (tl_prev_tile >= 0) {\n" + ep + "    }\n" + new[e:]
    return head + new
