"""Same process: conv 128x128 producer persistent, 3 / 4 / 5 stages: as emitted ([a0..aS-1][b0..bS-1])
and with the stages interleaved ([a0 b0][a1 b1]...)."""
import os, re, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from l1_probe import VARIANTS, conv


def interleave(text):
    m = re.search(r"reinterpret_cast<f16_t\*>\(tl_smem \+ (\d+)\);  // shared b:", text)
    text = text.replace(m.group(0), m.group(0).replace(m.group(1), "16384"))
    text = re.sub(r"% (\d)\) \* 16384", r"% \1) * 32768", text)
    text = re.sub(r"% (\d) \* 16384", r"% \1 * 32768", text)
    return text


VARIANTS["+il"] = interleave
CONV = [(4, ""), (4, "+il"), (5, ""), (5, "+il"), (3, ""), (3, "+il")]
conv(28, 128, 1, CONV)
conv(56, 128, 2, CONV)
