"""A dot whose operands hold a size-1 batch dim pair is the same dot with either operand's size-1
batch dims moved to just before its last dim (translate/reductions.py, `unit_batch_moved`): moving a
size-1 dim is a reshape, no element moves, and the batch pairs keep their order. A tensor-parallel
device holding one attention head writes `q.transpose(0, 2, 1, 3)` of its [b, s, 1, hd] slab, which
XLA turns into a reshape to [b, 1, s, hd]; the reference's heads [b, s, h, hd] are transposed into
its dot's batch dims, its h where the device has no dim left to transpose. Stated for either operand
or both: attention's probabilities, a dot's output, keep their batch dims first.

Checked against XLA on one device (the stated forms evaluate to what XLA computes), end to end on
four devices of four heads in three styles (`x @ w` heads transposed; HF's `x @ w.T` on [out, in]
slabs; the reference's heads kept [b, s, h, hd] against the device's transposed ones), through the
probabilities' dot with the values, and by near misses: the keys of the next head, and the scores
transposed.
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

RNG = np.random.default_rng(31)


def _one_head_scores(q, k):
    heads = lambda t: t.reshape(2, 8, 1, 4).transpose(0, 2, 1, 3)  # noqa: E731
    return jnp.einsum("bhqd,bhkd->bhqk", heads(q), heads(k))


def test_a_dot_with_its_unit_batch_dims_moved_computes_what_xla_computes():
    q, k = (RNG.standard_normal((2, 8, 4)).astype(np.float32) for _ in range(2))
    programs, want, _ = one_device.programs(_one_head_scores, (q, k))
    ev = programs.evaluator
    dots = [g for g in ev.equal_terms if len(g) > 1 and all(t.op in ("dot", "transpose", "reshape") for t in g)]
    assert dots, ev.equal_terms
    for group in dots:
        values = [evaluate(t, {0: q, 1: k}, ev.values) for t in group]
        for v in values[1:]:
            np.testing.assert_allclose(v, values[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(evaluate(programs.reference_outputs[0], {0: q, 1: k}, ev.values), want, rtol=1e-5)


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    B, S, D, H = 2, 8, 32, 4
    HD = D // H


    def inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
        return f(D, D), f(D, D), f(D, D), f(B, S, D)


    def _transposed(t):
        b, s, _ = t.shape
        return t.reshape(b, s, -1, HD).transpose(0, 2, 1, 3)


    def attention(wq, wk, wv, x, proj=lambda x, w: x @ w, scores="bhqd,bhkd->bhqk"):
        q, k, v = (_transposed(proj(x, w)) for w in (wq, wk, wv))
        probs = jax.nn.softmax(jnp.einsum(scores, q, k), axis=-1)
        return jnp.einsum("bhqk,bhkd->bhqd", probs, v)


    def attention_hf(wq, wk, wv, x):
        return attention(wq, wk, wv, x, proj=lambda x, w: x @ w.T)


    def attention_bshd(wq, wk, wv, x):
        b, s, _ = x.shape
        q, k, v = ((x @ w).reshape(b, s, -1, HD) for w in (wq, wk, wv))
        probs = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k), axis=-1)
        return jnp.einsum("bhqk,bkhd->bhqd", probs, v)


    def _heads(fn, spec):
        def run(wq, wk, wv, x, *, mesh):
            return jax.shard_map(fn, mesh=mesh, in_specs=(spec, spec, spec, P()), out_specs=P(None, "model"),
                                 check_vma=False)(wq, wk, wv, x)

        return run


    heads_tp = _heads(attention, P(None, "model"))
    heads_hf_tp = _heads(attention_hf, P("model", None))
    heads_bshd_ref_tp = _heads(attention, P(None, "model"))
    _heads_tp_of = _heads(attention, P(None, "model"))


    def heads_next_keys(wq, wk, wv, x, *, mesh):
        return _heads_tp_of(wq, jnp.roll(wk, -HD, axis=1), wv, x, mesh=mesh)  # each device: the next head's keys


    heads_scores_transposed = _heads(lambda wq, wk, wv, x: attention(wq, wk, wv, x, scores="bhqd,bhkd->bhkq"),
                                     P(None, "model"))
    """
)

CASES = [
    ("heads_tp", "attention", "heads_tp"),
    ("heads_hf_tp", "attention_hf", "heads_hf_tp"),
    ("heads_bshd_ref_tp", "attention_bshd", "heads_bshd_ref_tp"),
    ("heads_next_keys", "attention", "heads_next_keys"),
    ("heads_scores_transposed", "attention", "heads_scores_transposed"),
]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    text = model_package.manifest_text(CASES, "{model: 4}")
    return model_package.write_package(tmp_path_factory.mktemp("unit_head_dots"), "model.py", MODELS, text)


@pytest.mark.parametrize("name", ["heads_tp", "heads_hf_tp", "heads_bshd_ref_tp"])
def test_one_head_per_device_verifies(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["heads_next_keys", "heads_scores_transposed"])
def test_near_misses_of_one_head_per_device_are_mismatches(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (name, result.findings)
