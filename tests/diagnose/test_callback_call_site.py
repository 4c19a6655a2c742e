"""What a callback computes is written where it is passed, and a swapped operand at the op reading it.

A residual add left out by a callable the caller passes (`combine(h, attn)` given `lambda h, a: a`,
where another call passes `lambda h, a: h + a`): the work is missing between the value, made right,
and the op that takes it, so the lead is the call passing the lambda. A lambda that wraps a helper
both lambdas call (`lambda m: allsum(m)` against `lambda m: allsum(m) / 2`): the helper's op is
the same for both, what the lambda does around it is not, so the lead is that lambda's call. Two
projections the reference reads as a GELU gate and a value, read the other way round: each is made
right, so the lead is the op that reads them, not the projection that makes one. Near misses verify."""

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

    B, D, F = 8, 16, 32


    def inputs():
        f = jnp.float32
        return (jax.ShapeDtypeStruct((B, D), f), jax.ShapeDtypeStruct((D, F), f), jax.ShapeDtypeStruct((D, F), f),
                jax.ShapeDtypeStruct((F, D), f))


    def block(x, w_gate, w_up, w_down):
        h = x + (jnp.tanh(x @ w_gate) * (x @ w_up)) @ w_down
        return jnp.mean(h, axis=0)


    def gelu_block(x, w_gate, w_up, w_down):
        h = x + (jax.nn.gelu(x @ w_gate) * (x @ w_up)) @ w_down
        return jnp.mean(h, axis=0)


    def allsum(m):
        return lax.psum(m, "data")  # MARK:psum


    def _sharded(x, w_gate, w_up, w_down, mesh, combine, finish):
        def body(x, w_gate, w_up, w_down):
            out = lax.psum((jnp.tanh(x @ w_gate) * (x @ w_up)) @ w_down, "model")
            h = combine(x, out)
            return finish(jnp.mean(h, axis=0))

        specs = (P("data", None), P(None, "model"), P(None, "model"), P("model", None))
        return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P(), check_vma=False)(
            x, w_gate, w_up, w_down
        )


    def block_tp(x, w_gate, w_up, w_down, *, mesh):
        return _sharded(x, w_gate, w_up, w_down, mesh, lambda h, a: h + a, lambda m: allsum(m) / 2)


    def block_tp_residual_dropped(x, w_gate, w_up, w_down, *, mesh):
        return _sharded(x, w_gate, w_up, w_down, mesh,
                        lambda h, a: a,  # MARK:identity
                        lambda m: allsum(m) / 2)


    def block_tp_mean_left_out(x, w_gate, w_up, w_down, *, mesh):
        return _sharded(x, w_gate, w_up, w_down, mesh, lambda h, a: h + a,
                        lambda m: allsum(m))  # MARK:unscaled


    def block_tp_swapped(x, w_gate, w_up, w_down, *, mesh):
        def body(x, w_gate, w_up, w_down):
            gate = x @ w_gate
            up = x @ w_up  # MARK:up
            act = jax.nn.gelu(up) * gate  # MARK:swap
            h = x + lax.psum(act @ w_down, "model")
            return lax.psum(jnp.mean(h, axis=0), "data") / 2

        specs = (P("data", None), P(None, "model"), P(None, "model"), P("model", None))
        return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P(), check_vma=False)(
            x, w_gate, w_up, w_down
        )
    """
).lstrip()

MANIFEST = manifest_text(
    [
        ("ok", "block", "block_tp"),
        ("residual-dropped", "block", "block_tp_residual_dropped"),
        ("mean-left-out", "block", "block_tp_mean_left_out"),
        ("swapped", "gelu_block", "block_tp_swapped"),
    ],
    mesh="{data: 2, model: 2}",
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("callback_call_site"), "model.py", MODEL, MANIFEST)


def test_the_near_miss_verifies(manifest):
    assert verify_named(manifest, "ok").status == Status.VERIFIED


def test_a_residual_left_out_by_an_identity_lambda_leads_at_its_call(manifest):
    result = verify_named(manifest, "residual-dropped")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line, lead.severity) == ("model.py", line_of(MODEL, "identity"), "error"), result.findings
    assert "`lambda h, a: a` is passed here as `combine` of `_sharded`" in lead.message
    assert "passes `lambda h, a: h + a`" in lead.message


def test_a_lambda_around_a_shared_helper_leads_at_its_call(manifest):
    result = verify_named(manifest, "mean-left-out")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line, lead.severity) == ("model.py", line_of(MODEL, "unscaled"), "error"), result.findings
    assert "`lambda m: allsum(m)` is passed here as `finish` of `_sharded`" in lead.message
    assert any((f.path, f.line) == ("model.py", line_of(MODEL, "psum")) for f in result.findings[1:])


def test_swapped_operands_lead_at_the_op_that_reads_them(manifest):
    result = verify_named(manifest, "swapped")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line, lead.severity) == ("model.py", line_of(MODEL, "swap"), "error"), result.findings
    assert "this op reads it in the other's place" in lead.message
    assert all((f.path, f.line) != ("model.py", line_of(MODEL, "up")) for f in result.findings)
