"""Frontend: .tile text -> IR `Kernel` with source spans."""
from __future__ import annotations

from ..errors import Source
from ..ir.nodes import Kernel
from .build import build_ir
from .parse import parse_tree


def parse(source: Source) -> Kernel:
    return build_ir(parse_tree(source), source)
