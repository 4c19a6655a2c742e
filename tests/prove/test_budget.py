"""The saturation budgets: a search the budget cut short says so, the iteration budget grows with
depth, and the size budget stops an e-graph between passes.

The instance: k unary ops over a slice, against the slice of the k ops over the whole input. The
slice climbs one op per iteration (elementwise/unary_lift), so the proof needs about k iterations.
"""

from __future__ import annotations

import pytest
from egglog import EGraph

from equivci.cli import _check_environment
from equivci.errors import EquivciError
from equivci.options import ENV_SATURATION_ITERATIONS, ENV_SATURATION_NODES, SATURATION_NODES, Budgets, Options
from equivci.prove.saturate import GROWTH, _run, node_budget, proved_equal, saturate_terms, size
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
    assert _run(egraph, 3) == (3, 0, 0)
    assert not proved_equal(egraph, a, b)


def test_a_run_that_reaches_a_fixed_point_reports_no_budget() -> None:
    _, lhs, rhs = chain()
    egraph, a, b = loaded(lhs, rhs)
    assert _run(egraph, 10 * DEPTH) == (0, 0, 0)
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
    whole = SimpleNamespace(exhausted=0, iterations=120, outgrown=0)
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
        params=[x], reference_events=[], reference_values=lambda: [x], reference_outputs=[rhs],
        device_outputs=[[lhs]], targets=[[rhs]],
        evaluator=SimpleNamespace(equal_terms=[], budgets=Budgets()), obligations=[],
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


def test_a_run_stops_at_its_size_budget_and_says_so() -> None:
    """The chain's e-graph loads 81 rows and grows to about 90 by its fixed point: a size budget of 85
    rows stops it on the way (no proof, the rows it held), and a budget above its fixed point changes
    nothing (the same proof, no stop). It stops at 84 rows: the pass from 84 rows, growing the
    e-graph by the factor of the pass before (81 to 84), would end past 85, so it is not started."""
    _, lhs, rhs = chain()
    egraph, a, b = loaded(lhs, rhs)
    loaded_rows = size(egraph)
    assert loaded_rows < 85
    exhausted, outgrown, over = _run(egraph, 10 * DEPTH, 85)
    assert exhausted == 0 and loaded_rows < outgrown < 85 and outgrown <= size(egraph) and not proved_equal(egraph, a, b)
    assert over == 0  # the rows, not the memory, ended it
    egraph, a, b = loaded(lhs, rhs)
    assert _run(egraph, 10 * DEPTH, 200) == (0, 0, 0) and proved_equal(egraph, a, b)
    assert size(egraph) < 200


def test_the_size_budget_is_derived_from_the_loaded_terms_unless_set() -> None:
    assert node_budget(600, None) == GROWTH * 600 < SATURATION_NODES
    assert node_budget(10 * SATURATION_NODES, None) == SATURATION_NODES
    assert node_budget(600, 85) == node_budget(10 * SATURATION_NODES, 85) == 85
    x, lhs, rhs = chain()
    free = saturate_terms([x], [x], [[(lhs, rhs)]], [], iterations=1)
    assert free.all_proved and free.outgrown == 0 and free.node_budget == GROWTH * free.loaded
    tight = saturate_terms([x], [x], [[(lhs, rhs)]], [], iterations=1, nodes=free.loaded + 2)
    assert not tight.all_proved and tight.node_budget == free.loaded + 2 <= tight.outgrown
    assert tight.exhausted == 0  # the size, not the iterations, ended it


def test_terms_added_past_the_size_budget_are_loaded_but_not_saturated() -> None:
    """Localization keeps adding hypotheses to an e-graph that outgrew its budget: they are loaded
    (and counted in the rows its terms loaded), but no pass runs on the e-graph any more (with a
    budget, test_terms_added_to_a_proof_are_saturated_with_it proves the same pair)."""
    from equivci.prove.saturate import add_terms

    x, lhs, rhs = chain()
    proof = saturate_terms([x], [x], [], [], iterations=1, nodes=1)
    first = proof.loaded
    assert proof.outgrown >= first > 0
    add_terms(proof, [lhs, rhs])
    assert proof.loaded > first and proof.outgrown >= proof.loaded
    assert not proved_equal(proof.egraph, proof.loader.expr(lhs), proof.loader.expr(rhs))


def test_an_outgrown_proof_with_a_derived_budget_runs_no_pass_for_added_terms(monkeypatch) -> None:
    """The derived budget grows with the rows loaded: terms added to a proof that reached it raise
    the budget, but run no pass (the hypotheses of a localization, each of whose passes would be the
    e-graph's biggest yet)."""
    from equivci.prove import saturate as saturate_module
    from equivci.prove.saturate import add_terms

    x, lhs, rhs = chain()
    monkeypatch.setattr(saturate_module, "GROWTH", 1)  # the first run stops at once
    proof = saturate_terms([x], [x], [], [], iterations=1)
    assert proof.outgrown and proof.node_budget == proof.loaded
    monkeypatch.setattr(saturate_module, "GROWTH", 1000)  # and the budget then leaves room for passes
    add_terms(proof, [lhs, rhs])
    assert proof.node_budget > size(proof.egraph)
    assert not proved_equal(proof.egraph, proof.loader.expr(lhs), proof.loader.expr(rhs))
    assert proof.outgrown == size(proof.egraph)


def test_the_size_budget_setting_is_read_once_and_a_bad_value_is_a_usage_error(monkeypatch) -> None:
    assert Options.from_env({}).budgets.saturation_nodes is None
    assert Options.from_env({ENV_SATURATION_NODES: "8000000"}).budgets.saturation_nodes == 8_000_000
    for bad in ("0", "lots", "-5", "2.5"):
        monkeypatch.setenv(ENV_SATURATION_NODES, bad)
        with pytest.raises(EquivciError, match=ENV_SATURATION_NODES):
            _check_environment()


def test_unproven_for_lack_of_size_budget_names_the_nodes_the_budget_and_how_to_raise_it() -> None:
    from types import SimpleNamespace

    from equivci.prove.layered import LayerOutcome
    from equivci.verify.engine import _budget_note

    programs = SimpleNamespace(loops=[])
    whole = SimpleNamespace(exhausted=0, iterations=120, outgrown=812_345, node_budget=600_000, memory=0)
    layers = [LayerOutcome("layers_0", True, False, 0.1), LayerOutcome("layers_1", False, False, 0.1, outgrown=(21_000, 20_000))]
    (note,) = _budget_note(programs, whole, layers)
    assert note.severity == "note"
    assert "layer layers_1 and 1 more" in note.message and "21,000 nodes" in note.message and "20,000" in note.message
    assert f"{ENV_SATURATION_NODES}=40000 " in note.message
    (note,) = _budget_note(programs, whole, layers[:1])
    assert "the whole program" in note.message and "812,345 nodes" in note.message
    assert f"{ENV_SATURATION_NODES}=1200000 " in note.message
    assert _budget_note(programs, SimpleNamespace(exhausted=0, iterations=120, outgrown=0), layers[:1]) == ()


def test_a_layer_stopped_by_its_size_budget_is_proved_afresh_under_another_budget() -> None:
    """Layer proofs are stored by content: one the size budget stopped is not what a larger budget
    finds, so the budget is part of the layer's key (layer 1 of the partner programs needs its rules)."""
    from test_layered_groups import _layering, _programs

    from equivci.cache import Memo
    from equivci.prove.layered import prove_layers

    programs, _ = _programs(minus_signs=2)
    layering, memo = _layering(programs), Memo(None)
    programs.evaluator.budgets = Budgets(saturation_nodes=1)
    tight = prove_layers(programs, layering, memo).layers
    assert [o.proved for o in tight] == [True, False] and tight[1].outgrown[1] == 1 <= tight[1].outgrown[0]
    assert tight[1].exhausted == 0
    programs.evaluator.budgets = Budgets()
    free = prove_layers(programs, layering, memo).layers
    assert [(o.proved, o.reused, o.outgrown) for o in free] == [(True, False, (0, 0))] * 2
    assert [o.reused for o in prove_layers(programs, layering, memo).layers] == [True, True]


def test_a_run_stops_before_a_pass_predicted_to_take_more_memory_than_its_share_of_the_cap(monkeypatch) -> None:
    """The memory a pass takes is measured (the process's own, /proc and getrusage) and the next pass
    is not started where it is predicted past memory.SHARE of the cap: with a cap below twice what
    the process maps already, the chain stops after its first pass, unproved, and the run says the
    memory stopped it (the bytes predicted, at least what is mapped); under the real cap it is proved."""
    from equivci.prove import memory

    mapped = memory.next_pass(0, 1.0)
    if mapped is None:
        pytest.skip("no /proc/self/status: the memory of a pass is not measured here")
    _, lhs, rhs = chain()
    egraph, a, b = loaded(lhs, rhs)
    monkeypatch.setattr(memory, "cap", lambda: mapped)
    exhausted, outgrown, over = _run(egraph, 10 * DEPTH)
    assert exhausted == 0 and 0 < outgrown <= size(egraph) and over >= mapped and not proved_equal(egraph, a, b)
    monkeypatch.undo()
    assert _run(egraph, 10 * DEPTH) == (0, 0, 0) and proved_equal(egraph, a, b)


def test_the_next_pass_is_predicted_from_the_last_ones_peak_and_the_square_of_its_growth() -> None:
    """A pass that took 1 GiB above its start and doubled the e-graph: the next one is predicted at
    what is mapped now plus 4 GiB (its joins grow with the square), which fits a cap of 64 GiB
    and not one of 8 GiB, of which it may take half."""
    from equivci.prove import memory

    mapped = memory.next_pass(0, 1.0)
    if mapped is None:
        pytest.skip("no /proc/self/status: the memory of a pass is not measured here")
    predicted = memory.next_pass(2**30, 2.0)
    assert predicted is not None and 4 * 2**30 <= predicted - mapped < 4 * 2**30 + 2**28  # what it maps may move a bit
    assert memory.fits(predicted, 64 * 2**30) and not memory.fits(4 * 2**30 + 2**20, 8 * 2**30)
    assert memory.fits(None, 1)  # unmeasured: no stop


def test_a_meter_reads_a_pass_that_raises_the_process_peak() -> None:
    """A pass that maps and touches 200 MB more than the process ever held is measured that far above
    its start (the kernel's counts of resident pages lag by a few pages per thread)."""
    from equivci.prove import memory

    meter = memory.PassMeter()
    meter.begin()
    if meter.start is None:
        pytest.skip("no /proc/self/status: the memory of a pass is not measured here")
    held = b"\x01" * (200 * 2**20 + meter.peak - meter.start)  # written: every page touched
    extra = meter.extra()
    del held
    assert extra is not None and extra >= 195 * 2**20


def test_unproven_for_lack_of_memory_names_the_prediction_the_cap_and_how_to_raise_it(monkeypatch) -> None:
    from types import SimpleNamespace

    from equivci.options import ENV_VERIFY_MEMORY
    from equivci.prove import memory
    from equivci.prove.layered import LayerOutcome
    from equivci.verify.engine import _budget_note

    monkeypatch.setattr(memory, "cap", lambda: 16 * 2**30)
    programs = SimpleNamespace(loops=[])
    whole = SimpleNamespace(exhausted=0, iterations=120, outgrown=445_797, node_budget=4_000_000, memory=20 * 2**30)
    (note,) = _budget_note(programs, whole, [])
    assert "the whole program" in note.message and "445,797 nodes" in note.message and "20.0 GiB" in note.message
    assert "16.0 GiB" in note.message and f"{ENV_VERIFY_MEMORY} to {32 * 2**30}" in note.message
    layer = LayerOutcome("layers_1", False, False, 0.1, outgrown=(21_000, 20_000), memory=9 * 2**30)
    (note,) = _budget_note(programs, SimpleNamespace(exhausted=0, iterations=120, outgrown=0), [layer])
    assert "layer layers_1" in note.message and "9.0 GiB" in note.message and ENV_SATURATION_NODES not in note.message


def test_a_layer_stopped_by_memory_is_not_stored(monkeypatch) -> None:
    """The memory cap is no part of a layer's key: a layer whose search the memory stopped is proved
    afresh by the next run, which may have more (layer 1 of the partner programs needs its rules)."""
    from test_layered_groups import _layering, _programs

    from equivci.cache import Memo
    from equivci.prove import memory
    from equivci.prove.layered import prove_layers

    if memory.next_pass(0, 1.0) is None:
        pytest.skip("no /proc/self/status: the memory of a pass is not measured here")
    programs, _ = _programs(minus_signs=2)
    layering, memo = _layering(programs), Memo(None)
    monkeypatch.setattr(memory, "cap", lambda: 1)
    tight = prove_layers(programs, layering, memo).layers
    assert not tight[1].proved and tight[1].memory > 0
    monkeypatch.undo()
    free = prove_layers(programs, layering, memo).layers
    assert [(o.proved, o.memory) for o in free] == [(True, 0)] * 2 and not free[1].reused


def test_a_hypothesis_adds_at_most_growth_times_the_rows_it_loads(monkeypatch) -> None:
    """Localization's hypotheses get a size budget of their own, GROWTH times the rows they load: one
    past it stops its run (unproved here, with no room at all), marks the e-graph as running away
    (no pass for later hypotheses) and is no stop of the proof's own search (no budget note); with
    the room GROWTH gives, the same hypothesis is proved."""
    from equivci.prove import saturate as saturate_module
    from equivci.prove.saturate import add_hypotheses

    x, lhs, rhs = chain()
    proof = saturate_terms([x], [x], [], [], iterations=1, nodes=10**6)
    monkeypatch.setattr(saturate_module, "GROWTH", 0)
    add_hypotheses(proof, [lhs, rhs])
    assert 0 < proof.runaway <= size(proof.egraph) and proof.outgrown == 0 and proof.memory == 0
    assert not proved_equal(proof.egraph, proof.loader.expr(lhs), proof.loader.expr(rhs))
    monkeypatch.undo()
    proof = saturate_terms([x], [x], [], [], iterations=1, nodes=10**6)
    add_hypotheses(proof, [lhs, rhs])
    assert proof.runaway == 0 and proved_equal(proof.egraph, proof.loader.expr(lhs), proof.loader.expr(rhs))


def test_a_stop_of_the_proposed_windows_search_is_not_said_to_be_the_settings() -> None:
    """Windows are proposed only to a whole-program search that reached a fixed point; when their
    own search (Budgets.hinted_iterations) stops, the note says so, and not that raising
    EQUIVCI_SATURATION_ITERATIONS may prove it (which leaves that budget as it is). Without
    proposals, the note names the setting's value, not the proposals' budget."""
    from types import SimpleNamespace

    from equivci.verify.engine import _budget_note

    x, lhs, rhs = chain()
    proof = saturate_terms([x], [x], [], [], iterations=16)
    proof.exhausted, proof.hinted = 21, 29
    (note,) = _budget_note(SimpleNamespace(loops=[]), proof, [], 120)
    assert "fixed point" in note.message and "29 windows" in note.message and "budget of 21" in note.message
    assert f"{ENV_SATURATION_ITERATIONS} does not raise" in note.message and "=42" not in note.message
    proof.hinted = 0
    (note,) = _budget_note(SimpleNamespace(loops=[]), proof, [], 120)
    assert "(120 now)" in note.message and f"{ENV_SATURATION_ITERATIONS}=42" in note.message
