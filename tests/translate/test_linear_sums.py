"""A sum over devices of one linear map of each device's value (equivci/translate/linear_sums.py):
the map of the sum is stated beside the all-reduce's sum, evaluated here against it for every op
the walk goes through, and kept out where the map is not linear in the operand that differs (a
divisor, a select against a non-zero, a shared term added) or where two operands differ. The
end-to-end models are tests/soundness (linear-tail*, experts-tp-combined) and the corpus's
gemma-moe-dp-tp."""

from __future__ import annotations

import numpy as np
import pytest

from equivci.hlo.ir import Shape
from equivci.terms.ir import Term, TermTable
from equivci.terms.semantics import evaluate
from equivci.terms.spec import DotSpec, GatherDims
from equivci.translate.builder import Builder
from equivci.translate.collectives import combine
from equivci.translate.linear_sums import linear_sums

RNG = np.random.default_rng(13)
DEVICES = 3


def _builder() -> Builder:
    return Builder(None, TermTable(), DEVICES)  # type: ignore[arg-type]


def _param(ev: Builder, k: int, shape: tuple[int, ...], dtype: str = "f32") -> Term:
    return ev.table.make("param", (k,), (), shape, dtype)


def _like(ev: Builder, op: str, attrs: tuple, args: list[Term], shape: tuple[int, ...], dtype: str = "f32") -> Term:
    return ev.mk(op, attrs, args, Shape(dtype, shape))


def _draw():
    """Each device's value x_d (params 0..2, [4, 6]), a shared [4, 6] factor (3), shared [6, 5] (4),
    shared row indices (5, [3, 1], in range)."""
    params = {d: RNG.standard_normal((4, 6)).astype(np.float32) for d in range(DEVICES)}
    params[3] = RNG.standard_normal((4, 6)).astype(np.float32) + 2.0
    params[4] = RNG.standard_normal((6, 5)).astype(np.float32)
    params[5] = np.array([[2], [0], [3]], np.int32)
    return params


def _maps(ev: Builder):
    """f(x) for each op the walk goes through: (name, f, linear in x)."""
    shared, w, idx = _param(ev, 3, (4, 6)), _param(ev, 4, (6, 5)), _param(ev, 5, (3, 1), "s32")
    zeros = ev.const(np.zeros((4, 6), np.float32), "f32")
    ones = ev.const(np.ones((4, 6), np.float32), "f32")
    mask = _like(
        ev, "binary", ("compare-GT:f32",), [shared, ev.const(np.full((4, 6), 2.0, np.float32), "f32")], (4, 6), "pred"
    )
    rows = GatherDims((1,), (0,), (0,), (), (), 1, (1, 6))
    dot = DotSpec((), (), (1,), (0,), 2, 2, ("f32", "f32")).text()
    return [
        ("multiply", lambda x: _like(ev, "binary", ("multiply",), [shared, x], (4, 6)), True),
        ("numerator", lambda x: _like(ev, "binary", ("divide",), [x, shared], (4, 6)), True),
        ("divisor", lambda x: _like(ev, "binary", ("divide",), [shared, x], (4, 6)), False),
        ("shared-add", lambda x: _like(ev, "binary", ("add",), [x, shared], (4, 6)), False),
        ("reduce", lambda x: _like(ev, "reduce", ("add", "2:0"), [x], (6,)), True),
        ("max-reduce", lambda x: _like(ev, "reduce", ("maximum", "2:0"), [x], (6,)), False),
        ("transpose", lambda x: _like(ev, "transpose", ("1,0",), [x], (6, 4)), True),
        ("slice", lambda x: _like(ev, "slice", (1, 2, 5), [x], (4, 3)), True),
        ("select-zero", lambda x: _like(ev, "ternary", ("select",), [mask, x, zeros], (4, 6)), True),
        ("select-one", lambda x: _like(ev, "ternary", ("select",), [mask, x, ones], (4, 6)), False),
        ("gather", lambda x: ev.gather_term(x, idx, rows, Shape("f32", (3, 6))), True),
        ("dot", lambda x: _like(ev, "dot", (dot,), [x, w], (4, 5)), True),
    ]


MAPS = (
    "multiply",
    "numerator",
    "divisor",
    "shared-add",
    "reduce",
    "max-reduce",
    "transpose",
    "slice",
    "select-zero",
    "select-one",
    "gather",
    "dot",
)


@pytest.mark.parametrize("name", MAPS)
def test_the_map_of_the_sum_is_stated_only_where_the_map_is_linear(name):
    ev = _builder()
    maps = _maps(ev)
    assert tuple(m[0] for m in maps) == MAPS
    _, f, linear = maps[MAPS.index(name)]
    params = _draw()
    members = [f(_param(ev, d, (4, 6))) for d in range(DEVICES)]
    found = linear_sums(ev, members, lambda inner: combine(ev, "add", inner))
    want = sum(evaluate(m, params, ev.values) for m in members)
    assert len(found) == (1 if linear else 0), name
    for mapped in found:
        np.testing.assert_allclose(evaluate(mapped, params, ev.values), want, rtol=1e-5, atol=1e-5)
        summed = combine(ev, "add", members)  # the all-reduce states it beside its sum in group order
        # (members transposed alike are summed under one transpose: the map of the sum itself)
        assert [summed, mapped] in ev.equal_terms or (name == "transpose" and summed is mapped)
    if not linear:  # the map of the sum would differ: what the guard keeps out
        x_sum = sum(params[d] for d in range(DEVICES))
        params[6] = x_sum
        wrong = evaluate(f(_param(ev, 6, (4, 6))), params, ev.values)
        assert not np.allclose(wrong, want, rtol=1e-3), name


def test_a_chain_of_linear_maps_is_walked_down_to_the_values_that_differ():
    """gather(transpose(reduce-free chain)) of each device's dot partial: the stated term is the
    chain applied once, to the sum of the devices' innermost values."""
    ev = _builder()
    params = _draw()
    shared = _param(ev, 3, (4, 6))

    def chain(x: Term) -> Term:
        scaled = _like(ev, "binary", ("multiply",), [x, shared], (4, 6))
        flipped = _like(ev, "transpose", ("1,0",), [scaled], (6, 4))
        return _like(ev, "reduce", ("add", "2:1"), [flipped], (6,))

    members = [chain(_param(ev, d, (4, 6))) for d in range(DEVICES)]
    (mapped,) = linear_sums(ev, members, lambda inner: combine(ev, "add", inner))
    assert mapped.op == "reduce" and mapped.args[0].op == "transpose"
    inner = mapped.args[0].args[0].args
    assert any(a.op == "binary" and a.attrs == ("add",) for a in inner)  # the sum sits at the bottom
    np.testing.assert_allclose(
        evaluate(mapped, params, ev.values), sum(evaluate(m, params, ev.values) for m in members), rtol=1e-5
    )


def test_two_operands_that_differ_stop_the_walk():
    """x_d * s_d with both differing (a device's own scale) is no map of the sum of either."""
    ev = _builder()
    members = [
        _like(ev, "binary", ("multiply",), [_param(ev, d, (4, 6)), _param(ev, 10 + d, (4, 6))], (4, 6))
        for d in range(DEVICES)
    ]
    assert linear_sums(ev, members, lambda inner: combine(ev, "add", inner)) == []


def test_a_chain_through_an_add_reduce_is_also_cut_at_the_reductions():
    """reduce(x_d) * s of each device (a temperature's gradient: the device's reduce over its rows,
    times the shared temperature): stated as reduce(sum_d x_d) * s and as (sum_d reduce(x_d)) * s,
    whose reductions of windows merge as the reference's one; both are the sum of the members."""
    ev = _builder()
    params = {**_draw(), 6: np.float32(1.5)}
    shared = _param(ev, 6, ())
    members = [
        _like(
            ev,
            "binary",
            ("multiply",),
            [_like(ev, "reduce", ("add", "2:0,1"), [_param(ev, d, (4, 6))], ()), shared],
            (),
        )
        for d in range(DEVICES)
    ]
    found = linear_sums(ev, members, lambda inner: combine(ev, "add", inner))
    assert [m.args[0].op for m in found] == ["reduce", "binary"]
    want = sum(evaluate(m, params, ev.values) for m in members)
    for mapped in found:
        np.testing.assert_allclose(evaluate(mapped, params, ev.values), want, rtol=1e-5)

