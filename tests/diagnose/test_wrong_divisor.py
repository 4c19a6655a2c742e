"""A sum over a mesh axis divided by the wrong constant: the finding is the division (or the call that
passes its divisor), not the sum, which is right as it stands. Two styles: an explicit psum divided
by a count written at the division, and an FSDP step whose gradient autodiff sums (the transpose of
an all_gather) divided by a count a caller passes. Near misses: a sum no division follows stays the
sum's finding, and a product with a constant (the optimizer's own factor) is no division."""

from __future__ import annotations

import textwrap

import pytest
from model_package import line_of, manifest_text, verify_named, write_package

from equivci.results import Status

MODEL = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    DEVICES = 4


    def inputs():
        f = jnp.float32
        return {"w": jax.ShapeDtypeStruct((8, 4), f)}, jax.ShapeDtypeStruct((16, 8), f), jax.ShapeDtypeStruct((16, 4), f)


    def loss(params, x, y):
        return jnp.mean((jnp.tanh(x @ params["w"]) - y) ** 2)


    def step(params, x, y):
        grads = jax.grad(loss)(params, x, y)
        return {"w": params["w"] - 0.1 * grads["w"]}


    def _dp(body, params, x, y, mesh):
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=P())(params, x, y)


    def step_psum_halved(params, x, y, *, mesh):
        def body(params, x, y):
            g = jax.grad(loss)(lax.pcast(params, "data", to="varying"), x, y)["w"]
            g = lax.psum(g, "data") / 2  # MARK:halved
            return {"w": params["w"] - 0.1 * g}

        return _dp(body, params, x, y, mesh)


    def step_psum_scaled(params, x, y, *, mesh):
        def body(params, x, y):
            g = jax.grad(loss)(lax.pcast(params, "data", to="varying"), x, y)["w"]
            g = lax.psum(g, "data")  # MARK:scaled
            return {"w": params["w"] - 0.05 * g}

        return _dp(body, params, x, y, mesh)


    def _gathered_loss(shard, x, y):
        return loss({"w": lax.all_gather(shard["w"], "data", axis=0, tiled=True)}, x, y)


    def _fsdp(count, params, x, y, mesh):
        def body(shard, x, y):
            grads = jax.grad(_gathered_loss)(shard, x, y)
            g = grads["w"] / count  # MARK:count
            return {"w": shard["w"] - 0.1 * g}

        return jax.shard_map(body, mesh=mesh, in_specs=(P("data"), P("data"), P("data")),
                             out_specs=P("data"))(params, x, y)


    def step_fsdp(params, x, y, *, mesh):
        return _fsdp(DEVICES, params, x, y, mesh)


    def step_fsdp_uncounted(params, x, y, *, mesh):
        return _fsdp(1, params, x, y, mesh)  # MARK:uncounted
    """
).lstrip()

NAMES = ("step_psum_halved", "step_psum_scaled", "step_fsdp", "step_fsdp_uncounted")
MANIFEST = manifest_text([(name, "step", name) for name in NAMES], "{data: 4}")


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("wrong_divisor"), "model.py", MODEL, MANIFEST)


def test_the_division_by_the_wrong_count_is_the_finding(manifest):
    result = verify_named(manifest, "step_psum_halved")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("model.py", line_of(MODEL, "halved")), result.findings
    assert "by 2, not by 4" in lead.message and "2 x the reference value" in lead.message


def test_the_call_passing_the_wrong_count_leads_for_an_autodiff_sum(manifest):
    correct = verify_named(manifest, "step_fsdp")
    assert correct.status == Status.VERIFIED, correct.findings
    result = verify_named(manifest, "step_fsdp_uncounted")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("model.py", line_of(MODEL, "uncounted")), result.findings
    assert "by 1, not by 4" in lead.message
    assert ("model.py", line_of(MODEL, "count")) in {(f.path, f.line) for f in result.findings[1:]}


def test_near_miss_a_product_with_a_constant_is_no_division(manifest):
    result = verify_named(manifest, "step_psum_scaled")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("model.py", line_of(MODEL, "scaled")), result.findings
    assert "never divided out" in lead.message
