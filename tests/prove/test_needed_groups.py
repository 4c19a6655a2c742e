"""The stated equalities the proof starts from (equivci.prove.saturate.needed_groups): a group of
terms stated equal is kept when it shares a term with the outputs, the targets, the reference's
values or their arguments, or with a group kept (in turn); the others are about values nothing the
proof compares is made of, and a first saturation leaves them out. Unless that proves every output,
the proof runs again with all of them (the localization reads every value's relation there)."""

from __future__ import annotations

from equivci.prove.saturate import needed_groups, saturate_terms
from equivci.terms.ir import TermTable

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
