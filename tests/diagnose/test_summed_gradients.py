"""A data-parallel step that sums the per-shard gradients where the reference averages: the finding is
the reduction, even when values before it (each microbatch's share of the gradient) are ones the
proof cannot relate on their own. A sum that a later division turns back into the mean is no
defect: with another bug after it, the finding is that bug, not the sum."""

from __future__ import annotations

import textwrap

import pytest
from model_package import line_of, verify_named, write_package

from equivci.diagnose.localize import same_part_of_blocks
from equivci.results import Status

MODEL = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    MICRO = 2


    def inputs():
        f = jnp.float32
        return {"w": jax.ShapeDtypeStruct((8, 4), f)}, jax.ShapeDtypeStruct((16, 8), f), jax.ShapeDtypeStruct((16, 4), f)


    def loss(params, x, y):
        return jnp.mean((jnp.tanh(x @ params["w"]) - y) ** 2)


    def step(params, x, y):
        grads = jax.grad(loss)(params, x, y)
        return {"w": params["w"] - 0.1 * grads["w"]}


    def _micro_grads(params, x, y):
        rows = x.shape[0] // MICRO
        total = {"w": jnp.zeros_like(params["w"])}
        for k in range(MICRO):
            g = jax.grad(loss)(params, x[k * rows:(k + 1) * rows], y[k * rows:(k + 1) * rows])
            total = {"w": total["w"] + g["w"] / MICRO}
        return total


    def _dp(body, params, x, y, mesh):
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=P())(params, x, y)


    def step_summed(params, x, y, *, mesh):
        def body(params, x, y):
            grads = _micro_grads(lax.pcast(params, "data", to="varying"), x, y)
            grads = {"w": lax.psum(grads["w"], "data")}  # MARK:sum
            return {"w": params["w"] - 0.1 * grads["w"]}

        return _dp(body, params, x, y, mesh)


    def step_divided_wrong_rate(params, x, y, *, mesh):
        def body(params, x, y):
            grads = _micro_grads(lax.pcast(params, "data", to="varying"), x, y)
            grads = {"w": lax.psum(grads["w"], "data") / lax.axis_size("data")}  # MARK:divided
            return {"w": params["w"] - 0.01 * grads["w"]}  # MARK:rate

        return _dp(body, params, x, y, mesh)
    """
).lstrip()

MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {name}, reference: model.py:step, distributed: model.py:{name}, inputs: model.py:inputs, "
    "mesh: {data: 4}}\n"
    for name in ("step_summed", "step_divided_wrong_rate")
)


def test_the_same_part_of_every_block_is_no_misplaced_slice():
    assert same_part_of_blocks([(2, 4), (6, 8), (10, 12), (14, 16)])  # microbatch 1 of each shard
    assert not same_part_of_blocks([(3, 5), (7, 9)])  # crosses into the next device's block
    assert not same_part_of_blocks([(0, 8), (4, 12)])  # overlapping
    assert not same_part_of_blocks([(1, 2), (0, 1)])  # out of order
    assert not same_part_of_blocks([(0, 1), (2, 3), (5, 6)])  # uneven stride


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("summed_gradients"), "model.py", MODEL, MANIFEST)


@pytest.mark.slow
def test_the_sum_where_the_reference_averages_is_the_finding(manifest):
    result = verify_named(manifest, "step_summed")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("model.py", line_of(MODEL, "sum")), result.findings
    assert "4 x the reference value" in lead.message


@pytest.mark.slow
def test_near_miss_a_sum_divided_back_is_not_the_finding(manifest):
    result = verify_named(manifest, "step_divided_wrong_rate")
    assert result.status == Status.MISMATCH
    assert result.findings[0].line != line_of(MODEL, "divided"), result.findings  # the divided sum is no defect
    assert all("the factor is never divided out" not in f.message for f in result.findings)
