"""A value moved without arithmetic (slices, reshapes, transposes, concatenations) is the
concatenation of windows of its sources when the labels say so (equivci.translate.relaid, through
Builder.relaid_windows): an all-to-all resharding rows to columns, as SPMD partitioning inserts in a
training step under jit, gives each device the column window of every device's rows.

Checked numerically on the terms the builder makes, its guard (each run one box of one source, read
in order) on a near miss (a transposed box), and on JAX programs in a style unlike the blind case
(there jit inserts the all-to-all; here shard_map calls `lax.all_to_all` itself): the resharded
product verifies, and a near miss that concatenates the received blocks along the wrong dim is a
mismatch.
"""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify

from equivci.hlo.ir import Shape
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.terms.spec import DotSpec
from equivci.translate.evaluator import Evaluator

RNG = np.random.default_rng(0)


def _resharded(ev: Evaluator, rows: list, device: int, block: int):
    """Device `device`'s all-to-all of row shards [r, c] into columns: concat(shard[:, its block]),
    viewed [r, n, block], transposed [n, r, block], merged [n * r, block]."""
    n, (r, _) = len(rows), rows[0].shape
    received = ev.concat([ev.slice_term(x, 1, device * block, (device + 1) * block) for x in rows], 1)
    split = ev.reshape_term(received, Shape("f32", (r, n, block)))
    moved = ev.table.make("transpose", ("1,0,2",), (split,), (n, r, block), "f32")
    return ev.reshape_term(moved, Shape("f32", (n * r, block)))


def test_an_all_to_all_from_rows_to_columns_is_the_column_window_of_the_rows() -> None:
    ev = Evaluator(None, TermTable(), 1)
    rows = [ev.table.make("param", (k,), (), (4, 8), "f32") for k in range(2)]
    term = _resharded(ev, rows, 1, 4)
    assert term.op == "concat" and [a.op for a in term.args] == ["slice", "slice"]
    values = {k: RNG.standard_normal((4, 8)) for k in range(2)}
    np.testing.assert_array_equal(evaluate(term, values), np.concatenate([values[0], values[1]])[:, 4:8])


def test_rows_of_one_value_moved_back_are_its_window() -> None:
    ev = Evaluator(None, TermTable(), 1)
    x = ev.table.make("param", (0,), (), (8, 8), "f32")
    term = _resharded(ev, [ev.slice_term(x, 0, 0, 4), ev.slice_term(x, 0, 4, 8)], 0, 4)
    assert term.op == "slice" and term.attrs == (1, 0, 4) and term.args[0] is x


def test_a_transposed_box_is_no_window() -> None:
    # every element of x, but read column by column: the labels fill one box out of order
    ev = Evaluator(None, TermTable(), 1)
    x = ev.table.make("param", (0,), (), (4, 4), "f32")
    moved = ev.table.make("transpose", ("1,0",), (x,), (4, 4), "f32")
    term = ev.reshape_term(moved, Shape("f32", (16,)))
    assert term.op == "reshape" and term.args[0] is moved
    value = RNG.standard_normal((4, 4))
    np.testing.assert_array_equal(evaluate(term, {0: value}), value.T.ravel())


def test_rows_of_two_sources_read_across_are_no_window() -> None:
    # [a | b] transposed and viewed [4, 4]: each row of the result holds one source, read down its columns
    ev = Evaluator(None, TermTable(), 1)
    a, b = (ev.table.make("param", (k,), (), (2, 4), "f32") for k in range(2))
    both = ev.concat([a, b], 1)
    moved = ev.table.make("transpose", ("1,0",), (both,), (8, 2), "f32")
    term = ev.reshape_term(moved, Shape("f32", (4, 4)))
    assert term.op == "reshape"
    va, vb = RNG.standard_normal((2, 4)), RNG.standard_normal((2, 4))
    np.testing.assert_array_equal(evaluate(term, {0: va, 1: vb}), np.concatenate([va, vb], 1).T.reshape(4, 4))


def test_rows_read_in_an_order_no_transpose_gives_are_no_window() -> None:
    # a group piece's rows read 0, 2, 1, 3: one box of the whole, but no order of its dims reads it so
    ev = Evaluator(None, TermTable(), 1)
    whole = ev.table.make("param", (0,), (), (2, 4, 4), "f32")
    piece = ev.table.make("param", (1,), (), (4, 4), "f32")
    ev.boxes[piece] = (whole, ((1, 2), (0, 4), (0, 4)))
    split = ev.reshape_term(piece, Shape("f32", (2, 2, 4)))
    moved = ev.table.make("transpose", ("1,0,2",), (split,), (2, 2, 4), "f32")
    term = ev.reshape_term(moved, Shape("f32", (1, 4, 4)))  # the box's own shape: every dim order is tried
    value = RNG.standard_normal((4, 4))
    values = {0: np.stack([RNG.standard_normal((4, 4)), value]), 1: value}
    np.testing.assert_array_equal(evaluate(term, values), value[None, [0, 2, 1, 3]])


def test_a_transposed_read_of_a_plain_value_keeps_its_form() -> None:
    # only group pieces' wholes are read in another dim order: a plain value's transposed reshape
    # stays as both programs write it
    ev = Evaluator(None, TermTable(), 1)
    x = ev.table.make("param", (0,), (), (2, 1, 3), "f32")
    moved = ev.table.make("transpose", ("1,2,0",), (x,), (1, 3, 2), "f32")
    # (the builder's own normal form may move the transpose outside the reshape, dots' stop-25
    # transposed_reshape, with the written form stated beside: what must not happen is relaid
    # re-reading the value in another dim order)
    assert ev.relaid_windows(moved, Shape("f32", (3, 2))) is None
    term = ev.reshape_term(moved, Shape("f32", (3, 2)))
    value = RNG.standard_normal((2, 1, 3))
    np.testing.assert_array_equal(evaluate(term, {0: value}), value.transpose(1, 2, 0).reshape(3, 2))


def _dot(ev: Evaluator, a, b, lc: int, rc: int):
    spec = DotSpec((), (), (lc,), (rc,), 2, 2, ("f32", "f32"))
    shape = (a.shape[1 - lc], b.shape[1 - rc])
    return ev.table.make("dot", (spec.text(),), (a, b), shape, "f32")


def _group_products(groups: int):
    """Pieces a_g @ b_g of a whole W [g, 3, 3] (what regroup.py records), and values where W[g] is
    that product."""
    ev = Evaluator(None, TermTable(), 1)
    whole = ev.table.make("param", (0,), (), (groups, 3, 3), "f32")
    a = [ev.table.make("param", (1 + 2 * g,), (), (3, 3), "f32") for g in range(groups)]
    b = [ev.table.make("param", (2 + 2 * g,), (), (3, 3), "f32") for g in range(groups)]
    values = {1 + 2 * g: RNG.standard_normal((3, 3)) for g in range(groups)}
    values |= {2 + 2 * g: RNG.standard_normal((3, 3)) for g in range(groups)}
    values[0] = np.stack([values[1 + 2 * g] @ values[2 + 2 * g] for g in range(groups)])
    for g in range(groups):
        ev.boxes[_dot(ev, a[g], b[g], 1, 0)] = (whole, ((g, g + 1), (0, 3), (0, 3)))
    return ev, whole, a, b, values


def test_a_dot_of_a_pieces_operands_swapped_is_the_piece_transposed() -> None:
    """dot(b, a) contracting b's columns with a's rows is (a @ b).T: rows 1:3 of it on every group,
    received side by side, are a window of transpose(W) (the run read in another dim order)."""
    ev, whole, a, b, values = _group_products(2)
    swapped = [_dot(ev, b[g], a[g], 0, 1) for g in range(2)]
    received = ev.concat([ev.slice_term(s, 0, 1, 3) for s in swapped], 0)
    term = ev.reshape_term(received, Shape("f32", (2, 2, 3)))
    assert {t for t in _leaves(term)} == {whole}
    expected = np.stack([(values[1 + 2 * g] @ values[2 + 2 * g]).T[1:3] for g in range(2)])
    np.testing.assert_allclose(evaluate(term, values), expected, rtol=1e-12)


def test_a_dot_of_swapped_operands_contracting_other_dims_is_not_the_piece() -> None:
    # dot(b, a) contracting b's rows with a's columns is b @ a, not (a @ b).T
    ev, whole, a, b, values = _group_products(2)
    other = [_dot(ev, b[g], a[g], 1, 0) for g in range(2)]
    received = ev.concat([ev.slice_term(s, 0, 1, 3) for s in other], 0)
    term = ev.reshape_term(received, Shape("f32", (2, 2, 3)))
    assert whole not in set(_leaves(term))
    expected = np.stack([(values[2 + 2 * g] @ values[1 + 2 * g])[1:3] for g in range(2)])
    np.testing.assert_allclose(evaluate(term, values), expected, rtol=1e-12)


def test_the_operand_of_a_transposed_piece_is_the_piece_transposed_back() -> None:
    # piece = transpose(y, (1, 2, 0)): a three-cycle (its own inverse it is not) of a cube, so a
    # wrong perm still gives the right shape; y's second rows received from both groups
    ev = Evaluator(None, TermTable(), 1)
    whole = ev.table.make("param", (0,), (), (2, 3, 3, 3), "f32")
    ys = [ev.table.make("param", (1 + g,), (), (3, 3, 3), "f32") for g in range(2)]
    values = {1 + g: RNG.standard_normal((3, 3, 3)) for g in range(2)}
    values[0] = np.stack([values[1 + g].transpose(1, 2, 0) for g in range(2)])
    for g, y in enumerate(ys):
        piece = ev.table.make("transpose", ("1,2,0",), (y,), (3, 3, 3), "f32")
        ev.boxes[piece] = (whole, ((g, g + 1), (0, 3), (0, 3), (0, 3)))
    received = ev.concat([ev.slice_term(y, 0, 1, 2) for y in ys], 0)
    term = ev.reshape_term(received, Shape("f32", (2, 1, 3, 3)))
    assert whole in set(_leaves(term))
    np.testing.assert_array_equal(evaluate(term, values), np.stack([values[1 + g][1:2] for g in range(2)]))


def test_the_same_moves_of_other_sources_are_their_windows() -> None:
    # the answers are kept by layout (every layer's heads, every device's shard move alike): the
    # same all-to-all of other rows is found again, without labelling, as the window of those rows
    ev = Evaluator(None, TermTable(), 1)
    values = {k: RNG.standard_normal((4, 8)) for k in range(4)}
    layouts = []
    for lo in (0, 2):
        rows = [ev.table.make("param", (lo + k,), (), (4, 8), "f32") for k in range(2)]
        term = _resharded(ev, rows, 1, 4)
        assert term.op == "concat" and {t.attrs[0] for t in _leaves(term)} == {lo, lo + 1}
        np.testing.assert_array_equal(evaluate(term, values), np.concatenate([values[lo], values[lo + 1]])[:, 4:8])
        layouts.append(len(ev.relaid_layouts))
    assert layouts[1] == layouts[0] > 0


def test_pieces_of_other_boxes_moved_alike_are_windows_of_their_own_boxes() -> None:
    # the same moves of pieces that are the groups of the whole in the other order read its rows in
    # the other order (no window: a run of two rows read out of order): which box of its whole a
    # piece is belongs to the layout
    ev = Evaluator(None, TermTable(), 1)
    whole = ev.table.make("param", (0,), (), (2, 3, 3), "f32")
    values = {0: RNG.standard_normal((2, 3, 3))}
    for first, order in ((1, (0, 1)), (3, (1, 0))):
        ys = [ev.table.make("param", (first + g,), (), (3, 3), "f32") for g in range(2)]
        for g, y in enumerate(ys):
            ev.boxes[y] = (whole, ((order[g], order[g] + 1), (0, 3), (0, 3)))
            values[first + g] = values[0][order[g]]
        received = ev.concat([ev.slice_term(y, 0, 1, 2) for y in ys], 0)
        term = ev.reshape_term(received, Shape("f32", (2, 1, 3)))
        assert (whole in set(_leaves(term))) == (order == (0, 1))
        np.testing.assert_array_equal(evaluate(term, values), np.stack([values[0][g][1:2] for g in order]))


def _leaves(t):
    if not t.args:
        yield t
    for arg in t.args:
        yield from _leaves(arg)


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, D, E = 8, 8, 6


    def inputs():
        return jax.ShapeDtypeStruct((B, D), jnp.float32), jax.ShapeDtypeStruct((D, E), jnp.float32)


    def project(x, w):
        return jnp.tanh(x) @ w


    def _project_a2a(x, w, mesh, concat_axis):
        def body(x, w):
            cols = lax.all_to_all(jnp.tanh(x), "tp", split_axis=1, concat_axis=concat_axis, tiled=True)
            return lax.psum(cols.reshape(B, -1) @ w, "tp")

        return jax.shard_map(body, mesh=mesh, in_specs=(P("tp", None), P("tp", None)), out_specs=P())(x, w)


    def project_a2a(x, w, *, mesh):
        return _project_a2a(x, w, mesh, 0)


    def project_a2a_wrong_axis(x, w, *, mesh):
        return _project_a2a(x, w, mesh, 1)  # MARK:wrong_axis
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: a2a-rows-to-columns, reference: m.py:project, distributed: m.py:project_a2a, inputs: m.py:inputs,
         mesh: {tp: 2}}
      - {name: a2a-wrong-concat-axis, reference: m.py:project, distributed: m.py:project_a2a_wrong_axis,
         inputs: m.py:inputs, mesh: {tp: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("relaid"), "m.py", MODELS, MANIFEST)


def test_an_explicit_all_to_all_from_rows_to_columns_verifies(manifest) -> None:
    result = _verify(manifest, "a2a-rows-to-columns")
    assert result.status is Status.VERIFIED, result.findings


def test_blocks_joined_along_the_wrong_dim_are_a_mismatch(manifest) -> None:
    result = _verify(manifest, "a2a-wrong-concat-axis")
    assert result.status is Status.MISMATCH, (result.status, result.findings)
