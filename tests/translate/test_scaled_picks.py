"""A vocabulary-parallel pick of scaled logits (Gemma's soft-capping, `cap * tanh(l / cap)`; a
temperature): the builder moves the constant factor out of the gather and out of the output mask,
so the psum's members read `c * where(mine, pick, 0)` while the lookup it knows is `c * pick`
(equivci/translate/masks.py, `masked_member`). Exact: the masked elements are zeros either way.

Styles: `where` on the local index and on the pick (take_along_axis, mode="clip"); the bare offset
index clamped by the gather and the pick multiplied by the converted mask, under a temperature.
Near misses: the mask of the other device's shard (a take of the unowned shard), and the pick
halved (a factor of the member that is not the lookup's): both must come out `mismatch`.
"""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest
from model_package import capture_named, programs_of
from model_package import model_named as _model

from equivci.hlo.ir import Shape
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.terms.spec import GatherDims
from equivci.translate.evaluator import Evaluator
from equivci.translate.masks import index_window, masked_lookup, tiled_lookup
from equivci.verify.engine import verify_model

MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    V, D = 16, 16  # the oracle draws ids in [0, smallest float dim): every shard's ids occur
    CAP, TEMP = 30.0, 0.5


    def inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)  # noqa: E731
        return f(V, D), f(D, V), jax.ShapeDtypeStruct((V,), jnp.int32)


    def _capped(h, w):
        return CAP * jnp.tanh((h @ w) / CAP)


    def _cooled(h, w):
        return (h @ w) / TEMP


    def _xent(logits, labels):
        lse = jax.nn.logsumexp(logits, axis=-1)
        return lse - jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]


    def capped_xent(h, w, labels):
        return _xent(_capped(h, w), labels)


    def cooled_xent(h, w, labels):
        return _xent(_cooled(h, w), labels)


    def _where_pick(logits, labels, lo, owner):
        n = logits.shape[-1]
        mine = (labels >= owner) & (labels < owner + n)
        local = jnp.where(mine, labels - lo, 0)
        picked = jnp.take_along_axis(logits, local[:, None], axis=-1, mode="clip")[:, 0]
        return jnp.where(mine, picked, 0.0)


    def _product_pick(logits, labels, lo, owner):
        n = logits.shape[-1]
        mine = ((labels >= owner) & (labels < owner + n)).astype(logits.dtype)
        return jnp.take_along_axis(logits, (labels - lo)[:, None], axis=-1, mode="clip")[:, 0] * mine


    def _tp(h, w, labels, mesh, make, pick):
        def body(h, w, labels):
            logits = make(h, w)
            n = logits.shape[-1]
            lo = lax.axis_index("tp") * n
            m = lax.pmax(jnp.max(logits, axis=-1), "tp")
            lse = m + jnp.log(lax.psum(jnp.sum(jnp.exp(logits - m[:, None]), axis=-1), "tp"))
            return lse - lax.psum(pick(logits, labels, lo), "tp")

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "tp"), P()), out_specs=P())(h, w, labels)


    def capped_where(h, w, labels, *, mesh):
        return _tp(h, w, labels, mesh, _capped, lambda l, t, lo: _where_pick(l, t, lo, lo))


    def cooled_product(h, w, labels, *, mesh):
        return _tp(h, w, labels, mesh, _cooled, lambda l, t, lo: _product_pick(l, t, lo, lo))


    def capped_unowned(h, w, labels, *, mesh):
        other = lambda lo: V // 2 - lo  # noqa: E731
        return _tp(h, w, labels, mesh, _capped, lambda l, t, lo: _where_pick(l, t, lo, other(lo)))  # MARK:unowned


    def capped_halved(h, w, labels, *, mesh):
        return _tp(h, w, labels, mesh, _capped, lambda l, t, lo: 0.5 * _where_pick(l, t, lo, lo))  # MARK:halved
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: capped-where, reference: m.py:capped_xent, distributed: m.py:capped_where, inputs: m.py:inputs,
         mesh: {tp: 2}}
      - {name: cooled-product, reference: m.py:cooled_xent, distributed: m.py:cooled_product, inputs: m.py:inputs,
         mesh: {tp: 2}}
      - {name: cooled-product-tp4, reference: m.py:cooled_xent, distributed: m.py:cooled_product, inputs: m.py:inputs,
         mesh: {tp: 4}}
      - {name: capped-unowned, reference: m.py:capped_xent, distributed: m.py:capped_unowned, inputs: m.py:inputs,
         mesh: {tp: 2}}
      - {name: capped-halved, reference: m.py:capped_xent, distributed: m.py:capped_halved, inputs: m.py:inputs,
         mesh: {tp: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("scaled_picks"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["capped-where", "cooled-product", "cooled-product-tp4"])
def test_a_masked_pick_of_scaled_logits_verifies(manifest, name):
    result = verify_model(_model(manifest, name), manifest, capture_named(manifest, name))
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["capped-where", "cooled-product"])
def test_the_collapsed_psum_of_scaled_picks_is_their_sum(manifest, name):
    """On random inputs, ids in [0, 16): each all-reduce's term is the sum of its members (the
    masked, scaled picks), and every lookup the evaluator knows is the full pick where its mask holds."""
    captured = capture_named(manifest, name)
    programs = programs_of(captured)
    ev = programs.evaluator
    rng = np.random.default_rng(3)
    params = {k: rng.integers(0, 16, leaf.shape) if leaf.dtype == "int32" else rng.standard_normal(leaf.shape)
              for k, leaf in enumerate(captured.inputs)}
    value = lambda t: evaluate(t, params, ev.values)  # noqa: E731
    by_name = {e.inst.name: e for e in programs.distributed_events}
    sums = [e for e in programs.distributed_events if e.inst.opcode == "all-reduce" and "pmax" not in e.inst.name]
    assert sums
    for event in sums:
        members = [value(t) for t in by_name[event.inst.operands[0]].values]
        np.testing.assert_allclose(value(event.values[0]), sum(members[1:], members[0]), rtol=1e-5, atol=1e-5)
    assert ev.masked_rows and all(ev.scale_of(rows)[0] != 1 for rows in ev.masked_rows)
    for rows, known in ev.masked_rows.items():
        ids = value(known.window.x).reshape(-1)[known.labels]
        holds = (ids >= known.window.lo) & (ids < known.window.hi)
        assert holds.any()
        np.testing.assert_allclose(value(rows)[holds], value(known.full)[holds], rtol=1e-6)


@pytest.mark.parametrize("name", ["capped-unowned", "capped-halved"])
def test_a_pick_of_the_unowned_shard_or_of_another_factor_is_a_mismatch(manifest, name):
    model = _model(manifest, name)
    result = verify_model(model, manifest, capture_named(manifest, name))
    assert result.status is Status.MISMATCH, result.findings


def test_a_member_scaled_otherwise_than_its_lookup_is_no_lookup(manifest):
    """capped-halved's members are 15 * where(mine, pick, 0) against the lookup 30 * pick: the psum
    is no lookup of the full pick (the proof would read it as the reference's target logit)."""
    programs = programs_of(capture_named(manifest, "capped-halved"))
    ev = programs.evaluator
    by_name = {e.inst.name: e for e in programs.distributed_events}
    [psum] = [e for e in programs.distributed_events if e.inst.opcode == "all-reduce" and
              all(ev.scale_of(t)[0] == 15 for t in by_name[e.inst.operands[0]].values)]
    assert tiled_lookup(ev, by_name[psum.inst.operands[0]].values) is None


def test_a_wrapped_negative_index_reads_its_offset_where_the_ids_are_the_shards():
    """take_along_axis(rows, ids - 4, mode="clip") on a shard of 4 rows first wraps a negative index,
    where(ids - 4 < 0, ids - 4 + 4, ids - 4): asked for offset 4, the select reads row ids - 4 for
    ids in [4, 8) (the gather clamps past them), checked against XLA for every id; another offset
    is refused. The test and the offset are reshaped alike
    (a unit index dim), as the builder makes them: the window is of the ids themselves."""
    import jax.numpy as jnp

    ev = Evaluator(None, TermTable(), 1)
    s, unit = Shape("s32", (16,)), Shape("s32", (16, 1))
    c = lambda v, shape=unit: ev.const(np.full(shape.dims, v, np.int32), "s32")  # noqa: E731
    ids = ev.table.make("param", (0,), (), (16,), "s32")
    ev.bounds[ids] = (0.0, 15.0)
    local = ev.reshape_term(ev.normal("binary", ("subtract",), [ids, c(4, s)], s), unit)
    below = ev.normal("binary", ("compare-LT:s32",), [ev.reshape_term(ids, unit), c(4)], Shape("pred", (16, 1)))
    wrapped = ev.normal("ternary", ("select",), [below, ev.normal("binary", ("add",), [local, c(4)], unit), local], unit)
    found = index_window(ev, wrapped, 4, 4)
    assert found is not None
    w, shift = found
    assert (w.x, w.lo, w.hi, shift) == (ids, 4, 8, 4)
    assert index_window(ev, wrapped, 4) == found
    assert index_window(ev, wrapped, 4, 0) is None and index_window(ev, wrapped, 4, 7) is None
    table = np.arange(16 * 3, dtype=np.float32).reshape(3, 16)
    values = np.arange(16, dtype=np.int32)
    taken = np.asarray(jnp.take_along_axis(jnp.asarray(table[:, 4:8]), jnp.asarray(np.tile(values - 4, (3, 1))),
                                           axis=1, mode="clip"))
    reads_own = np.all(taken == table[:, values], axis=0)
    np.testing.assert_array_equal(reads_own[(w.lo <= values) & (values < w.hi)], True)


def test_a_reshape_has_the_bounds_of_its_operand_and_an_offset_none_unstated():
    """The elements of reshape(ids) are the ids' (a test of it, built inside a fact, is then
    decided by them); ids - 4 made without bounds has none (its range is not the ids')."""
    ev = Evaluator(None, TermTable(), 1)
    ids = ev.table.make("param", (0,), (), (16,), "s32")
    ev.bounds[ids] = (0.0, 15.0)
    four = ev.const(np.full((16,), 4, np.int32), "s32")
    assert ev.bounds_of(ev.reshape_term(ids, Shape("s32", (16, 1)))) == (0.0, 15.0)
    assert ev.bounds_of(ev.table.make("binary", ("subtract",), (ids, four), (16,), "s32")) is None


@pytest.mark.parametrize("form", ["where", "clip", "bare"])
@pytest.mark.parametrize("offset", [7, 8, 9])
def test_a_lookup_at_another_offset_than_its_windows_start_is_no_lookup(offset, form):
    """rows = T[8:16][local] with local = where(ids in [8, 16), ids - offset, 0), clip(ids - offset,
    0, 7) or ids - offset itself: only offset 8 reads T[ids] (where the ids lie in [8, 16)); ids - 7
    reads the next row and ids - 9 the previous one on the ids the gather's clamp leaves as they are,
    so neither is a lookup of T[ids] on any window, however narrow."""
    ev = Evaluator(None, TermTable(), 1)
    s = Shape("s32", (6,))
    c = lambda v: ev.const(np.full((6,), v, np.int32), "s32")  # noqa: E731
    ids = ev.table.make("param", (0,), (), (6,), "s32")
    ev.bounds[ids] = (0.0, 15.0)
    table = ev.table.make("param", (1,), (), (16, 3), "f32")
    shard = ev.slice_term(table, 0, 8, 16)
    cmp = lambda d, k: ev.normal("binary", (f"compare-{d}:s32",), [ids, c(k)], Shape("pred", (6,)))  # noqa: E731
    mine = ev.normal("binary", ("and",), [cmp("GE", 8), cmp("LT", 16)], Shape("pred", (6,)))
    shifted = ev.normal("binary", ("subtract",), [ids, c(offset)], s)
    local = {"where": lambda: ev.normal("ternary", ("select",), [mine, shifted, c(0)], s),
             "clip": lambda: ev.normal("ternary", ("clamp",), [c(0), shifted, c(7)], s),
             "bare": lambda: shifted}[form]()
    dims = GatherDims((1,), (0,), (0,), (), (), 1, (1, 3))
    found = masked_lookup(ev, shard, local, dims, Shape("f32", (6, 3)))
    assert (found is not None) is (offset == 8)
    if found is not None:
        assert (found.window.x, found.window.lo, found.window.hi) == (ids, 8, 16)
