"""Partial contractions added in another order than their windows are the whole contraction
(rule dots/contraction_merge_across; its numeric instance and near misses are in
tests/terms/test_rules_numeric.py).

A gradient reduce-scattered once per microbatch and then accumulated sums device 0's first
microbatch with device 1's first, then the second ones: the windows of the batch meet out of
order. Checked on programs in a style unlike the FSDP training step where it was found (an explicit
psum_scatter of x.T @ y per microbatch in a Python loop), and on a near miss that takes the first
microbatch twice.
"""

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

    N, D, F, MICRO = 16, 8, 6, 2


    def inputs():
        f32 = jnp.float32
        return jax.ShapeDtypeStruct((N, D), f32), jax.ShapeDtypeStruct((N, F), f32)


    def outer(x, y):
        return x.T @ y


    def _accumulated(x, y, mesh, pick):
        def body(x, y):
            rows = x.shape[0] // MICRO
            total = jnp.zeros((D // mesh.shape["dp"], F), x.dtype)
            for k in range(MICRO):
                j = pick(k)
                part = x[j * rows:(j + 1) * rows].T @ y[j * rows:(j + 1) * rows]
                total = total + lax.psum_scatter(part, "dp", scatter_dimension=0, tiled=True)  # MARK:scatter
            return total

        return jax.shard_map(body, mesh=mesh, in_specs=(P("dp"), P("dp")), out_specs=P("dp"))(x, y)


    def per_micro_scatter(x, y, *, mesh):
        return _accumulated(x, y, mesh, lambda k: k)


    def first_micro_twice(x, y, *, mesh):
        return _accumulated(x, y, mesh, lambda k: 0)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: scatter, reference: m.py:outer, distributed: m.py:per_micro_scatter, inputs: m.py:inputs, mesh: {dp: 2}}
      - {name: twice, reference: m.py:outer, distributed: m.py:first_micro_twice, inputs: m.py:inputs, mesh: {dp: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("partial_sums"), "m.py", MODELS, MANIFEST)


def test_microbatches_reduce_scattered_one_at_a_time_verify(manifest) -> None:
    result = _verify(manifest, "scatter")
    assert result.status is Status.VERIFIED, result.findings


def test_the_first_microbatch_taken_twice_is_a_mismatch(manifest) -> None:
    result = _verify(manifest, "twice")
    assert result.status is Status.MISMATCH, (result.status, result.findings)
