"""Heads contracted with the output projection without merging them first (`einsum("bhqd,hde->bqe")`,
`einsum("btnh,nhd->btd")`), against a reference that merges its heads and multiplies by the flat
kernel:

- a dot contracting a dim that one operand's reshape merged from several dims is the dot contracting
  those dims against the other operand's dim split alike (translate/relayouts.py, `split_contraction`
  with `one_sided`): row-major, index i of the merged dim is the same tuple of split indices on
  both sides, so the sum over i is the sum over the tuples;
- a dot of an operand that a reshape squeezed (dropped size-1 dims, nothing else) is the dot of the
  unsqueezed operand, its size-1 dims contracted against size-1 dims inserted in the other operand
  (translate/reductions.py, `unit_contractions`): a sum over one index is its one term. A device
  holding one KV group of a native-GQA `dot_product_attention` contracts its context, the group
  squeezed out, with its rows of the output projection; the reference contracts its groups too.

Both stated beside the dot (its normal form kept). Checked against XLA on one device, and end to end:
two heads per device of a plain attention projected out by an einsum over [h, hd, d]; one KV group
per device of a native-GQA `dot_product_attention` with per-head [d, n, hd] weights, projected out by
an einsum over [n, hd, d]; near misses: the output projection's rows of the other heads, keys and
values swapped.
"""

from __future__ import annotations

import textwrap

import jax.numpy as jnp
import model_package
import numpy as np
import one_device
import pytest
from model_package import verify_named as _verify

from equivci.results import Status
from equivci.terms.semantics import evaluate

RNG = np.random.default_rng(59)


def _stated_dots(fn, args):
    """The groups of stated terms of fn's program that hold a dot, checked to evaluate alike; and
    the dots' operand shapes, per group."""
    programs, want, _ = one_device.programs(fn, args)
    ev = programs.evaluator
    values = dict(enumerate(args))
    groups = [g for g in ev.equal_terms if len(g) > 1 and all(t.op == "dot" for t in g)]
    for group in groups:
        first = evaluate(group[0], values, ev.values)
        for t in group[1:]:
            np.testing.assert_allclose(evaluate(t, values, ev.values), first, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(evaluate(programs.reference_outputs[0], values, ev.values), want, rtol=1e-5)
    return [[tuple(a.shape for a in t.args) for t in g] for g in groups]


def test_a_contraction_merged_on_one_side_is_stated_over_the_split_dims():
    o = RNG.standard_normal((2, 4, 3, 5)).astype(np.float32)  # [b, h, s, hd]
    w = RNG.standard_normal((20, 6)).astype(np.float32)
    shapes = _stated_dots(lambda o, w: o.transpose(0, 2, 1, 3).reshape(2, 3, 20) @ w, (o, w))
    assert any(((2, 4, 3, 5), (4, 5, 6)) in g for g in shapes), shapes


def test_a_squeezed_operand_is_stated_with_its_unit_dims_contracted():
    # heads and head_dim of one size: a pairing of the wrong dims would fit, and differ
    x = RNG.standard_normal((2, 1, 3, 3)).astype(np.float32)  # [b, one group, heads, hd]
    w = RNG.standard_normal((3, 3, 5)).astype(np.float32)
    shapes = _stated_dots(lambda x, w: jnp.einsum("bgh,ghd->bd", x.reshape(2, 3, 3), w), (x, w))
    assert any(((2, 1, 3, 3), (1, 3, 3, 5)) in g for g in shapes), shapes


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, S, D, HD = 2, 8, 32, 8
    NQ, NKV = 4, 2


    def inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
        return f(D, D), f(D, D), f(D, D), f(D, D), f(B, S, D)


    def _context(wq, wk, wv, x):
        b, s, _ = x.shape
        heads = lambda t: t.reshape(b, s, -1, HD).transpose(0, 2, 1, 3)
        q, k, v = heads(x @ wq), heads(x @ wk), heads(x @ wv)
        probs = jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k), axis=-1)
        return jnp.einsum("bhqk,bhkd->bhqd", probs, v)


    def attention(wq, wk, wv, wo, x):
        o = _context(wq, wk, wv, x)
        return o.transpose(0, 2, 1, 3).reshape(*x.shape[:2], -1) @ wo


    def _heads_out(wq, wk, wv, wo, x):
        return lax.psum(jnp.einsum("bhqd,hde->bqe", _context(wq, wk, wv, x), wo.reshape(-1, HD, D)), "model")


    def heads_einsum_tp(wq, wk, wv, wo, x, *, mesh):
        col = P(None, "model")
        return jax.shard_map(_heads_out, mesh=mesh, in_specs=(col, col, col, P("model", None), P()),
                             out_specs=P(), check_vma=False)(wq, wk, wv, wo, x)


    def heads_einsum_other_rows(wq, wk, wv, wo, x, *, mesh):
        return heads_einsum_tp(wq, wk, wv, jnp.roll(wo, 2 * HD, axis=0), x, mesh=mesh)


    def gqa_inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
        return f(D, NQ * HD), f(D, NKV * HD), f(D, NKV * HD), f(NQ * HD, D), f(B, S, D)


    def gqa(wq, wk, wv, wo, x):
        b, s, _ = x.shape
        split = lambda t: t.reshape(b, s, -1, HD)
        out = jax.nn.dot_product_attention(split(x @ wq), split(x @ wk), split(x @ wv))
        return out.reshape(b, s, -1) @ wo


    def _gqa_local(wq, wk, wv, wo, x):
        q, k, v = (jnp.einsum("bsd,dnh->bsnh", x, w) for w in (wq, wk, wv))
        out = jax.nn.dot_product_attention(q, k, v)
        return lax.psum(jnp.einsum("bsnh,nhd->bsd", out, wo), "model")


    def _gqa_tp(wq, wk, wv, wo, x, mesh):
        heads = P(None, "model", None)
        per_head = lambda w: w.reshape(D, -1, HD)
        return jax.shard_map(_gqa_local, mesh=mesh, in_specs=(heads, heads, heads, P("model", None, None), P()),
                             out_specs=P(), check_vma=False)(
            per_head(wq), per_head(wk), per_head(wv), wo.reshape(NQ, HD, D), x)


    def gqa_group_tp(wq, wk, wv, wo, x, *, mesh):
        return _gqa_tp(wq, wk, wv, wo, x, mesh)


    def gqa_group_kv_swapped(wq, wk, wv, wo, x, *, mesh):
        return _gqa_tp(wq, wv, wk, wo, x, mesh)
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    text = model_package.manifest_text(
        [
            ("heads_einsum_tp", "attention", "heads_einsum_tp"),
            ("heads_einsum_other_rows", "attention", "heads_einsum_other_rows"),
        ],
        "{model: 2}",
    )
    text += "".join(
        f"  - {{name: {name}, reference: model.py:gqa, distributed: model.py:{name}, inputs: model.py:gqa_inputs, "
        "mesh: {model: 2}}\n"
        for name in ("gqa_group_tp", "gqa_group_kv_swapped")
    )
    return model_package.write_package(tmp_path_factory.mktemp("split_heads"), "model.py", MODELS, text)


@pytest.mark.parametrize("name", ["heads_einsum_tp", "gqa_group_tp"])
def test_heads_contracted_with_the_split_projection_verify(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["heads_einsum_other_rows", "gqa_group_kv_swapped"])
def test_near_misses_of_heads_contracted_with_the_split_projection_are_mismatches(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (name, result.findings)
