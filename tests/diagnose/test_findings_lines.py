"""Findings on the line a reviewer would change, on small models written for the purpose.

- An op that takes another element type than the reference's op of the same kind (integer positions
  cast to bfloat16 where the reference casts the angles) is not that op with work missing before it:
  the cast is the finding, not the line that made the (correct) positions."""

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

    f32, bf16 = jnp.float32, jnp.bfloat16
    SEQ, DIM = 512, 4


    def inputs():
        return (jax.ShapeDtypeStruct((SEQ, DIM), f32),)


    def inv_freq():
        return 1.0 / (100.0 ** (jnp.arange(DIM).astype(f32) / DIM))


    def rotate(x):
        ang = jnp.arange(SEQ).astype(f32)[:, None] * inv_freq()[None, :]
        return (x * jnp.cos(ang)).astype(bf16)


    def rotate_sp(x, *, mesh):
        def dev(x):
            n = x.shape[0]
            pos = lax.axis_index("sp") * n + jnp.arange(n)
            ang = pos.astype(f32)[:, None] * inv_freq()[None, :]
            return (x * jnp.cos(ang)).astype(bf16)

        return jax.shard_map(dev, mesh=mesh, in_specs=P("sp"), out_specs=P("sp"))(x)


    def rotate_sp_bf16_positions(x, *, mesh):
        def dev(x):
            n = x.shape[0]
            pos = lax.axis_index("sp") * n + jnp.arange(n)
            ang = pos.astype(bf16)[:, None] * inv_freq().astype(bf16)[None, :]  # MARK:cast
            return (x * jnp.cos(ang.astype(f32))).astype(bf16)

        return jax.shard_map(dev, mesh=mesh, in_specs=P("sp"), out_specs=P("sp"))(x)
    """
).lstrip()

MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {name}, reference: model.py:rotate, distributed: model.py:{func}, inputs: model.py:inputs, "
    "mesh: {sp: 2}}\n"
    for name, func in [("ok", "rotate_sp"), ("bf16-positions", "rotate_sp_bf16_positions")]
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("findings_lines"), "model.py", MODEL, MANIFEST)


def test_positions_cast_in_float32_verify(manifest):
    assert verify_named(manifest, "ok").status == Status.VERIFIED


def test_positions_cast_to_bfloat16_blame_the_cast_not_the_positions(manifest):
    result = verify_named(manifest, "bf16-positions")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("model.py", line_of(MODEL, "cast")), result.findings
    assert "the reference applies" not in lead.message  # no work is missing: the positions are right
