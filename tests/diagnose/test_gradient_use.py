"""A data-parallel step that uses each device's own gradient as the full one: autodiff's ops carry the
forward lines, which are right, so the finding is where the program takes the gradient over. Two
styles: the reduction left to a helper passed by name (the helper passed returns its gradient
unchanged, so it does no work a reviewer would edit: the finding is the call that passes it instead
of the reducing one), and the update written inline after the grad call (the finding is the update
that uses the gradient as it is)."""

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


    def inputs():
        f = jnp.float32
        return {"w": jax.ShapeDtypeStruct((8, 4), f)}, jax.ShapeDtypeStruct((16, 8), f), jax.ShapeDtypeStruct((16, 4), f)


    def loss(params, x, y):
        return jnp.mean((jnp.tanh(x @ params["w"]) - y) ** 2)


    def _momentum_sgd(w, g):
        return w - 0.1 * (0.9 * w + g)


    def step(params, x, y):
        grads = jax.grad(loss)(params, x, y)
        return {"w": _momentum_sgd(params["w"], grads["w"])}


    def _averaged(g):
        return lax.pmean(g, "data")


    def _as_is(g):
        return g


    def _dp(reduce, params, x, y, mesh):
        def body(params, x, y):
            grads = jax.grad(loss)(params, x, y)
            return {"w": _momentum_sgd(params["w"], reduce(grads["w"]))}

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=P(),
                             check_vma=False)(params, x, y)


    def step_dp(params, x, y, *, mesh):
        return _dp(_averaged, params, x, y, mesh)


    def step_dp_unreduced(params, x, y, *, mesh):
        return _dp(_as_is, params, x, y, mesh)  # MARK:as_is


    def step_dp_inline(params, x, y, *, mesh):
        def body(params, x, y):
            g = jax.grad(loss)(params, x, y)["w"]
            return {"w": params["w"] - 0.1 * (0.9 * params["w"] + g)}  # MARK:inline

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=P(),
                             check_vma=False)(params, x, y)
    """
).lstrip()

NAMES = ("step_dp", "step_dp_unreduced", "step_dp_inline")
MANIFEST = manifest_text([(name, "step", name) for name in NAMES], "{data: 4}")


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("gradient_use"), "model.py", MODEL, MANIFEST)


def test_the_call_that_passes_the_helper_leaving_the_gradient_unreduced_is_the_finding(manifest):
    correct = verify_named(manifest, "step_dp")
    assert correct.status == Status.VERIFIED, correct.findings
    result = verify_named(manifest, "step_dp_unreduced")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("model.py", line_of(MODEL, "as_is")), result.findings
    assert "first use, outside autodiff" in lead.message


def test_the_update_that_takes_the_gradient_as_it_is_is_the_finding(manifest):
    result = verify_named(manifest, "step_dp_inline")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("model.py", line_of(MODEL, "inline")), result.findings
