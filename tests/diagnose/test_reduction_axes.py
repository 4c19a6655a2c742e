"""An all-reduce over the wrong mesh axes is the finding (equivci/diagnose/reduction_axes.py).

A value that is each device's share of a sum over mesh axis A is the reference value only after a
sum over A. Two ways to get the axes wrong, each in two styles:
- A is missing from the reduction (gradients averaged over 'dp' only on a (pod, dp) mesh, the
  unfinished sum then used in the update; a row-parallel projection on a (tp_a, tp_b) mesh summed
  over one of its two axes before a bias add);
- the reduction runs over the wrong axis (a projection's partial sum over 'tp' summed over 'dp').
The finding is the all-reduce's line, even where the proof cannot relate values before it (each
microbatch's gradient on its way to the sum). Near misses: the same programs with the right axes
verify, so the rule names no correct reduction."""

from __future__ import annotations

import textwrap

import pytest
from model_package import line_of, verify_named, write_package

from equivci.diagnose.reduction_axes import reduced_axes
from equivci.hlo.collectives import axis_groups
from equivci.hlo.ir import Instruction, Shape
from equivci.results import Status

MODEL = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    MICRO = 2


    def grad_inputs():
        f = jnp.float32
        return {"w": jax.ShapeDtypeStruct((8, 4), f)}, jax.ShapeDtypeStruct((32, 8), f), jax.ShapeDtypeStruct((32, 4), f)


    def loss(params, x, y):
        return jnp.mean((jnp.tanh(x @ params["w"]) - y) ** 2)


    def step(params, x, y):
        grads = jax.grad(loss)(params, x, y)
        return {"w": params["w"] - 0.1 * grads["w"]}


    def _micro_grads(params, x, y):
        rows = x.shape[0] // MICRO
        total = jnp.zeros_like(params["w"])
        for k in range(MICRO):
            total = total + jax.grad(loss)(params, x[k * rows:(k + 1) * rows], y[k * rows:(k + 1) * rows])["w"]
        return total / MICRO


    def _step_over(axes):
        def body(params, x, y):
            g = _micro_grads(lax.pcast(params, ("pod", "dp"), to="varying"), x, y)
            g = lax.pmean(g, axes)  # MARK:grad_mean
            return {"w": params["w"] - 0.1 * g}
        return body


    def _dp(body, params, x, y, mesh):
        batch = P(("pod", "dp"))
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), batch, batch), out_specs=P(),
                             check_vma=False)(params, x, y)


    def step_both_axes(params, x, y, *, mesh):
        return _dp(_step_over(("pod", "dp")), params, x, y, mesh)


    def step_dp_only(params, x, y, *, mesh):
        return _dp(_step_over("dp"), params, x, y, mesh)  # MARK:dp_only


    def proj_inputs():
        f = jnp.float32
        return jax.ShapeDtypeStruct((4, 16), f), jax.ShapeDtypeStruct((16, 8), f), jax.ShapeDtypeStruct((8,), f)


    def proj(x, w, b):
        return x @ w + b


    def _row_parallel(axes, x, w, b, mesh, batch=None):
        def body(x, w, b):
            return lax.psum(x @ w, axes) + b  # MARK:proj_sum
        return jax.shard_map(body, mesh=mesh, in_specs=(P(batch, ("a", "b")), P(("a", "b")), P()),
                             out_specs=P(batch), check_vma=False)(x, w, b)


    def proj_both(x, w, b, *, mesh):
        return _row_parallel(("a", "b"), x, w, b, mesh)


    def proj_one_axis(x, w, b, *, mesh):
        return _row_parallel("b", x, w, b, mesh)  # MARK:one_axis


    def proj_tp_dp(x, w, b, *, mesh):
        def body(x, w, b):
            return lax.psum(x @ w, "tp") + b
        return jax.shard_map(body, mesh=mesh, in_specs=(P("dp", "tp"), P("tp"), P()),
                             out_specs=P("dp"), check_vma=False)(x, w, b)


    def proj_summed_over_dp(x, w, b, *, mesh):
        def body(x, w, b):
            return lax.psum(x @ w, "dp") + b  # MARK:wrong_axis
        return jax.shard_map(body, mesh=mesh, in_specs=(P("dp", "tp"), P("tp"), P()),
                             out_specs=P("dp"), check_vma=False)(x, w, b)
    """
).lstrip()

_GRAD = "reference: model.py:step, inputs: model.py:grad_inputs, mesh: {pod: 2, dp: 2}"
_PROJ = "reference: model.py:proj, inputs: model.py:proj_inputs"
MANIFEST = (
    "version: 1\nmodels:\n"
    + "".join(f"  - {{name: {n}, distributed: model.py:{n}, {_GRAD}}}\n" for n in ("step_both_axes", "step_dp_only"))
    + "".join(
        f"  - {{name: {n}, distributed: model.py:{n}, {_PROJ}, mesh: {{a: 2, b: 2}}}}\n"
        for n in ("proj_both", "proj_one_axis")
    )
    + "".join(
        f"  - {{name: {n}, distributed: model.py:{n}, {_PROJ}, mesh: {{dp: 2, tp: 2}}}}\n"
        for n in ("proj_tp_dp", "proj_summed_over_dp")
    )
)


def test_the_axes_an_all_reduce_sums_over_are_those_whose_devices_share_one_of_its_groups():
    groups = axis_groups((("pod", 2), ("dp", 2)))
    over_dp = Instruction("ar", "all-reduce", Shape("f32", (4,)), ("x",), {"replica_groups": "{{0,1},{2,3}}"})
    over_pod = Instruction("ar", "all-reduce", Shape("f32", (4,)), ("x",), {"replica_groups": "{{0,2},{1,3}}"})
    over_all = Instruction("ar", "all-reduce", Shape("f32", (4,)), ("x",), {"replica_groups": "{{0,1,2,3}}"})
    assert reduced_axes(over_dp, groups, 4) == {"dp"}
    assert reduced_axes(over_pod, groups, 4) == {"pod"}
    assert reduced_axes(over_all, groups, 4) == {"pod", "dp"}


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("reduction_axes"), "model.py", MODEL, MANIFEST)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["step_both_axes", "proj_both", "proj_tp_dp"])
def test_near_miss_the_right_axes_verify(manifest, name):
    assert verify_named(manifest, name).status == Status.VERIFIED


@pytest.mark.slow
def test_gradients_averaged_over_one_axis_of_two_blame_the_mean(manifest):
    result = verify_named(manifest, "step_dp_only")
    assert result.status == Status.MISMATCH
    lines = [f.line for f in result.findings if f.severity == "error"]
    # The mean's line, or the call that passes its axes (the caller's choice), leads.
    assert lines[0] in (line_of(MODEL, "grad_mean"), line_of(MODEL, "dp_only")), result.findings
    assert any("'pod' is missing from the reduction's axes" in f.message for f in result.findings), result.findings


@pytest.mark.slow
def test_a_projection_summed_over_one_axis_of_two_blames_the_sum(manifest):
    result = verify_named(manifest, "proj_one_axis")
    assert result.status == Status.MISMATCH
    lines = [f.line for f in result.findings if f.severity == "error"]
    assert lines[0] in (line_of(MODEL, "proj_sum"), line_of(MODEL, "one_axis")), result.findings
    assert "'a' is missing from the reduction's axes" in result.findings[0].message, result.findings


@pytest.mark.slow
def test_a_partial_sum_reduced_over_another_axis_blames_the_reduction(manifest):
    result = verify_named(manifest, "proj_summed_over_dp")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert lead.line == line_of(MODEL, "wrong_axis"), result.findings
    assert "should be over 'tp'" in lead.message, lead.message
