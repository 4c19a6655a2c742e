"""Scalings by powers of two at other places leave one term (Builder.times): a data-parallel
gradient's loss scale is 1/rows-per-device on each device and 1/devices after the all-reduce, where
the reference has 1/rows once; GELU's constants (0.797, 0.0447) and a loss weight make the products
of the factors no float32 number, so the factors' odd parts go into the term and only the power of
two stays in front. The style of the near misses in tests/soundness (shard_map, pcast, pmean) is
the first; this one takes the local gradients without the varying-axes check, psums them over a
2-D mesh and divides by the axis sizes. Near miss: the psum over one axis of the two (each pod keeps
its own half-batch gradient), the oracle refutes it."""

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

    ROWS, D, K = 16, 4, 6


    def inputs():
        f = jnp.float32
        return (jax.ShapeDtypeStruct((D, K), f), jax.ShapeDtypeStruct((ROWS, D), f),
                jax.ShapeDtypeStruct((ROWS, K), f))


    def _loss(w, x, y):
        return 0.3 * jnp.mean(jnp.sum((jax.nn.gelu(x @ w) - y) ** 2, -1))


    def grad(w, x, y):
        return jax.grad(_loss)(w, x, y)


    def _grad_dp(w, x, y, mesh, axes):
        def per_device(w, x, y):
            g = jax.grad(_loss)(w, x, y)
            return lax.psum(g, axes) / (lax.axis_size("pod") * lax.axis_size("dp"))

        rows = P(("pod", "dp"))
        return jax.shard_map(per_device, mesh=mesh, in_specs=(P(), rows, rows), out_specs=P(),
                             check_vma=False)(w, x, y)


    def grad_dp(w, x, y, *, mesh):
        return _grad_dp(w, x, y, mesh, ("pod", "dp"))


    def grad_dp_one_axis(w, x, y, *, mesh):
        return _grad_dp(w, x, y, mesh, "dp")
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: psum-divided, reference: m.py:grad, distributed: m.py:grad_dp, inputs: m.py:inputs,
         mesh: {pod: 2, dp: 2}}
      - {name: psum-one-axis, reference: m.py:grad, distributed: m.py:grad_dp_one_axis, inputs: m.py:inputs,
         mesh: {pod: 2, dp: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("scaled_gradients"), "m.py", MODELS, MANIFEST)


def test_gradient_psummed_then_divided_by_the_devices_verifies(manifest):
    result = _verify(manifest, "psum-divided")
    assert result.status is Status.VERIFIED, result.findings


def test_near_miss_psum_over_one_axis_of_two_is_a_mismatch(manifest):
    result = _verify(manifest, "psum-one-axis")
    assert result.status is Status.MISMATCH, (result.status, result.findings)
