"""Source -> IR after every pass. The one place that runs the pipeline."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .errors import Source, TilecError
from .frontend import parse
from .ir import nodes as ir
from .ir.printer import kernel as print_kernel
from .ir.verify import verify
from .passes import PASS_NAMES, PIPELINE, Options


def load_source(src) -> Source:
    """A path to a .tile file, or the program text itself."""
    if isinstance(src, Source):
        return src
    if isinstance(src, os.PathLike) or (isinstance(src, str) and "\n" not in src and src.endswith(".tile")):
        path = Path(src)
        try:
            return Source(str(src), path.read_text())
        except OSError as e:
            raise TilecError(f"cannot read {src}: {e.strerror}") from None
    return Source("<string>", str(src))


@dataclass
class Lowered:
    source: Source
    consts: dict
    stages: dict            # pass name -> Kernel after that pass

    @property
    def kernel(self) -> ir.Kernel:
        return self.stages[PASS_NAMES[-1]]

    def ir_text(self, after: str) -> str:
        if after not in self.stages:
            raise TilecError(f"no pass named '{after}'; passes: {', '.join(PASS_NAMES)}")
        return print_kernel(self.stages[after])


def lower(src, consts: dict | None = None, tma: bool = True) -> Lowered:
    source = load_source(src)
    consts = dict(consts or {})
    opts = Options(consts, tma, int(os.environ.get("TILEC_TEST_EXPECT_TX_SKEW", "0")))
    k = parse(source)
    stages = {"parse": k}
    verify(k, "parse")
    for p in PIPELINE:
        k = p.run(k, opts)
        verify(k, p.NAME)
        stages[p.NAME] = k
    return Lowered(source, consts, stages)
