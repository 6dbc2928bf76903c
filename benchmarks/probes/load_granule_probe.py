"""Does a tiled TMA load zero-fill past the end of a row that ends inside a 16-byte granule,
or read the rest of the granule from memory (as TMA stores write whole granules,
tma-reference.md §6)? Session 22's random-program hunts suggest the latter: most of their
GPU-vs-interpreter disagreements read a loaded tile past the end of such a row of a padded
view. This loads [8, 16] f32 / [8, 64] i8 tiles from X = buf[:, :n] (buf's padding
filled with a sentinel, its row pitch 16-byte aligned, so TMA takes it) and stores each
whole tile into an aligned output of the tile's width; elements past n must be 0.

    python benchmarks/probes/load_granule_probe.py      (H100; prints one line per case)"""
import torch

import tilec

SRC = """
kernel probe(X: {dt}[M, N], Y: {dt}[M, W]) {{
    grid (by) = (cdiv(M, 8));
    threads 128;
    shared s: {dt}[8, {w}];
    copy(X[by * 8, 0], s);
    copy(s, Y[by * 8, 0]);
}}
"""
CASES = [("f32", torch.float32, 16, (1, 2, 3, 5, 13)), ("i8", torch.int8, 64, (1, 7, 15, 17, 35, 63))]

for dt, tdt, w, ns in CASES:
    k = tilec.compile(SRC.format(dt=dt, w=w), fallback=False)
    for n in ns:
        pitch = w * 2
        buf = torch.full((8, pitch), 77, dtype=tdt, device="cuda")
        buf[:, :n] = 1
        x = buf[:, :n]
        y = torch.full((8, w), -1, dtype=tdt, device="cuda")
        try:
            k(x, y)
            torch.cuda.synchronize()
        except tilec.TmaRuleError as e:
            print(f"{dt} n={n}: TMA refused ({e})")
            continue
        past = y[:, n:]
        print(f"{dt} n={n} (row {n * x.element_size()} bytes): past the row end "
              f"{'zeros' if bool((past == 0).all()) else 'NOT zeros: ' + str(past[0].tolist())}", flush=True)
