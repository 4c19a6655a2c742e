"""An op made on a line both programs run (a helper the reference calls too) computes the same from
the same values: when the programs part there, the finding leads at the distributed program's call
into the helper, with the op's own line as a tied note. A distributed-only copy of the helper keeps
the finding at the op."""

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


    def norm(x):
        return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)


    def ffn(x, w_up, w_down):
        return jnp.tanh(x @ w_up) @ w_down  # MARK:shared


    def block(x, w_up, w_down):
        return x + ffn(norm(x), w_up, w_down)


    def _ffn_copy(x, w_up, w_down):
        return jnp.tanh(x @ w_up) @ w_down  # MARK:copy


    def _tp(x, w_up, w_down, mesh, body):
        specs = (P(), P(None, "model"), P("model", None))
        return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P(), check_vma=False)(x, w_up, w_down)


    def block_tp_unnormed(x, w_up, w_down, *, mesh):
        def body(x, w_up, w_down):
            return x + lax.psum(ffn(x, w_up, w_down), "model")  # MARK:call

        return _tp(x, w_up, w_down, mesh, body)


    def block_tp_unnormed_copy(x, w_up, w_down, *, mesh):
        def body(x, w_up, w_down):
            return x + lax.psum(_ffn_copy(x, w_up, w_down), "model")

        return _tp(x, w_up, w_down, mesh, body)
    """
).lstrip()

MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {name}, reference: model.py:block, distributed: model.py:{func}, inputs: model.py:inputs, "
    "mesh: {model: 2}}\n"
    for name, func in [("shared", "block_tp_unnormed"), ("copy", "block_tp_unnormed_copy")]
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("shared_caller"), "model.py", MODEL, MANIFEST)


def test_the_call_into_shared_code_leads(manifest):
    result = verify_named(manifest, "shared")
    assert result.status == Status.MISMATCH
    lead, note = result.findings[0], result.findings[1]
    assert (lead.path, lead.line, lead.severity) == ("model.py", line_of(MODEL, "call"), "error")
    assert f"model.py:{line_of(MODEL, 'shared')}" in lead.message
    assert (note.path, note.line, note.severity, note.tie) == ("model.py", line_of(MODEL, "shared"), "note", lead.tie)


def test_near_miss_a_distributed_only_copy_keeps_the_finding_at_the_op(manifest):
    result = verify_named(manifest, "copy")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("model.py", line_of(MODEL, "copy"))
    assert "which the reference does not make" not in lead.message
