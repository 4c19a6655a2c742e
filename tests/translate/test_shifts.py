"""Online softmax across shards (equivci/translate/shifts.py): ring attention whose accumulator and
denominator are rescaled by exp(old max - new max) as the running max grows, K/V blocks arriving in
rotated order, against the reference's softmax; in two output layouts, with the running max and sum
kept as [..., 1] (keepdims: elementwise.unit_reshaped). Near misses: an accumulator
not rescaled while its denominator is, a rescale from the block's max instead of the previous running
max, one by the factor broadcast along the wrong dim, a keepdims accumulator not rescaled and one
rescaled by the factor squared are mismatch.
"""

from __future__ import annotations

import textwrap

import model_package
import pytest
from model_package import capture_named
from model_package import model_named as _model

from equivci.hlo.ir import Shape
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.translate import shifts
from equivci.translate.evaluator import Evaluator
from equivci.verify.engine import verify_model

MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, L, NH, D = 1, 16, 2, 4  # D = L / 4: a factor broadcast along the wrong dim is well shaped


    def inputs():
        spec = jax.ShapeDtypeStruct((B, L, NH, D), jnp.float32)
        return spec, spec, spec


    def _scores(q, k):
        return jnp.einsum("bqhd,bkhd->bhqk", q, k) * D ** -0.5


    def attention(q, k, v):  # [b, h, q, d]
        return jnp.einsum("bhqk,bkhd->bhqd", jax.nn.softmax(_scores(q, k), axis=-1), v)


    def attention_bqhd(q, k, v):  # XLA writes this one as dot(v, probs), then transposes
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(_scores(q, k), axis=-1), v)


    def _online(q, k, v, rescale, spread=lambda alpha: alpha[..., None]):
        n = lax.axis_size("ring")
        perm = [(j, (j + 1) % n) for j in range(n)]

        def step(_, c):
            acc, m, den, k, v = c
            s = _scores(q, k)
            new = jnp.maximum(m, s.max(-1))
            p = jnp.exp(s - new[..., None])
            alpha = rescale(m, new, s)
            acc = acc * spread(alpha) + jnp.einsum("bhqk,bkhd->bhqd", p, v)
            den = den * jnp.exp(m - new) + p.sum(-1)
            return acc, new, den, lax.ppermute(k, "ring", perm), lax.ppermute(v, "ring", perm)

        b, lq, h, d = q.shape
        c = (jnp.zeros((b, h, lq, d)), jnp.full((b, h, lq), -jnp.inf), jnp.zeros((b, h, lq)), k, v)
        acc, _, den, _, _ = lax.fori_loop(0, n, step, c)
        return acc / den[..., None]


    def _ring(rescale, transposed=False, **kw):
        def run(q, k, v):
            seq = P(None, "ring")
            body = lambda q, k, v: _online(q, k, v, rescale, **kw)
            if transposed:
                return jax.shard_map(lambda q, k, v: body(q, k, v).transpose(0, 2, 1, 3), in_specs=(seq,) * 3,
                                     out_specs=seq, check_vma=False)(q, k, v)
            return jax.shard_map(body, in_specs=(seq,) * 3, out_specs=P(None, None, "ring"), check_vma=False)(q, k, v)
        return run


    def _online_kept(q, k, v, rescale):
        # the same ring with its running max and denominator kept as [..., 1] (keepdims)
        n = lax.axis_size("ring")
        perm = [(j, (j + 1) % n) for j in range(n)]

        def step(_, c):
            acc, m, den, k, v = c
            s = _scores(q, k)
            new = jnp.maximum(m, s.max(-1, keepdims=True))
            p = jnp.exp(s - new)
            acc = acc * rescale(m, new) + jnp.einsum("bhqk,bkhd->bhqd", p, v)
            den = den * jnp.exp(m - new) + p.sum(-1, keepdims=True)
            return acc, new, den, lax.ppermute(k, "ring", perm), lax.ppermute(v, "ring", perm)

        b, lq, h, d = q.shape
        c = (jnp.zeros((b, h, lq, d)), jnp.full((b, h, lq, 1), -jnp.inf), jnp.zeros((b, h, lq, 1)), k, v)
        acc, _, den, _, _ = lax.fori_loop(0, n, step, c)
        return acc / den


    def _ring_kept(rescale):
        body = lambda q, k, v: _online_kept(q, k, v, rescale)
        seq = P(None, "ring")
        return lambda q, k, v: jax.shard_map(body, in_specs=(seq,) * 3, out_specs=P(None, None, "ring"),
                                             check_vma=False)(q, k, v)


    ring = _ring(lambda m, new, s: jnp.exp(m - new))
    ring_kept = _ring_kept(lambda m, new: jnp.exp(m - new))
    ring_kept_no_rescale = _ring_kept(lambda m, new: jnp.ones_like(m))
    ring_kept_twice = _ring_kept(lambda m, new: jnp.exp(2.0 * (m - new)))
    ring_bqhd = _ring(lambda m, new, s: jnp.exp(m - new), transposed=True)
    ring_no_rescale = _ring(lambda m, new, s: jnp.ones_like(m))  # MARK:no_rescale
    ring_block_max = _ring(lambda m, new, s: jnp.exp(s.max(-1) - new))  # MARK:block_max
    ring_across = _ring(lambda m, new, s: jnp.exp(m - new), spread=lambda alpha: alpha[:, :, None, :])  # MARK:across
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: ring, reference: m.py:attention, distributed: m.py:ring, inputs: m.py:inputs, mesh: {ring: 4}}
      - {name: ring-kept, reference: m.py:attention, distributed: m.py:ring_kept, inputs: m.py:inputs, mesh: {ring: 4}}
      - {name: kept-no-rescale, reference: m.py:attention, distributed: m.py:ring_kept_no_rescale, inputs: m.py:inputs, mesh: {ring: 4}}
      - {name: kept-twice, reference: m.py:attention, distributed: m.py:ring_kept_twice, inputs: m.py:inputs, mesh: {ring: 4}}
      - {name: ring-bqhd, reference: m.py:attention_bqhd, distributed: m.py:ring_bqhd, inputs: m.py:inputs, mesh: {ring: 4}}
      - {name: no-rescale, reference: m.py:attention, distributed: m.py:ring_no_rescale, inputs: m.py:inputs, mesh: {ring: 4}}
      - {name: block-max, reference: m.py:attention, distributed: m.py:ring_block_max, inputs: m.py:inputs, mesh: {ring: 4}}
      - {name: across, reference: m.py:attention, distributed: m.py:ring_across, inputs: m.py:inputs, mesh: {ring: 4}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("shift_models"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["ring", "ring-bqhd", "ring-kept"])
def test_ring_attention_with_online_softmax_verifies(manifest, name):
    result = verify_model(_model(manifest, name), manifest, capture_named(manifest, name))
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["no-rescale", "block-max", "across", "kept-no-rescale", "kept-twice"])
def test_a_wrong_rescale_is_mismatch(manifest, name):
    """The accumulator's exponentials keep the shifts of their blocks (not rescaled), are rescaled
    from the block's own max instead of the shift they have (the new shift right, the old one wrong),
    or by another query's factor (the factor along the head dim): the ratio is not the softmax."""
    result = verify_model(_model(manifest, name), manifest, capture_named(manifest, name))
    assert result.status is Status.MISMATCH, result.findings


@pytest.mark.parametrize("op, ordered", [("add", shifts.sorted_sum), ("maximum", shifts.sorted_max)])
def test_one_term_added_to_a_long_sum_is_checked_without_walking_the_sum(monkeypatch, op, ordered):
    """Work counted: whether x + y is a sum of shifted exponentials (or a max of reduce-maxima) is
    settled by its shallowest term that is not one. Adding a layer's output to the residual stream
    (a sum of every earlier layer's outputs) looks at a few terms, not at the depth of the sum: a
    walk of the whole sum at every layer made the translation quadratic in the number of layers."""
    ev = Evaluator(None, TermTable(), 1)
    x = [ev.table.make("param", (k,), (), (4,), "f32") for k in range(201)]
    stream = x[0]
    for term in x[1:200]:
        stream = ev.mk("binary", (op,), [stream, term], Shape("f32", (4,)))
    read: list = []
    monkeypatch.setattr(shifts, "_shifted_piece", lambda t, seen=shifts._shifted_piece: read.append(t) or seen(t))
    leaves: list = []
    monkeypatch.setattr(shifts, "_leaves", lambda t, o, seen=shifts._leaves: leaves.append(t) or seen(t, o))
    assert ordered(ev, stream, x[200]) is None
    assert len(read) <= 2 and not leaves
