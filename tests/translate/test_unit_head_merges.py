"""A device's one attention head merged back into [b, s, hd] and projected out (row parallel):

- a reshape that only drops size-1 dims is the same reshape of its operand with those dims moved to
  just before its last dim by a transpose (translate/shapes.py, `unit_dims_moved`): moving a size-1
  dim moves no element. `out.transpose(0, 2, 1, 3).reshape(b, s, h * hd)` of a device's one head,
  which XLA writes as a reshape of its [b, 1, s, hd] slab, is then the reference's transpose and
  merge of its heads, cut at that head's window; XLA's partitioner writes the same merge of a
  jit-partitioned device's one head as a transpose that moves only the size-1 head dim, then the
  reshape: such a transpose moves no element, and the reshape of it is stated as the reshape of its
  operand is (`unit_moves_undone`), never for a transpose that moves other dims;
- a reduction of members reshaped alike is, beside the reshape of the reduction of their operands,
  the reduction of the members as written (translate/collectives.py, `_written_combination`),
  reshape(x) + reshape(y) = reshape(x + y): each device's dot with its rows of the output
  projection is a piece of the reference's contraction only as written, and the pieces merge there.

Checked against XLA on one device (the stated forms evaluate to what XLA computes), on terms built
directly (the stated sum evaluates to the lifted one), and end to end on four devices of four heads
in four styles (`x @ w` heads transposed, HF's `x @ w.T` on [out, in] slabs, the heads moved with
an einsum before the merge, jit-partitioned from sharding constraints), with near misses: the output
projection's rows of the next head (shard_map and jit), the values of the next head.
"""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import one_device
import pytest
from model_package import verify_named as _verify

from equivci.hlo.ir import Shape
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.collectives import combine
from equivci.translate.evaluator import Evaluator
from equivci.translate.shapes import unit_moves_undone

RNG = np.random.default_rng(53)


def _one_head_merged(o):
    return o.transpose(0, 2, 1, 3).reshape(2, 8, 4) * 2.0


def test_a_squeeze_with_its_unit_dims_moved_computes_what_xla_computes():
    o = RNG.standard_normal((2, 1, 8, 4)).astype(np.float32)
    programs, want, _ = one_device.programs(_one_head_merged, (o,))
    ev = programs.evaluator
    moved = [g for g in ev.equal_terms if any(t.op == "reshape" and t.args[0].op == "transpose" for t in g)]
    assert moved, ev.equal_terms
    for group in moved:
        values = [evaluate(t, {0: o}, ev.values) for t in group]
        for v in values[1:]:
            np.testing.assert_array_equal(v, values[0])
    np.testing.assert_allclose(evaluate(programs.reference_outputs[0], {0: o}, ev.values), want, rtol=1e-6)


def _stated_groups_agree(fn, x) -> int:
    """How many stated groups hold a reshape of a transpose; every member of each evaluates alike."""
    programs, _, _ = one_device.programs(fn, (x,))
    ev = programs.evaluator
    moved = [g for g in ev.equal_terms if any(t.op == "reshape" and t.args[0].op == "transpose" for t in g)]
    for group in moved:
        values = [evaluate(t, {0: x}, ev.values) for t in group]
        for v in values[1:]:
            np.testing.assert_array_equal(v, values[0])
    return len(moved)


def test_a_transpose_moving_only_unit_dims_is_undone_under_a_reshape():
    ev = Evaluator(None, TermTable(), 1)
    o = ev.table.make("param", (0,), (), (2, 1, 8, 4), "f32")
    unit_only = ev.transpose_term(o, (0, 2, 1, 3))
    assert unit_moves_undone(unit_only) is o
    other = ev.transpose_term(o, (0, 3, 1, 2))
    assert unit_moves_undone(other) is other


def test_a_merge_of_a_transpose_of_other_dims_is_no_squeeze():
    # [2, 1, 4, 4] -> [2, 4, 1, 4] moving the last dim: the reshape is each matrix transposed
    o = RNG.standard_normal((2, 1, 4, 4)).astype(np.float32)
    _stated_groups_agree(lambda o: o.transpose(0, 3, 1, 2).reshape(2, 4, 4) * 2.0, o)
    assert _stated_groups_agree(lambda o: o.transpose(0, 2, 1, 3).reshape(2, 4, 4) * 2.0, o)


def test_a_sum_of_members_reshaped_alike_is_stated_as_written():
    ev = Evaluator(None, TermTable(), 1)
    xs = [ev.table.make("param", (k,), (), (2, 1, 8, 4), "f32") for k in range(3)]
    members = [ev.reshape_term(x, Shape("f32", (2, 8, 4))) for x in xs]
    lifted = combine(ev, "add", members)
    stated = [g for g in ev.equal_terms if lifted in g]
    assert stated, ev.equal_terms
    values = {k: RNG.standard_normal((2, 1, 8, 4)).astype(np.float32) for k in range(3)}
    want = sum(v.reshape(2, 8, 4) for v in values.values())
    for group in stated:
        written = [t for t in group if t is not lifted]
        assert any(t.op == "binary" and members[2] in t.args for t in written), group
        for t in group:
            np.testing.assert_allclose(evaluate(t, values, ev.values), want, rtol=1e-6)


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P

    B, S, D, H = 2, 8, 32, 4
    HD = D // H


    def inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
        return f(D, D), f(D, D), f(D, D), f(D, D), f(B, S, D)


    def _context(wq, wk, wv, x, proj):
        b, s, _ = x.shape
        heads = lambda t: t.reshape(b, s, -1, HD).transpose(0, 2, 1, 3)
        q, k, v = (heads(proj(x, w)) for w in (wq, wk, wv))
        probs = jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k), axis=-1)
        return jnp.einsum("bhqk,bhkd->bhqd", probs, v)


    def attention(wq, wk, wv, wo, x):
        o = _context(wq, wk, wv, x, lambda x, w: x @ w)
        return o.transpose(0, 2, 1, 3).reshape(*x.shape[:2], -1) @ wo


    def attention_hf(wq, wk, wv, wo, x):
        o = _context(wq, wk, wv, x, lambda x, w: x @ w.T)
        return o.transpose(0, 2, 1, 3).reshape(*x.shape[:2], -1) @ wo.T


    def attention_einsum_merge(wq, wk, wv, wo, x):
        o = jnp.einsum("bhqd->bqhd", _context(wq, wk, wv, x, lambda x, w: x @ w))
        return jnp.einsum("bqf,fe->bqe", o.reshape(*x.shape[:2], -1), wo)


    def _tp(fn, col, row):
        def run(wq, wk, wv, wo, x, *, mesh):
            local = lambda *a: lax.psum(fn(*a), "model")
            return jax.shard_map(local, mesh=mesh, in_specs=(col, col, col, row, P()), out_specs=P(),
                                 check_vma=False)(wq, wk, wv, wo, x)

        return run


    heads_tp = _tp(attention, P(None, "model"), P("model", None))
    heads_hf_tp = _tp(attention_hf, P("model", None), P(None, "model"))
    heads_einsum_tp = _tp(attention_einsum_merge, P(None, "model"), P("model", None))


    def _jit_tp(wq, wk, wv, wo, x, mesh, shift):
        def run(wq, wk, wv, wo, x):
            put = lambda t, *spec: lax.with_sharding_constraint(t, NamedSharding(mesh, P(*spec)))
            q, k, v = (put(w, None, "model") for w in (wq, wk, wv))
            o = put(_context(q, k, v, x, lambda x, w: x @ w), None, "model")
            rows = put(jnp.roll(wo, -shift, axis=0), "model", None)
            return o.transpose(0, 2, 1, 3).reshape(*x.shape[:2], -1) @ rows

        return jax.jit(run)(wq, wk, wv, wo, x)


    def heads_jit_tp(wq, wk, wv, wo, x, *, mesh):
        return _jit_tp(wq, wk, wv, wo, x, mesh, 0)


    def heads_jit_next_out_rows(wq, wk, wv, wo, x, *, mesh):
        return _jit_tp(wq, wk, wv, wo, x, mesh, HD)


    def heads_next_out_rows(wq, wk, wv, wo, x, *, mesh):
        return heads_tp(wq, wk, wv, jnp.roll(wo, -HD, axis=0), x, mesh=mesh)


    def heads_next_values(wq, wk, wv, wo, x, *, mesh):
        return heads_tp(wq, wk, jnp.roll(wv, -HD, axis=1), wo, x, mesh=mesh)
    """
)

CASES = [
    ("heads_tp", "attention", "heads_tp"),
    ("heads_hf_tp", "attention_hf", "heads_hf_tp"),
    ("heads_einsum_tp", "attention_einsum_merge", "heads_einsum_tp"),
    ("heads_jit_tp", "attention", "heads_jit_tp"),
    ("heads_next_out_rows", "attention", "heads_next_out_rows"),
    ("heads_jit_next_out_rows", "attention", "heads_jit_next_out_rows"),
    ("heads_next_values", "attention", "heads_next_values"),
]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    text = model_package.manifest_text(CASES, "{model: 4}")
    return model_package.write_package(tmp_path_factory.mktemp("unit_head_merges"), "model.py", MODELS, text)


@pytest.mark.parametrize("name", ["heads_tp", "heads_hf_tp", "heads_einsum_tp", "heads_jit_tp"])
def test_one_head_per_device_projected_out_verifies(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["heads_next_out_rows", "heads_next_values", "heads_jit_next_out_rows"])
def test_near_misses_of_one_head_projected_out_are_mismatches(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (name, result.findings)
