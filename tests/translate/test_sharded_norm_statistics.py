"""Norm statistics over a feature dim split into shards: the mean and the variance are the psum of
per-shard sums divided by the full size, also when the sums are f32 of bf16 values. The device
broadcasts its psum-ed mean over its own features only, a window of the reference's broadcast
over all of them, which the builder holds under its 1/D factor (layouts/bcast_as_slice_scaled;
these two styles, whose block output the builder finds a window of the reference's, verify without
it too: blind split 20's cohere-bf16-dp-tp-scatter, an attention + MLP block, needs it).

* `layernorm_tp`: a bf16 MLP block's output (hidden columns over tp), its features psum_scatter'd
  over tp and its batch rows over dp, statistics in f32 from psum'd sums;
* `rmsnorm_tp`: the sum of squares psum'd in f32, written with `jnp.sum` and a division.
Near miss: the LayerNorm's variance taken over the local shard only (its mean psum'd)."""

from __future__ import annotations

import textwrap

import model_package
import pytest
from model_package import verify_named as _verify

from equivci.results import Status

MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, T, D, F = 2, 4, 32, 16


    def inputs():
        f = jnp.float32
        return (jax.ShapeDtypeStruct((B, T, D), jnp.bfloat16), jax.ShapeDtypeStruct((D, F), f),
                jax.ShapeDtypeStruct((F, D), f), jax.ShapeDtypeStruct((D,), f))


    def _mlp(x, w1, w2):
        h = jax.nn.gelu(jnp.einsum("btd,df->btf", x, w1.astype(jnp.bfloat16), preferred_element_type=jnp.float32))
        return jnp.einsum("btf,fd->btd", h.astype(jnp.bfloat16), w2.astype(jnp.bfloat16),
                          preferred_element_type=jnp.float32)


    def layernorm(x, w1, w2, g):
        y = x.astype(jnp.float32) + _mlp(x, w1, w2)
        mu = y.mean(-1, keepdims=True)
        var = ((y - mu) ** 2).mean(-1, keepdims=True)
        return ((y - mu) * lax.rsqrt(var + 1e-5) * g).astype(jnp.bfloat16)


    def rmsnorm(x, w1, w2, g):
        y = x.astype(jnp.float32) + _mlp(x, w1, w2)
        return (y * lax.rsqrt(jnp.mean(y * y, -1, keepdims=True) + 1e-6) * g).astype(jnp.bfloat16)


    def _scattered(x, w1, w2):
        # this device's features of the residual: the MLP's partial sum over its hidden columns,
        # psum_scatter'd over the features
        n = D // lax.axis_size("tp")
        mine = lax.dynamic_slice_in_dim(x, lax.axis_index("tp") * n, n, axis=2)
        part = _mlp(x, w1, w2)
        return mine.astype(jnp.float32) + lax.psum_scatter(part, "tp", scatter_dimension=2, tiled=True)


    def _layernorm_local(x, w1, w2, g, var_sum):
        y = _scattered(x, w1, w2)
        mu = lax.psum(y.sum(-1, keepdims=True), "tp") / D
        var = var_sum(((y - mu) ** 2).sum(-1, keepdims=True)) / D
        return ((y - mu) * lax.rsqrt(var + 1e-5) * g).astype(jnp.bfloat16)


    def _rmsnorm_local(x, w1, w2, g):
        y = _scattered(x, w1, w2)
        ss = lax.psum(jnp.sum(y * y, axis=-1, keepdims=True), "tp")
        return (y * lax.rsqrt(ss / D + 1e-6) * g).astype(jnp.bfloat16)


    def _features(fn, mesh):
        return jax.shard_map(fn, mesh=mesh, in_specs=(P("dp"), P(None, "tp"), P("tp"), P("tp")),
                             out_specs=P("dp", None, "tp"), check_vma=False)


    def layernorm_tp(x, w1, w2, g, *, mesh):
        psum = lambda s: lax.psum(s, "tp")
        return _features(lambda *a: _layernorm_local(*a, psum), mesh)(x, w1, w2, g)


    def layernorm_tp_local_var(x, w1, w2, g, *, mesh):
        local = lambda s: s * lax.axis_size("tp")  # MARK:local
        return _features(lambda *a: _layernorm_local(*a, local), mesh)(x, w1, w2, g)


    def rmsnorm_tp(x, w1, w2, g, *, mesh):
        return _features(_rmsnorm_local, mesh)(x, w1, w2, g)
    """
)

CASES = [
    ("layernorm-tp", "layernorm", "layernorm_tp"),
    ("layernorm-tp-local-var", "layernorm", "layernorm_tp_local_var"),
    ("rmsnorm-tp", "rmsnorm", "rmsnorm_tp"),
]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded_norm_statistics")
    return model_package.write_package(root, "model.py", MODELS, model_package.manifest_text(CASES, "{dp: 2, tp: 2}"))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["layernorm-tp", "rmsnorm-tp"])
def test_norm_statistics_psummed_over_feature_shards_verify(manifest, name: str) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.slow
def test_a_variance_over_the_local_shard_is_a_mismatch(manifest) -> None:
    result = _verify(manifest, "layernorm-tp-local-var")
    assert result.status is Status.MISMATCH, (result.status, result.findings)
