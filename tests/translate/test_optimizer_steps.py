"""Optimizer steps on data-parallel shards, in styles other than blind split 20's schedule-free
AdamW: the gradient of a loss written with `jnp.where` (a select whose cotangent is a splat of
1/rows: 1/rows-per-device on a shard, the builder's `select(p, c, 0) = c * select(p, 1, 0)`), a
GELU MLP whose gradient carries many constant factors (`Builder.times`: significands inside, a
power of two in range in front), moments of a [F, 1] kernel whose gradient is a unit reshape
(`elementwise.unit_reshaped`: a product keeps its factors in front, no quotient form).

* `adam_dp`: Adam with bias correction and a smooth-L1 loss, grads pmean'd over dp;
* `lion_dp`: Lion (sign of the interpolated momentum, decoupled weight decay) with a clipped
  absolute loss, grads psum'd and divided by the axis size.
Near miss: the Adam gradients psum'd (4 x the mean), refuted by the oracle."""

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

    N, D, F = 16, 8, 16


    def inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
        params = {"w1": f(D, F), "w2": f(F, 1)}
        return params, params, params, f(N, D), f(N, 1)


    def _smooth_l1(p, xb, yb):
        r = jax.nn.gelu(xb @ p["w1"]) @ p["w2"] - yb
        return jnp.mean(jnp.where(jnp.abs(r) < 0.5, r * r, jnp.abs(r) - 0.25))


    def _clipped_abs(p, xb, yb):
        r = jnp.tanh(xb @ p["w1"]) @ p["w2"] - yb
        return jnp.mean(jnp.where(r > 0, jnp.minimum(r, 2.0), -r))


    def _adam(p, m, v, g):
        step = lambda w, mi, vi, gi: (mi * 0.9 + 0.1 * gi, 0.999 * vi + 0.001 * gi * gi)
        mv = jax.tree_util.tree_map(step, p, m, v, g)
        m = jax.tree_util.tree_map(lambda t: t[0], mv, is_leaf=lambda t: isinstance(t, tuple))
        v = jax.tree_util.tree_map(lambda t: t[1], mv, is_leaf=lambda t: isinstance(t, tuple))
        upd = lambda w, mi, vi: w - 0.01 * (mi / (1 - 0.9 ** 7)) / (jnp.sqrt(vi / (1 - 0.999 ** 7)) + 1e-8)
        return jax.tree_util.tree_map(upd, p, m, v), m, v


    def _lion(p, m, v, g):
        upd = lambda w, mi, gi: w - 0.003 * (jnp.sign(0.9 * mi + 0.1 * gi) + 0.1 * w)
        new_m = jax.tree_util.tree_map(lambda mi, gi: 0.99 * mi + 0.01 * gi, m, g)
        return jax.tree_util.tree_map(upd, p, m, g), new_m, v


    def adam(p, m, v, xb, yb):
        return _adam(p, m, v, jax.grad(_smooth_l1)(p, xb, yb))


    def lion(p, m, v, xb, yb):
        return _lion(p, m, v, jax.grad(_clipped_abs)(p, xb, yb))


    def _dp(loss, update, reduce, mesh):
        def local(p, m, v, xb, yb):
            g = jax.tree_util.tree_map(reduce, jax.grad(loss)(p, xb, yb))
            return update(p, m, v, g)

        rows = P("dp")
        return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P(), rows, rows), out_specs=P(),
                             check_vma=False)


    def adam_dp(p, m, v, xb, yb, *, mesh):
        return _dp(_smooth_l1, _adam, lambda g: lax.pmean(g, "dp"), mesh)(p, m, v, xb, yb)


    def adam_dp_summed(p, m, v, xb, yb, *, mesh):
        return _dp(_smooth_l1, _adam, lambda g: lax.psum(g, "dp"), mesh)(p, m, v, xb, yb)  # MARK:summed


    def lion_dp(p, m, v, xb, yb, *, mesh):
        return _dp(_clipped_abs, _lion, lambda g: lax.psum(g, "dp") / lax.axis_size("dp"), mesh)(p, m, v, xb, yb)
    """
)

CASES = [
    ("adam-dp", "adam", "adam_dp"),
    ("adam-dp-summed", "adam", "adam_dp_summed"),
    ("lion-dp", "lion", "lion_dp"),
]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    root = tmp_path_factory.mktemp("optimizer_steps")
    return model_package.write_package(root, "model.py", MODELS, model_package.manifest_text(CASES, "{dp: 4}"))


@pytest.mark.parametrize("name", ["adam-dp", "lion-dp"])
def test_a_data_parallel_optimizer_step_verifies(manifest, name: str) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.slow
def test_gradients_summed_instead_of_averaged_are_a_mismatch(manifest) -> None:
    result = _verify(manifest, "adam-dp-summed")
    assert result.status is Status.MISMATCH, (result.status, result.findings)
    assert result.findings[0].line == model_package.line_of(MODELS, "summed")
