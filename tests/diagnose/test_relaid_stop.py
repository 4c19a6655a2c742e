"""A proof stop that is only a layout the proof lacks does not hide the difference after it: a
device's query heads are a slice of the projection the reference reshapes and transposes into heads
(the same data laid out anew), so nothing says the values differ there; numerics shows the first
difference at the masked scores, which are computed in code both programs run from a mask the
distributed program's own helper makes, passed in as `mask_fn`: that helper's line leads. Near miss:
the same model with the reference's mask is never `mismatch`."""

from __future__ import annotations

import textwrap

import pytest
from model_package import line_of, manifest_text, verify_named, write_package

from equivci.results import Status

MODEL = textwrap.dedent(
    """
    import functools

    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, S, D, H = 2, 8, 16, 4
    HD = D // H


    def inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
        return f(D, D), f(D, D), f(D, D), f(D, D), f(B, S, D)


    def causal_bias(s):
        qi = lax.broadcasted_iota(jnp.int32, (s, s), 0)
        ki = lax.broadcasted_iota(jnp.int32, (s, s), 1)
        return jnp.where(qi >= ki, 0.0, -1e9)


    def causal_bias_strict(s):
        qi = lax.broadcasted_iota(jnp.int32, (s, s), 0)
        ki = lax.broadcasted_iota(jnp.int32, (s, s), 1)
        return jnp.where(qi > ki, 0.0, -1e9)  # MARK:strict


    def attention(x, wq, wk, wv, wo, mask_fn=causal_bias):
        b, s, _ = x.shape
        heads = lambda t: t.reshape(b, s, -1, HD).transpose(0, 2, 1, 3)
        q, k, v = heads(x @ wq.T), heads(x @ wk.T), heads(x @ wv.T)
        scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(HD).astype(x.dtype) + mask_fn(s)
        out = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)
        return out.transpose(0, 2, 1, 3).reshape(b, s, -1) @ wo.T


    def block(wq, wk, wv, wo, x):
        return x + attention(x, wq, wk, wv, wo)


    def _local(wq, wk, wv, wo, x, mask_fn=causal_bias):
        return x + lax.psum(attention(x, wq, wk, wv, wo, mask_fn=mask_fn), "model")


    def _tp(local, wq, wk, wv, wo, x, mesh):
        col, row = P("model", None), P(None, "model")
        return jax.shard_map(local, mesh=mesh, in_specs=(col, col, col, row, P()), out_specs=P(),
                             check_vma=False)(wq, wk, wv, wo, x)


    def block_tp(wq, wk, wv, wo, x, mesh):
        return _tp(_local, wq, wk, wv, wo, x, mesh)


    def block_tp_strict(wq, wk, wv, wo, x, mesh):
        return _tp(functools.partial(_local, mask_fn=causal_bias_strict), wq, wk, wv, wo, x, mesh)
    """
).lstrip()

MANIFEST = manifest_text([("tp", "block", "block_tp"), ("tp-strict", "block", "block_tp_strict")], "{model: 4}")


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("relaid_stop"), "model.py", MODEL, MANIFEST)


def test_near_miss_the_reference_mask_is_no_mismatch(manifest):
    assert verify_named(manifest, "tp").status != Status.MISMATCH


def test_the_mask_helper_leads_past_a_stop_at_a_head_layout(manifest):
    result = verify_named(manifest, "tp-strict")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("model.py", line_of(MODEL, "strict")), result.findings
