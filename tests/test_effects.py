"""tilec/ir/effects.py: every statement type says what it reads and writes, and
a statement type that does not is refused loudly, not skipped."""
import inspect
from dataclasses import dataclass, replace
from typing import Optional

import pytest

from tilec.compiler import lower
from tilec.ir import effects
from tilec.ir import nodes as ir
from tilec.passes import Options, check_barriers, insert_barriers
from conftest import ROOT


@dataclass(frozen=True)
class Shuffle(ir.Stmt):
    """A new op someone added to the IR and forgot to give effects."""
    buffer: str
    span: Optional[object] = None


def test_every_statement_type_has_an_effects_rule():
    stmts = [c for _, c in inspect.getmembers(ir, inspect.isclass) if issubclass(c, ir.Stmt) and c is not ir.Stmt]
    assert len(stmts) > 20
    k = lower(str(ROOT / "examples" / "copy2d.tile")).kernel
    for cls in stmts:
        assert cls in effects._RULES, f"{cls.__name__} has no effects rule"
    with pytest.raises(TypeError, match="statement type Shuffle has no effects rule: register what it reads and "
                                        r"writes in tilec/ir/effects.py"):
        effects.of(k, Shuffle("s"))


def test_a_statement_without_effects_stops_the_barrier_passes():
    """A new op that reads a shared tile would otherwise get no barrier and pass the checker."""
    lw = lower(str(ROOT / "examples" / "scale.tile"))
    before = lw.stages["plan-tma"]
    k = replace(before, body=before.body[:1] + (Shuffle("s"),) + before.body[1:])
    with pytest.raises(TypeError, match="Shuffle has no effects rule"):
        insert_barriers.run(k, Options())
    after = lw.stages["insert-barriers"]
    k = replace(after, body=after.body + (Shuffle("s"),))
    with pytest.raises(TypeError, match="Shuffle has no effects rule"):
        check_barriers.run(k, Options())


def test_effects_of_the_scale_example():
    k = lower(str(ROOT / "examples" / "scale.tile")).kernel
    loads = [s for s in ir.walk_stmts(k.body) if isinstance(s, ir.TmaLoad)]
    par = next(s for s in k.body if isinstance(s, ir.Parallel))
    assert effects.of(k, loads[0]).reads == {"X"} and effects.of(k, loads[0]).writes == {"s"}
    assert effects.of(k, loads[0]).barrier == "complete"
    assert effects.of(k, par).reads == set() and effects.deep(k, par).reads == {"s"}
    assert effects.shared_accesses(k, par) == ({"s"}, {"s"})
    assert effects.written_tensors(k) == ("Y",)
    assert effects.names_used(k, k.body, "scalar") == {"alpha"}
