"""A helper parameterized by a static value (here the mesh axis its all-reduce runs over): when the op
where the programs part depends on that parameter and another call of the helper passes another
value, the finding leads at the call that passes it, with the op's own line as a tied note. Without
such another call nothing says the caller chose wrong, and the finding stays at the op."""

from __future__ import annotations

import textwrap

import pytest
from model_package import line_of, verify_named, write_package

from equivci.results import Status

MODEL = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P


    def inputs():
        f = jnp.float32
        return jax.ShapeDtypeStruct((8, 16), f), jax.ShapeDtypeStruct((16, 32), f), jax.ShapeDtypeStruct((32, 16), f)


    def mlp(x, w_up, w_down):
        return jax.nn.relu(x @ w_up) @ w_down


    def _down_projection(h, w_down, *, reduce_over):
        return lax.psum(h @ w_down, reduce_over)  # MARK:op


    def _sharded(x, w_up, w_down, mesh, reduce_over):
        def body(x, w_up, w_down):
            return _down_projection(jax.nn.relu(x @ w_up), w_down, reduce_over=reduce_over)

        specs = (P("data", None), P(None, "model"), P("model", None))
        return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P("data", None), check_vma=False)(
            x, w_up, w_down
        )


    def mlp_2d(x, w_up, w_down, *, mesh):
        return _sharded(x, w_up, w_down, mesh, "model")


    def mlp_2d_wrong_axis(x, w_up, w_down, *, mesh):
        return _sharded(x, w_up, w_down, mesh, "data")  # MARK:call
    """
).lstrip()

# The same helper and the same bug, but the only call of `_sharded` is the wrong one.
ALONE = MODEL[: MODEL.index("def mlp_2d(")].rstrip() + "\n\n\n" + textwrap.dedent(
    """
    def mlp_2d_wrong_axis(x, w_up, w_down, *, mesh):
        return _sharded(x, w_up, w_down, mesh, "data")
    """
).lstrip()

MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {name}, reference: {module}.py:mlp, distributed: {module}.py:{func}, inputs: {module}.py:inputs, "
    "mesh: {data: 2, model: 2}}\n"
    for name, module, func in [
        ("ok", "model", "mlp_2d"),
        ("wrong-axis", "model", "mlp_2d_wrong_axis"),
        ("wrong-axis-alone", "alone", "mlp_2d_wrong_axis"),
    ]
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    root = tmp_path_factory.mktemp("caller_choice")
    (root / "alone.py").write_text(ALONE)
    return write_package(root, "model.py", MODEL, MANIFEST)


def test_the_correct_call_verifies(manifest):
    assert verify_named(manifest, "ok").status == Status.VERIFIED


def test_the_call_that_passes_the_wrong_axis_leads(manifest):
    result = verify_named(manifest, "wrong-axis")
    assert result.status == Status.MISMATCH
    lead, note = result.findings[0], result.findings[1]
    assert (lead.path, lead.line, lead.severity) == ("model.py", line_of(MODEL, "call"), "error")
    assert "`'data'` is passed here as `reduce_over` of `_sharded`" in lead.message
    assert "passes `'model'`" in lead.message  # what the other call passes
    assert (note.path, note.line, note.severity, note.tie) == ("model.py", line_of(MODEL, "op"), "note", lead.tie)


def test_near_miss_without_another_call_the_finding_stays_at_the_op(manifest):
    result = verify_named(manifest, "wrong-axis-alone")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("alone.py", line_of(MODEL, "op"))
    assert "is passed here" not in lead.message
