"""Work the reference applies to a value (a residual add) that another use of the same value in
the distributed program does apply is missing at the use that lacks it, not where the value is
made."""

from __future__ import annotations

import textwrap

import pytest
from model_package import line_of, verify_named, write_package

from equivci.results import Status

MODEL = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    T, D, F = 8, 8, 16


    def inputs():
        f = jnp.float32
        return (jax.ShapeDtypeStruct((T, D), f), jax.ShapeDtypeStruct((D, D), f),
                jax.ShapeDtypeStruct((D, F), f), jax.ShapeDtypeStruct((F, D), f))


    def causal(x, wk, w1, w2):
        xb = jnp.stack([x, 2 * x])
        s = jnp.einsum("bqd,bkd->bqk", xb, xb @ wk)
        qi = jnp.arange(T)[:, None]
        s = jnp.where(jnp.arange(T)[None, :] <= qi, s, -1e9)
        return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(s, axis=-1), xb).sum(0)


    def _seq(body, x, wk, w1, w2, mesh):
        return jax.shard_map(body, mesh=mesh, in_specs=(P("sp"), P(), P(), P()), out_specs=P("sp"))(x, wk, w1, w2)


    def causal_sp_strict(x, wk, w1, w2, *, mesh):
        def body(xs, wk, w1, w2):
            n = xs.shape[0]
            x_all = lax.all_gather(xs, "sp", tiled=True)
            xq, xk = jnp.stack([xs, 2 * xs]), jnp.stack([x_all, 2 * x_all])
            s = jnp.einsum("bqd,bkd->bqk", xq, xk @ wk)
            qi = lax.axis_index("sp") * n + lax.broadcasted_iota(jnp.int32, (n, T), 0)
            seen = lax.broadcasted_iota(jnp.int32, (n, T), 1) < qi  # MARK:mask
            s = jnp.where(seen, s, -1e9)
            return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(s, axis=-1), xk).sum(0)

        return _seq(body, x, wk, w1, w2, mesh)


    def _rms(h):
        return h * lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6)


    def residual(x, wk, w1, w2):
        h = x + jnp.tanh(x @ wk)
        return h + jax.nn.relu(_rms(h) @ w1) @ w2


    def _cols(body, x, wk, w1, w2, mesh):
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P(None, "tp"), P("tp")), out_specs=P())(
            x, wk, w1, w2)


    def residual_tp_norm_of_branch(x, wk, w1, w2, *, mesh):
        def body(x, wk, w1, w2):
            a = jnp.tanh(x @ wk)  # MARK:branch
            up = jax.nn.relu(_rms(a) @ w1)  # MARK:use
            return x + a + lax.psum(up @ w2, "tp")

        return _cols(body, x, wk, w1, w2, mesh)
    """
).lstrip()

MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {name}, reference: model.py:{ref}, distributed: model.py:{name}, inputs: model.py:inputs, "
    f"mesh: {{{axis}: 2}}}}\n"
    for name, ref, axis in (("causal_sp_strict", "causal", "sp"), ("residual_tp_norm_of_branch", "residual", "tp"))
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("numeric_lead"), "model.py", MODEL, MANIFEST)


def test_missing_work_another_use_applies_is_missing_at_the_use(manifest):
    result = verify_named(manifest, "residual_tp_norm_of_branch")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("model.py", line_of(MODEL, "use")), result.findings
