"""The stated equalities the proof starts from (equivci.prove.saturate.needed_groups): a group of
terms stated equal is kept when it shares a term with the outputs, the targets, the reference's
values or their arguments, or with a group kept (in turn); the others are about values nothing the
proof compares is made of, and a first saturation leaves them out. Unless that proves every output,
the others join the first search's e-graph, which saturates on (the localization reads every
value's relation there)."""

from __future__ import annotations

import sys
from pathlib import Path

import equivci.prove.saturate as saturate_module
from equivci.prove.saturate import needed_groups, proved_equal, saturate, saturate_terms
from equivci.terms.ir import TermTable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "soundness"))

from engine_api import capture, programs_of  # noqa: E402

BUGGY = Path(__file__).resolve().parents[2] / "configs" / "buggy.yaml"

T = TermTable()
F32 = "f32"


def _param(k: int, shape=(4,)):
    return T.make("param", (k,), (), shape, F32)


def _tanh(x):
    return T.make("unary", ("tanh",), (x,), x.shape, F32)


def _add(x, y):
    return T.make("binary", ("add",), (x, y), x.shape, F32)


def test_groups_reached_from_the_roots_and_through_other_groups_are_kept() -> None:
    x, y, z = _param(0), _param(1), _param(2)
    root = _add(_tanh(x), y)
    direct = [_tanh(x), _tanh(_param(3))]  # an argument of the root
    chained = [_tanh(_param(3)), _add(z, z)]  # reached only through the group above
    beyond = [z, _param(4)]  # an argument of a member of a kept group
    dead = [_tanh(_param(5)), _param(6)]  # about values nothing compared is made of
    kept = needed_groups([dead, beyond, chained, direct], [root])
    assert kept == [beyond, chained, direct]


def test_a_group_about_an_op_on_a_reached_value_is_kept() -> None:
    """A group whose member applies an op to an opaque value the roots are made of (a device's running
    sum of its window plus the earlier shards' total, stated as the window of the whole running sum,
    while the program adds the total first) is about that value: kept. An op on a value the rules
    model (which they relate themselves) brings no group in: a GPipe schedule's warm-up facts stay out."""
    x, y = _param(0), _param(1)
    local = T.make("opaque", ("reduce-window",), (x,), x.shape, F32)
    root = _add(_add(y, local), _tanh(x))  # the program's own order
    stated = [_param(2), _add(local, y)]  # the window of the whole, = local + y
    on_modelled = [_param(3), _add(_tanh(x), y)]  # an op on a value the rules model
    kept = needed_groups([on_modelled, stated], [root])
    assert kept == [stated]


def test_no_roots_keep_no_group() -> None:
    assert needed_groups([[_param(0), _param(1)]], []) == []


def test_a_fact_the_outputs_need_is_never_left_out() -> None:
    # the output tanh(x0) is proved equal to its target tanh(x1) only through the stated x0 = x1
    x0, x1 = _param(0), _param(1)
    out, target = _tanh(x0), _tanh(x1)
    groups = [[x0, x1], [_tanh(_param(2)), _param(3)]]
    kept = needed_groups(groups, [out, target])
    assert kept == [[x0, x1]]
    proof = saturate_terms([target], [x1, target], [[(out, target)]], kept)
    assert proof.all_proved
    # and nothing else proves them equal (the test would pass vacuously otherwise)
    assert not saturate_terms([target], [x1, target], [[(out, target)]], groups[1:]).all_proved


def _programs(out, target, params, groups):
    from types import SimpleNamespace

    from equivci.options import Budgets

    return SimpleNamespace(
        params=params, reference_events=[], reference_values=lambda: list(params), reference_outputs=[target],
        device_outputs=[[out]], targets=[[target]],
        evaluator=SimpleNamespace(equal_terms=groups, budgets=Budgets()), obligations=[],
    )


def test_a_settled_first_search_grows_into_the_search_of_every_group(monkeypatch) -> None:
    """Unless the needed groups prove the outputs, the other groups join the first search's e-graph
    (one fresh search, not two) and it ends where a fresh search of every group ends: each pair of
    terms proved equal in one is in the other, the groups left out first included (the localization
    reads their relations)."""
    from equivci.prove import saturate as sat

    x0, x1, p5, p6, p7 = _param(0), _param(1), _param(5), _param(6), _param(7)
    out, target = _add(_tanh(x0), x0), _add(_tanh(x1), x0)  # differ: no group relates x0 and x1
    groups = [[_tanh(p5), p6], [_add(p6, p6), p7], [_tanh(x0), _tanh(_param(2))]]
    programs = _programs(out, target, [x0, x1], groups)
    assert needed_groups(groups, [x0, x1, target, out, target]) == groups[2:]
    searches = []
    monkeypatch.setattr(sat, "saturate_terms", lambda *a, **k: searches.append(a[3]) or saturate_terms(*a, **k))
    proof = sat.saturate(programs)
    assert not proof.all_proved and searches == [groups[2:]]
    fresh = saturate_terms([target], [x0, x1, target], [[(out, target)]], groups)
    terms = list(fresh.loader.exprs)
    assert set(terms) <= set(proof.loader.exprs) and len(terms) >= 12  # every term of every group loaded

    def equal_pairs(p):
        return {(a, b) for a in terms for b in terms if sat.proved_equal(p.egraph, p.loader.expr(a), p.loader.expr(b))}

    assert equal_pairs(proof) == equal_pairs(fresh)
    assert (_tanh(p5), p6) in equal_pairs(proof) and (_add(p6, p6), p7) in equal_pairs(proof)


def test_an_unproved_search_goes_on_with_the_facts_left_out_in_its_own_egraph(monkeypatch) -> None:
    # A program the first search does not prove (a wrong slice), with a stated group about values no
    # output reads: the group joins the first search's e-graph, which saturates on; the search is
    # not started over (split 15's Grok dispatch spent 12 s CPU on the first search, 17 s on a
    # second one from scratch, and timed out under load).
    programs = programs_of(capture(BUGGY, "mlp-tp-wrong-slice"))
    table = programs.evaluator.table
    p = next(q for q in programs.params if q.dtype.startswith("f"))
    tanh = table.make("unary", ("tanh",), (p,), p.shape, p.dtype)
    exp = table.make("unary", ("exp",), (p,), p.shape, p.dtype)
    left_out = [table.make("binary", ("add",), (tanh, exp), p.shape, p.dtype),
                table.make("binary", ("add",), (exp, tanh), p.shape, p.dtype)]
    programs.evaluator.equal_terms.append(left_out)
    searches = []

    def counted(*args, **kwargs):
        searches.append(args[3])
        return saturate_terms(*args, **kwargs)

    monkeypatch.setattr(saturate_module, "saturate_terms", counted)
    proof = saturate(programs)
    assert not proof.all_proved
    assert len(searches) == 1 and left_out not in searches[0]
    assert proved_equal(proof.egraph, proof.loader.expr(left_out[0]), proof.loader.expr(left_out[1]))


def test_a_search_stops_at_the_pass_that_proves_every_pair(monkeypatch) -> None:
    """Passes after the one that proves every pair only grow the e-graph (further passes never undo
    an equality): with `until_proved` the run ends there, with the same verdict."""
    x0, x1 = _param(0, (8,)), _param(1, (8,))
    chain = x0
    for k in range(6):  # slices of slices: the rules compose them one level a pass
        chain = T.make("slice", (0, 0, 8 - k - 1), (chain,), (8 - k - 1,), F32)
    out, target = _tanh(x0), _tanh(x1)
    passes = []
    real_run = saturate_module.EGraph.run

    def counted(self, *args, **kwargs):
        passes.append(1)
        return real_run(self, *args, **kwargs)

    monkeypatch.setattr(saturate_module.EGraph, "run", counted)
    full = saturate_terms([target], [x1, target, chain], [[(out, target)]], [[x0, x1]])
    ran = len(passes)
    passes.clear()
    early = saturate_terms([target], [x1, target, chain], [[(out, target)]], [[x0, x1]], until_proved=True)
    assert full.all_proved and early.all_proved
    assert len(passes) < ran
