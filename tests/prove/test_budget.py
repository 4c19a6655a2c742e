"""The saturation budget: a search the budget cut short says so, and the budget grows with depth.

The instance: k unary ops over a slice, against the slice of the k ops over the whole input. The
slice climbs one op per iteration (elementwise/unary_lift), so the proof needs about k iterations.
"""

from __future__ import annotations

import pytest
from egglog import EGraph

from equivci.cli import _check_environment
from equivci.errors import EquivciError
from equivci.options import ENV_SATURATION_ITERATIONS, Options
from equivci.prove.saturate import _run, proved_equal, saturate_terms
from equivci.terms.ir import Term, TermTable
from equivci.terms.load import Loader

DEPTH = 12


def chain() -> tuple[Term, Term, Term]:
    table = TermTable()
    x = table.make("param", (0,), (), (8,), "f32")
    lhs = table.make("slice", (0, 0, 4), (x,), (4,), "f32")
    whole = x
    for _ in range(DEPTH):
        lhs = table.make("unary", ("exp",), (lhs,), (4,), "f32")
        whole = table.make("unary", ("exp",), (whole,), (8,), "f32")
    return x, lhs, table.make("slice", (0, 0, 4), (whole,), (4,), "f32")


def loaded(lhs: Term, rhs: Term):
    egraph = EGraph()
    loader = Loader(egraph)
    with loader.bulk():
        a, b = loader.expr(lhs), loader.expr(rhs)
    return egraph, a, b


def test_a_run_cut_short_by_its_budget_says_so() -> None:
    _, lhs, rhs = chain()
    egraph, a, b = loaded(lhs, rhs)
    assert _run(egraph, 3) == 3
    assert not proved_equal(egraph, a, b)


def test_a_run_that_reaches_a_fixed_point_reports_no_budget() -> None:
    _, lhs, rhs = chain()
    egraph, a, b = loaded(lhs, rhs)
    assert _run(egraph, 10 * DEPTH) == 0
    assert proved_equal(egraph, a, b)


def test_the_budget_is_at_least_the_depth_of_the_terms() -> None:
    x, lhs, rhs = chain()
    proof = saturate_terms([x], [x], [[(lhs, rhs)]], [], iterations=1)
    assert proof.loader.depth == DEPTH + 2
    assert proof.all_proved and proof.exhausted == 0


def test_the_budget_setting_is_read_once_and_a_bad_value_is_a_usage_error(monkeypatch) -> None:
    assert Options.from_env({}).saturation_iterations == 120
    assert Options.from_env({ENV_SATURATION_ITERATIONS: "400"}).saturation_iterations == 400
    for bad in ("0", "many", "-5", "1.5"):
        monkeypatch.setenv(ENV_SATURATION_ITERATIONS, bad)
        with pytest.raises(EquivciError, match=ENV_SATURATION_ITERATIONS):
            _check_environment()


def test_unproven_for_lack_of_budget_names_the_budget_and_how_to_raise_it() -> None:
    from types import SimpleNamespace

    from equivci.prove.layered import LayerOutcome
    from equivci.verify.engine import _budget_note

    programs = SimpleNamespace(loops=[])
    whole = SimpleNamespace(exhausted=0, iterations=120)
    layers = [LayerOutcome("layers_0", True, False, 0.1), LayerOutcome("layers_1", False, False, 0.1, exhausted=130)]
    (note,) = _budget_note(programs, whole, layers)
    assert note.severity == "note"
    assert "layer layers_1" in note.message and "130" in note.message
    assert f"{ENV_SATURATION_ITERATIONS}=260" in note.message
    assert _budget_note(programs, whole, layers[:1]) == ()


def test_the_callers_budget_reaches_the_saturation_of_both_programs() -> None:
    """saturate(programs, iterations) runs with the budget asked for (the setting a user raised),
    and the proof records it for the note that names it."""
    from types import SimpleNamespace

    from equivci.prove.saturate import saturate

    x, lhs, rhs = chain()
    programs = SimpleNamespace(
        params=[x], reference_events=[], reference_outputs=[rhs], device_outputs=[[lhs]], targets=[[rhs]],
        evaluator=SimpleNamespace(equal_terms=[]), obligations=[],
    )
    for iterations in (1, 300):
        proof = saturate(programs, iterations=iterations)
        assert proof.iterations == iterations and proof.all_proved


def test_the_callers_budget_reaches_the_loop_step_proofs() -> None:
    """build_programs(..., iterations) hands the budget asked for to the handler of the distributed
    program's loops (each loop step is proved by saturation within it)."""
    from equivci.capture.types import LeafPlacement
    from equivci.hlo.parser import parse_module
    from equivci.prove.loops import LoopMatcher
    from equivci.prove.programs import build_programs

    module = parse_module("HloModule m\n\nENTRY main {\n  p = f32[4] parameter(0)\n  ROOT r = f32[4] negate(p)\n}\n")
    leaf = (LeafPlacement("[0]", (4,), "float32", (((0, 4),),)),)
    for iterations in (7, 300):
        handler = build_programs(module, module, leaf, leaf, 1, iterations=iterations).evaluator.loop_handler
        assert isinstance(handler, LoopMatcher) and handler.iterations == iterations


def test_terms_added_to_a_proof_are_saturated_with_it() -> None:
    """add_terms (hints, localization's hypotheses) loads the terms into the proof's e-graph and
    saturates again within the proof's budget, at least the terms' depth: the chain is then proved."""
    from equivci.prove.saturate import add_terms

    x, lhs, rhs = chain()
    proof = saturate_terms([x], [x], [], [], iterations=1)
    add_terms(proof, [lhs, rhs])
    assert proved_equal(proof.egraph, proof.loader.expr(lhs), proof.loader.expr(rhs))
