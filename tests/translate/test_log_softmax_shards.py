"""A log-softmax on vocabulary shards written z - lse with the global lse = log psum(Σ exp(z - m)) + m
(either addend first, keepdims or not) meets `jax.nn.log_softmax`'s (z - m) - log Σ exp(z - m): the
rules `elementwise/subtract_sum_*` and `elementwise/subtract_bcast_sum_*` regroup x - (y + z) as
(x - z) - y onto the difference x - z the device computes anyway (an identity over the reals,
checked numerically in tests/terms/test_rules_numeric.py).

Three styles: a temperature-scaled distillation KL (both log-softmaxes on shards, keepdims lse
`log + m`), the log-probabilities themselves as a vocabulary-sharded output (lse `m + log`, no
keepdims), and a cross-entropy against soft labels. A device that subtracts its own shard's lse from
the student's logits is a mismatch.
"""

from __future__ import annotations

import textwrap

import model_package
import pytest

from equivci.results import Status

MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    N, V, TAU = 6, 32, 2.0


    def inputs():
        return jax.ShapeDtypeStruct((N, V), jnp.float32), jax.ShapeDtypeStruct((N, V), jnp.float32)


    def _shards(local, out, *args, mesh):
        specs = tuple(P(None, "tp") for _ in args)
        return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=out, check_vma=False)(*args)


    def _lse_keepdims(z):
        m = lax.pmax(jnp.max(z, -1, keepdims=True), "tp")
        return jnp.log(lax.psum(jnp.sum(jnp.exp(z - m), -1, keepdims=True), "tp")) + m


    def _lse_flat(z):
        m = lax.pmax(jnp.max(z, -1), "tp")
        return m + jnp.log(lax.psum(jnp.sum(jnp.exp(z - m[:, None]), -1), "tp"))


    def kl(s, t):
        ls, lt = jax.nn.log_softmax(s / TAU, -1), jax.nn.log_softmax(t / TAU, -1)
        return TAU**2 * jnp.mean(jnp.sum(jnp.exp(lt) * (lt - ls), -1))


    def kl_tp(s, t, *, mesh):
        def local(s, t):
            zs, zt = s / TAU, t / TAU
            ls, lt = zs - _lse_keepdims(zs), zt - _lse_keepdims(zt)
            return TAU**2 * jnp.mean(lax.psum(jnp.sum(jnp.exp(lt) * (lt - ls), -1), "tp"))

        return _shards(local, P(), s, t, mesh=mesh)


    def kl_own_lse(s, t, *, mesh):
        def local(s, t):
            zs, zt = s / TAU, t / TAU
            ls = zs - jax.nn.logsumexp(zs, -1, keepdims=True)  # MARK:own
            lt = zt - _lse_keepdims(zt)
            return TAU**2 * jnp.mean(lax.psum(jnp.sum(jnp.exp(lt) * (lt - ls), -1), "tp"))

        return _shards(local, P(), s, t, mesh=mesh)


    def log_probs(s, t):
        return jax.nn.log_softmax(s, -1)


    def log_probs_tp(s, t, *, mesh):
        return _shards(lambda s, t: s - _lse_flat(s)[:, None], P(None, "tp"), s, t, mesh=mesh)


    def soft_xent(s, t):
        return -jnp.sum(jax.nn.softmax(t, -1) * jax.nn.log_softmax(s, -1), -1)


    def soft_xent_tp(s, t, *, mesh):
        def local(s, t):
            pt = jnp.exp(t - _lse_flat(t)[:, None])
            return -lax.psum(jnp.sum(pt * (s - _lse_flat(s)[:, None]), -1), "tp")

        return _shards(local, P(), s, t, mesh=mesh)
    """
)

CASES = [
    ("kl", "kl", "kl_tp"),
    ("kl_own_lse", "kl", "kl_own_lse"),
    ("log_probs", "log_probs", "log_probs_tp"),
    ("soft_xent", "soft_xent", "soft_xent_tp"),
]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    text = model_package.manifest_text(CASES, "{tp: 4}")
    return model_package.write_package(tmp_path_factory.mktemp("log_softmax_shards"), "model.py", MODELS, text)


@pytest.mark.parametrize("name", ["kl", "log_probs", "soft_xent"])
def test_a_log_softmax_less_the_global_lse_on_vocabulary_shards_verifies(manifest, name):
    result = model_package.verify_named(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


def test_a_device_s_own_lse_is_a_mismatch(manifest):
    result = model_package.verify_named(manifest, "kl_own_lse")
    assert result.status is Status.MISMATCH, result.findings
