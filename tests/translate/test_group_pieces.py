"""A group's piece of a value the reference computes group by group, and the all-to-all of pieces.

Facts (equivci.translate.regroup, relaid, collectives):
* the rows of an op that acts row by row (elementwise ops, a broadcast that keeps the rows, a
  reduce or argmax over later dims, a dot whose lhs rows are free) are the op on the rows: the
  reference's piece for group g is then the very term the device holding group g computes;
* piece g is result[g] of the batched value (read in row-major order), so an all-to-all that hands
  every device one slab of every group's piece holds one window of the batched value (checked on
  labels);
* transpose(x) op c = transpose(x op c) for a splat c.

Checked on terms of real JAX lowerings (a per-group bucket sum in a style unlike the blind MoE
cases: einsum over each token's largest router probability, no capacity), numerically on random arrays, with near
misses: a device that holds another group's rows, pieces read out of order (not one window), a dot
that contracts the rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from equivci.hlo.ir import Instruction, Shape
from equivci.hlo.parser import parse_module
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate import relaid
from equivci.translate.evaluator import Evaluator

G, T, D, E = 4, 6, 5, 3
RNG = np.random.default_rng(7)


def _buckets(xg, w):
    """A group's tokens summed per expert, each weighted by its router probability."""
    probs = jax.nn.softmax(xg @ w, axis=-1)
    top = jnp.where(probs >= jnp.max(probs, axis=-1, keepdims=True), probs, 0.0)
    return jnp.einsum("te,td->ed", top, jnp.tanh(xg))


def _reference(x, w):
    return jax.vmap(_buckets, in_axes=(0, None))(x.reshape(G, T, D), w)


def _module(fn, *shapes):
    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
    return parse_module(jax.jit(fn).lower(*args).as_text(dialect="hlo"))


def _reference_run():
    table = TermTable()
    x = table.make("param", (0,), (), (G * T, D), "f32")
    w = table.make("param", (1,), (), (D, E), "f32")
    ev = Evaluator(_module(_reference, (G * T, D), (D, E)), table, 1)
    (out,) = ev.run(ev.module.entry, [[x], [w]])
    return ev, table, x, w, out


def _one_group(reference, table, x, w, rows):
    """The term a device computes for the given rows of x (its own group, or another's)."""
    ev = Evaluator(_module(_buckets, (T, D), (D, E)), table, 1)
    (out,) = ev.run(ev.module.entry, [[ev.slice_term(x, 0, *rows)], [w]])
    reference.values.update(ev.values)  # its constants, to evaluate its terms
    return out


def _values():
    return {0: RNG.standard_normal((G * T, D)).astype(np.float32), 1: RNG.standard_normal((D, E)).astype(np.float32)}


def test_each_groups_piece_is_the_term_its_device_computes_and_a_box_of_the_batched_value() -> None:
    ev, table, x, w, out = _reference_run()
    values = _values()
    whole = evaluate(out, values, ev.values)
    for g in range(G):
        device = _one_group(ev, table, x, w, (g * T, (g + 1) * T))
        assert device in ev.boxes, g  # the same term: no proof needed to meet the reference's piece
        base, box = ev.boxes[device]
        assert base is out and box == ((g, g + 1), (0, E), (0, D))
        np.testing.assert_allclose(evaluate(device, values, ev.values), whole[g], rtol=1e-5, atol=1e-6)


def test_another_groups_rows_are_not_this_groups_piece() -> None:
    ev, table, x, w, _ = _reference_run()
    shifted = _one_group(ev, table, x, w, (1, T + 1))  # rows that straddle two groups
    assert shifted not in ev.boxes
    wrong = _one_group(ev, table, x, w, (T, 2 * T))  # group 1's rows: a piece, but group 1's
    assert ev.boxes[wrong][1][0] == (1, 2)


def test_the_rows_stated_beside_the_ops_are_windows_of_the_rows_op() -> None:
    """Each pushed row term is stated equal to the window of the flat op it came from: true on values."""
    ev, *_ = _reference_run()
    values = _values()
    pairs = [(a, b) for a, b in (group for group in ev.equal_terms if len(group) == 2) if b.op == "slice"]
    assert pairs
    for a, b in pairs:
        np.testing.assert_allclose(evaluate(a, values, ev.values), evaluate(b, values, ev.values), rtol=1e-5, atol=1e-6)


def test_a_dot_that_contracts_the_rows_is_not_taken_row_by_row() -> None:
    from equivci.translate import regroup

    table = TermTable()
    ev = Evaluator(None, table, 1)
    a = table.make("param", (0,), (), (8, 8), "f32")
    b = table.make("param", (1,), (), (8, 2), "f32")
    free = ev.local(_dot_inst((8, 2), lhs_contract="{1}", rhs_contract="{0}"), [a, b], 0)
    rows = regroup._rows(ev, free, 2, 6)
    assert rows.op == "dot" and rows.args[0].op == "slice"  # the dot of the rows
    contracted = ev.local(_dot_inst((8, 2), lhs_contract="{0}", rhs_contract="{0}"), [a, b], 0)
    assert regroup._elementwise_rows(ev, contracted, 2, 6, {}) is None  # rows of a^T b are not a^T b of rows
    values = {0: RNG.standard_normal((8, 8)).astype(np.float32), 1: RNG.standard_normal((8, 2)).astype(np.float32)}
    np.testing.assert_allclose(evaluate(rows, values), (values[0] @ values[1])[2:6], rtol=1e-5)


def test_a_broadcast_that_moves_the_rows_is_not_taken_row_by_row() -> None:
    from equivci.translate import regroup

    table = TermTable()
    ev = Evaluator(None, table, 1)
    a = table.make("param", (0,), (), (6, 6), "f32")
    moved = ev.local(Instruction("b", "broadcast", Shape("f32", (6, 6, 2)), ("a",), {"dimensions": "{1,0}"}), [a], 0)
    kept = ev.local(Instruction("b", "broadcast", Shape("f32", (6, 6, 2)), ("a",), {"dimensions": "{0,1}"}), [a], 0)
    assert regroup._elementwise_rows(ev, moved, 0, 3, {}) is None  # its rows are a's columns
    rows = regroup._elementwise_rows(ev, kept, 0, 3, {})
    values = {0: RNG.standard_normal((6, 6)).astype(np.float32)}
    np.testing.assert_allclose(evaluate(rows, values), np.broadcast_to(values[0][:3, :, None], (3, 6, 2)))


def _dot_inst(dims, lhs_contract, rhs_contract) -> Instruction:
    attrs = {"lhs_contracting_dims": lhs_contract, "rhs_contracting_dims": rhs_contract}
    return Instruction("d", "dot", Shape("f32", dims), ("a", "b"), attrs)


def test_slabs_of_every_groups_piece_read_in_order_are_one_window_of_the_batched_value() -> None:
    """What an all-to-all hands device 1 of 3: expert 1's slab of every group's piece."""
    ev, table, x, w, out = _reference_run()
    pieces = [_one_group(ev, table, x, w, (g * T, (g + 1) * T)) for g in range(G)]
    received = ev.concat([ev.reshape_term(ev.slice_term(p, 0, 1, 2), Shape("f32", (1, 1, D))) for p in pieces], 0)
    window = ev.one_window(received) or received  # (the concatenation of reshapes finds it already)
    assert window.op == "slice" and window.args[0] is out and window.attrs == (1, 1, 2)
    values = _values()
    np.testing.assert_allclose(evaluate(window, values, ev.values), evaluate(received, values, ev.values), rtol=1e-6)


def test_pieces_out_of_group_order_are_no_window() -> None:
    ev, table, x, w, _ = _reference_run()
    pieces = [_one_group(ev, table, x, w, (g * T, (g + 1) * T)) for g in (1, 0, 2, 3)]  # two groups swapped
    received = ev.concat([ev.reshape_term(ev.slice_term(p, 0, 1, 2), Shape("f32", (1, 1, D))) for p in pieces], 0)
    assert ev.one_window(received) is None
    assert received.op != "slice"  # nor as the concatenation of reshapes


def test_known_boxes_label_their_sources_by_the_whole() -> None:
    """relaid.windows with known boxes: two boxes of one whole side by side in its order are one run."""
    table = TermTable()
    whole = table.make("param", (0,), (), (2, 4, 3), "f32")
    left = table.make("param", (1,), (), (4, 3), "f32")
    right = table.make("param", (2,), (), (4, 3), "f32")
    known = {left: (whole, ((0, 1), (0, 4), (0, 3))), right: (whole, ((1, 2), (0, 4), (0, 3)))}
    both = table.make("concat", (0,), (left, right), (8, 3), "f32")
    found = relaid.windows(both, (2, 4, 3), 1000, known)
    assert found is not None
    assert [(source, perm, box) for source, perm, box, _ in found[1]] == [(whole, (0, 1, 2), ((0, 2), (0, 4), (0, 3)))]
    swapped = table.make("concat", (0,), (right, left), (8, 3), "f32")
    found = relaid.windows(swapped, (2, 4, 3), 1000, known)
    assert found is None or len(found[1]) == 2  # read in another order: two windows, never one


@pytest.mark.parametrize(
    ("op", "other"),
    [
        ("maximum", 0.5),
        ("add", 0.5),
        ("subtract", 0.5),
        ("maximum", np.linspace(-1, 1, 5, dtype=np.float32)),  # not a splat: stays as written
    ],
    ids=["max", "add", "subtract", "max-of-a-row"],
)
def test_an_op_on_a_transposed_value_and_a_splat_is_the_transposed_op(op, other) -> None:
    fn = {"maximum": jnp.maximum, "add": jnp.add, "subtract": jnp.subtract}[op]

    def f(a, b):
        return fn(jnp.einsum("gcd,edf->egcf", a, b).transpose(1, 0, 2, 3), other)

    module = _module(f, (4, 2, 3), (2, 3, 5))
    table = TermTable()
    a = table.make("param", (0,), (), (4, 2, 3), "f32")
    b = table.make("param", (1,), (), (2, 3, 5), "f32")
    ev = Evaluator(module, table, 1)
    (out,) = ev.run(module.entry, [[a], [b]])
    values = {
        0: RNG.standard_normal((4, 2, 3)).astype(np.float32),
        1: RNG.standard_normal((2, 3, 5)).astype(np.float32),
    }
    np.testing.assert_allclose(
        evaluate(out, values, ev.values), np.asarray(f(values[0], values[1])), rtol=1e-5, atol=1e-6
    )
    splat = np.ndim(other) == 0
    assert (out.op == "transpose" and out.args[0].op == "binary") is splat  # the op moved under the transpose
    stated = [group for group in ev.equal_terms if out in group]
    assert bool(stated) is splat  # with the dot's operands swapped beside it
    for group in stated:
        for t in group:
            np.testing.assert_allclose(
                evaluate(t, values, ev.values), evaluate(out, values, ev.values), rtol=1e-5, atol=1e-6
            )
