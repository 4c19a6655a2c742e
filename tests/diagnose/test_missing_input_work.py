"""Missing work on an input: the reference normalizes an input before its projection and the
distributed program projects the input itself. The reference's parameter is no op of its own (its
first use reads it), yet the chain of missing work starts there: the finding names the norm the
reference applies and blames the distributed projection that takes the raw input.

Two styles: the input sequence-sharded and all-gathered before a column-parallel projection
(Megatron-SP), and the input replicated into a column-parallel projection. Near misses: with the
norm, both verify."""

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
        return {"scale": jax.ShapeDtypeStruct((16,), f), "w": jax.ShapeDtypeStruct((16, 8), f)}, \\
            jax.ShapeDtypeStruct((8, 16), f)


    def layer_norm(x, scale):
        mu = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
        return (x - mu) * lax.rsqrt(var + 1e-5) * scale


    def block(params, x):
        h = layer_norm(x, params["scale"])  # MARK:reference_norm
        return jnp.tanh(h @ params["w"])


    SPECS = {"scale": P(), "w": P(None, "tp")}


    def block_sp(params, x, *, mesh):
        def body(p, x_local):
            h = lax.all_gather(layer_norm(x_local, p["scale"]), "tp", axis=0, tiled=True)
            return jnp.tanh(h @ p["w"])
        return jax.shard_map(body, mesh=mesh, in_specs=(SPECS, P("tp")), out_specs=P(None, "tp"))(params, x)


    def block_sp_no_norm(params, x, *, mesh):
        def body(p, x_local):
            h = lax.all_gather(x_local, "tp", axis=0, tiled=True)
            return jnp.tanh(h @ p["w"])  # MARK:sp_projection
        return jax.shard_map(body, mesh=mesh, in_specs=(SPECS, P("tp")), out_specs=P(None, "tp"))(params, x)


    def block_tp(params, x, *, mesh):
        def body(p, x):
            return jnp.tanh(layer_norm(x, p["scale"]) @ p["w"])
        return jax.shard_map(body, mesh=mesh, in_specs=(SPECS, P()), out_specs=P(None, "tp"))(params, x)


    def block_tp_no_norm(params, x, *, mesh):
        def body(p, x):
            return jnp.tanh(x @ p["w"])  # MARK:tp_projection
        return jax.shard_map(body, mesh=mesh, in_specs=(SPECS, P()), out_specs=P(None, "tp"))(params, x)
    """
).lstrip()

NAMES = ("block_sp", "block_sp_no_norm", "block_tp", "block_tp_no_norm")
MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {n}, reference: model.py:block, distributed: model.py:{n}, inputs: model.py:inputs, mesh: {{tp: 2}}}}\n"
    for n in NAMES
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("missing_input_work"), "model.py", MODEL, MANIFEST)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["block_sp", "block_tp"])
def test_near_miss_with_the_norm_verifies(manifest, name):
    assert verify_named(manifest, name).status == Status.VERIFIED


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "mark"), [("block_sp_no_norm", "sp_projection"), ("block_tp_no_norm", "tp_projection")]
)
def test_a_norm_skipped_on_an_input_blames_the_projection_and_cites_the_reference_norm(manifest, name, mark):
    result = verify_named(manifest, name)
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("model.py", line_of(MODEL, mark)), result.findings
    assert "as input #2, without the" in lead.message, lead.message
    assert f"model.py:{line_of(MODEL, 'reference_norm')}" in lead.message and "layer_norm" in lead.message, lead.message
