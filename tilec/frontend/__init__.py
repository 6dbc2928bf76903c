"""Frontend: .tile text -> IR `Kernel` with source spans."""
from __future__ import annotations

from ..errors import Source
from ..ir.nodes import Expr, Kernel
from .build import build_ir, check_tune_condition, declared_names
from .parse import parse_tree


def parse(source: Source) -> Kernel:
    return build_ir(parse_tree(source), source)


def parse_condition(text: str, kernel: Kernel) -> Expr:
    """tilec.compile's where= (a tune condition, as after a tune statement's
    `where`) as IR, checked against `kernel` as that clause is; its errors point
    into the text, named `where=`."""
    source = Source("where=", text)
    cond = build_ir(parse_tree(source, start="expr"), source)
    check_tune_condition(cond, declared_names(kernel), kernel.params)
    return cond
