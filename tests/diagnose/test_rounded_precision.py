"""A value the distributed program rounds to a narrower float where the reference keeps it wide is
a changed dtype, which equivalence does not allow (../shared/design.md): the finding names the
rounding and both dtypes, and where the outputs still agree within the reference's own rounding, what
to do, never "a rule equivci lacks". The same model psummed in f32 is verified, so the rounding is
the only thing the finding rests on."""

from __future__ import annotations

import textwrap

import pytest
from model_package import line_of, manifest_text, verify_named, write_package

from equivci.diagnose.precision import narrowing
from equivci.hlo.ir import Instruction, Shape
from equivci.results import Status

MODEL = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, D, F = 4, 16, 32


    def inputs():
        f = jnp.float32
        return jax.ShapeDtypeStruct((B, D), f), jax.ShapeDtypeStruct((D, F), f), jax.ShapeDtypeStruct((F, D), f)


    def mlp(x, w1, w2):
        return x + jnp.tanh(x @ w1) @ w2


    def _tp(body, x, w1, w2, mesh):
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp")), out_specs=P())(x, w1, w2)


    def mlp_tp_f32(x, w1, w2, *, mesh):
        return _tp(lambda x, w1, w2: x + lax.psum(jnp.tanh(x @ w1) @ w2, "tp"), x, w1, w2, mesh)


    def mlp_tp_bf16(x, w1, w2, *, mesh):
        def body(x, w1, w2):
            part = (jnp.tanh(x @ w1) @ w2).astype(jnp.bfloat16)  # MARK:round
            return x + lax.psum(part, "tp").astype(jnp.float32)
        return _tp(body, x, w1, w2, mesh)


    def _mm(a, b):
        return jnp.matmul(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16), preferred_element_type=jnp.float32)


    def mlp_mixed(x, w1, w2):
        for _ in range(3):
            x = x + _mm(jnp.tanh(_mm(x, w1)), w2)
        return x


    def mlp_mixed_tp_bf16(x, w1, w2, *, mesh):
        def body(x, w1, w2):
            for _ in range(3):
                part = _mm(jnp.tanh(_mm(x, w1)), w2).astype(jnp.bfloat16)  # MARK:mixed
                x = x + lax.psum(part, "tp").astype(jnp.float32)
            return x
        return _tp(body, x, w1, w2, mesh)
    """
).lstrip()

MANIFEST = manifest_text(
    [("f32", "mlp", "mlp_tp_f32"), ("bf16", "mlp", "mlp_tp_bf16"), ("mixed-bf16", "mlp_mixed", "mlp_mixed_tp_bf16")],
    "{tp: 2}",
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("rounded_precision"), "model.py", MODEL, MANIFEST)


def test_the_f32_psum_is_verified(manifest):
    assert verify_named(manifest, "f32").status == Status.VERIFIED


def test_a_rounding_the_reference_lacks_is_the_difference_it_makes(manifest):
    # The reference computes in f32 throughout: the bf16 all-reduce's rounding is more than its
    # noise floor (capture/rounding.py: arithmetic done in the narrow type is not excused), and the
    # finding says where the precision drops.
    result = verify_named(manifest, "bf16")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("model.py", line_of(MODEL, "round"))
    assert "rounds to bf16" in lead.message and "f32" in lead.message
    assert "share of a sum" in lead.message  # each device's partial, before its psum


def test_a_rounding_within_the_noise_floor_is_named_and_not_blamed_on_a_missing_rule(manifest):
    # The reference rounds matmul operands to bf16: its own rounding hides the extra one, so no
    # check shows a difference, and the finding still says what changed and what to do.
    result = verify_named(manifest, "mixed-bf16")
    assert result.status == Status.UNPROVEN
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("model.py", line_of(MODEL, "mixed"))
    assert "rounds to bf16" in lead.message and "round the reference the same way" in lead.message
    assert "rule equivci lacks" not in lead.message


def _inst(name: str, dtype: str, opcode: str = "convert") -> Instruction:
    return Instruction(name, opcode, Shape(dtype, (2,)), ("x",), {})


def test_only_a_float_made_narrower_is_a_rounding():
    assert narrowing(_inst("y", "bf16"), _inst("x", "f32", "dot")) == ("bf16", "f32")
    assert narrowing(_inst("y", "f16"), _inst("x", "f64", "dot")) == ("f16", "f64")
    assert narrowing(_inst("y", "f32"), _inst("x", "bf16", "dot")) is None  # widening: exact
    assert narrowing(_inst("y", "s32"), _inst("x", "f32", "dot")) is None  # to an integer: no rounding of this kind
    assert narrowing(_inst("y", "bf16", "add"), _inst("x", "f32", "dot")) is None
    assert narrowing(_inst("y", "bf16"), None) is None
