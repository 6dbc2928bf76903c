"""Same process: conv 128x128 producer persistent, S = 4 and 5: as emitted ([a0..aS-1][b0..bS-1]),
B shifted by 16 KiB, and stages interleaved ([a0 b0][a1 b1]...)."""
import os, re, sys
src = open(os.path.join(os.path.dirname(__file__), "l1_probe.py")).read().split("CONV = [")[0]
exec(compile(src, "l1_probe", "exec"))

def shift_b(text):
    m = re.search(r"reinterpret_cast<f16_t\*>\(tl_smem \+ (\d+)\);  // shared b:", text)
    return text.replace(m.group(0), m.group(0).replace(m.group(1), str(int(m.group(1)) + 16384)))

def interleave(text):
    m = re.search(r"reinterpret_cast<f16_t\*>\(tl_smem \+ (\d+)\);  // shared b:", text)
    text = text.replace(m.group(0), m.group(0).replace(m.group(1), "16384"))
    text = re.sub(r"% (\d)\) \* 16384", r"% \1) * 32768", text)
    text = re.sub(r"% (\d) \* 16384", r"% \1 * 32768", text)
    return text

VARIANTS.update({"+shiftB": shift_b, "+il": interleave})
CONV = [(4, ""), (4, "+il"), (5, ""), (5, "+il"), (3, ""), (3, "+il")]
conv(28, 128, 1, CONV)
conv(56, 128, 2, CONV)
