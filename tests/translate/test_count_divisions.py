"""A division by a count has one normal form, however the program splits it (Builder.divided):
(f * x) / c is (a * x) / b with b the odd part of f / c's denominator. A data-parallel gradient
accumulated over microbatches in a `fori_loop` (a psum per microbatch, of a mean over the device's
rows, whose scale is twice the reference's) and divided once by microbatches x devices meets the
reference's mean gradient divided by the microbatches. Near miss: divided by the microbatches only
(twice the gradient: the oracle refutes it)."""

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

    MICRO, ROWS, D, K = 3, 4, 6, 5


    def inputs():
        f = jnp.float32
        return (jax.ShapeDtypeStruct((D, K), f), jax.ShapeDtypeStruct((MICRO, ROWS, D), f),
                jax.ShapeDtypeStruct((MICRO, ROWS, K), f))


    def _loss(w, x, y):
        return jnp.mean((x @ w - y) ** 2)


    def mean_grad(w, xs, ys):
        body = lambda m, acc: acc + jax.grad(_loss)(w, xs[m], ys[m])  # noqa: E731
        return lax.fori_loop(0, MICRO, body, jnp.zeros_like(w)) / MICRO


    def _mean_grad_dp(w, xs, ys, mesh, count):
        def per_device(w, xs, ys):
            body = lambda m, acc: acc + lax.psum(jax.grad(_loss)(w, xs[m], ys[m]), "dp")  # noqa: E731
            return lax.fori_loop(0, MICRO, body, jnp.zeros_like(w)) / count(lax.axis_size("dp"))

        return jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P(None, "dp"), P(None, "dp")),
                             out_specs=P(), check_vma=False)(w, xs, ys)


    def mean_grad_dp(w, xs, ys, *, mesh):
        return _mean_grad_dp(w, xs, ys, mesh, lambda n: MICRO * n)


    def mean_grad_dp_micro_only(w, xs, ys, *, mesh):
        return _mean_grad_dp(w, xs, ys, mesh, lambda n: MICRO)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: accum, reference: m.py:mean_grad, distributed: m.py:mean_grad_dp, inputs: m.py:inputs, mesh: {dp: 2}}
      - {name: accum-micro-only, reference: m.py:mean_grad, distributed: m.py:mean_grad_dp_micro_only,
         inputs: m.py:inputs, mesh: {dp: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("count_divisions"), "m.py", MODELS, MANIFEST)


def test_gradient_divided_once_by_microbatches_and_devices_verifies(manifest):
    result = _verify(manifest, "accum")
    assert result.status is Status.VERIFIED, result.findings


def test_near_miss_divided_by_the_microbatches_only_is_a_mismatch(manifest):
    result = _verify(manifest, "accum-micro-only")
    assert result.status is Status.MISMATCH, (result.status, result.findings)
