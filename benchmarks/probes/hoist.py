"""Text patch: the producer's K loop of an im2col conv (conv2d.tile, PRODUCER = 1) without
per-step divisions. In the emitted loop nvcc recomputes, every K step, the tile's im2col
coordinates (divisions by the output width and height and by cdiv(F, BN), runtime values)
and the tap and channel offsets (k * BK % C, k * BK / C % KW, / KW % KH); this computes the
tile's coordinates once before the K loop and steps the channel offset and the tap (kx, ky)
by increments (needs C % BK == 0, as the probed layers have)."""
import re


def split_args(s):
    """Top-level comma-separated pieces of `s`."""
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch == "," and depth == 0:
            out.append(cur.strip()); cur = ""
            continue
        depth += (ch in "([") - (ch in ")]")
        cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def hoist(text, bk=64):
    if "tl_fastmod(k * " in text:
        raise ValueError("the producer's refills are hoisted by codegen since 204a8d2: run this probe at 4f0c2d8 "
                         "to compare with the emitted loop it was written against")
    start = text.index("if (threadIdx.x == 256) {")
    loop = text.index("        for (int k = 0; k < ", start)
    end = text.index("        tl_full0_base += ", loop)
    body = text[loop:end]
    m = re.search(r"tma_load_im2col_4d\((.*?)\);\n", body, re.S)
    args = split_args(m.group(1))
    ch, c1, c2, c3, kx, ky = args[3:9]
    assert ch == f"int(k * {bk} % C)", ch
    kw = int(re.fullmatch(rf"\(unsigned short\)\(k \* {bk} / C % (\d+)\)", kx).group(1))
    kh = int(re.fullmatch(rf"\(unsigned short\)\(k \* {bk} / C / {kw} % (\d+)\)", ky).group(1))
    new_args = args[:3] + ["tl_ch", "tl_h1", "tl_h2", "tl_h3", "(unsigned short)tl_kx", "(unsigned short)tl_ky"]
    new_body = body.replace(m.group(1), ", ".join(new_args))
    bx = re.findall(r"tma_load_2d\(reinterpret_cast<unsigned char\*>\(b\)[^;]*?, (\(tl_block[^;]*?\* \d+)(?: \+ \d+)?, k \* \d+\);", body)
    assert bx and len(set(bx)) == 1, bx
    new_body = new_body.replace(bx[0], "tl_h4")
    close = new_body.rindex("        }\n")
    new_body = (new_body[:close] +
                f"          tl_ch += {bk};\n"
                f"          if (tl_ch == C) {{ tl_ch = 0; if (++tl_kx == {kw}) {{ tl_kx = 0; ++tl_ky; }} }}\n" +
                new_body[close:])
    pre = (f"        const int tl_h1 = {c1}, tl_h2 = {c2}, tl_h3 = {c3};  // the tile's im2col coordinates\n"
           f"        const int tl_h4 = {bx[0]};\n"
           f"        int tl_ch = 0, tl_kx = 0, tl_ky = 0;  // k * {bk} % C, the tap's kx and ky\n")
    return text[:loop] + pre + new_body + text[end:]
