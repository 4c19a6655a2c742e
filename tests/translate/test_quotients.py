"""A dot of a quotient whose divisor is constant along the contraction is the quotient of the dot
(equivci/translate/quotients.py): softmax weights normalised before the dot against a flash-decode
that psums numerators and denominators and divides last, in two operand orders; near misses (a
local denominator, a local max, a divisor that varies along the contraction, an integer quotient)
are not verified, and
every stated fact holds numerically.
"""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest
from model_package import capture_named, programs_of
from model_package import model_named as _model

from equivci.results import Status
from equivci.terms.semantics import evaluate
from equivci.verify.engine import verify_model

MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, S, D = 2, 8, 8  # D = S: a divisor put on the wrong free dim would still be well shaped


    def inputs():
        f = jnp.float32
        return (jax.ShapeDtypeStruct((B, S, D), f), jax.ShapeDtypeStruct((B, S, D), f),
                jax.ShapeDtypeStruct((B, S, D), f))


    def attention(q, k, v):
        return jax.nn.softmax(jnp.einsum("bqd,bkd->bqk", q, k), axis=-1) @ v


    def attention_vt(q, k, v):  # the weights are the dot's right operand; output [b, d, q]
        w = jax.nn.softmax(jnp.einsum("bqd,bkd->bqk", q, k), axis=-1)
        return jnp.einsum("bkd,bqk->bdq", v, w)


    def attention_columns(q, k, v):  # normalised over the queries: the divisor varies along k
        p = jnp.exp(jnp.einsum("bqd,bkd->bqk", q, k))
        return (p / p.sum(axis=1, keepdims=True)) @ v


    def _flash(q, k, v, local_max=False, local_den=False, vt=False):
        s = jnp.einsum("bqd,bkd->bqk", q, k)
        m = s.max(-1, keepdims=True)
        m = m if local_max else lax.pmax(m, "kv")
        p = jnp.exp(s - m)
        num = lax.psum(jnp.einsum("bkd,bqk->bdq", v, p) if vt else p @ v, "kv")
        den = p.sum(-1) if local_den else lax.psum(p.sum(-1), "kv")
        return num / (den[:, None, :] if vt else den[..., None])


    def _sharded(body):
        def run(q, k, v):
            kv = P(None, "kv")
            return jax.shard_map(body, in_specs=(P(), kv, kv), out_specs=P(), check_vma=False)(q, k, v)
        return run


    flash = _sharded(_flash)
    flash_vt = _sharded(lambda q, k, v: _flash(q, k, v, vt=True))
    flash_local_max = _sharded(lambda q, k, v: _flash(q, k, v, local_max=True))
    flash_local_den = _sharded(lambda q, k, v: _flash(q, k, v, local_den=True))


    def int_inputs():
        return (jax.ShapeDtypeStruct((S, S), jnp.int32), jax.ShapeDtypeStruct((S,), jnp.int32),
                jax.ShapeDtypeStruct((S, D), jnp.int32))


    def int_rows_divided(a, z, v):  # an integer quotient truncates: not the sum divided
        return lax.div(a, z[:, None] + 1) @ v


    def int_sum_divided(a, z, v):
        return jax.shard_map(lambda a, z, v: lax.div(a @ v, z[:, None] + 1), in_specs=(P(), P(), P()),
                             out_specs=P())(a, z, v)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: flash, reference: m.py:attention, distributed: m.py:flash, inputs: m.py:inputs, mesh: {kv: 2}}
      - {name: flash-vt, reference: m.py:attention_vt, distributed: m.py:flash_vt, inputs: m.py:inputs, mesh: {kv: 2}}
      - {name: local-max, reference: m.py:attention, distributed: m.py:flash_local_max, inputs: m.py:inputs, mesh: {kv: 2}}
      - {name: local-den, reference: m.py:attention, distributed: m.py:flash_local_den, inputs: m.py:inputs, mesh: {kv: 2}}
      - {name: columns, reference: m.py:attention_columns, distributed: m.py:flash, inputs: m.py:inputs, mesh: {kv: 2}}
      - {name: integer, reference: m.py:int_rows_divided, distributed: m.py:int_sum_divided, inputs: m.py:int_inputs, mesh: {kv: 1}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("quotient_models"), "m.py", MODELS, MANIFEST)


def _quotient_facts(programs) -> list[list]:
    """The groups quotients.py stated: a dot beside a quotient of a dot."""
    return [
        group
        for group in programs.evaluator.equal_terms
        if len(group) == 2
        and group[0].op == "dot"
        and group[1].op == "binary"
        and group[1].attrs == ("divide",)
        and group[1].args[0].op == "dot"
    ]


@pytest.mark.parametrize("name", ["flash", "flash-vt"])
def test_flash_decode_dividing_after_the_psum_verifies(manifest, name):
    model = _model(manifest, name)
    result = verify_model(model, manifest, capture_named(manifest, name))
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["local-max", "local-den", "columns", "integer"])
def test_near_misses_are_mismatch(manifest, name):
    """A shard's own max (exponentials scaled differently per shard, then summed), a denominator
    without its psum, a reference normalised along the contracted dim (no quotient of the dot), and
    an integer quotient (truncated before the sum)."""
    model = _model(manifest, name)
    result = verify_model(model, manifest, capture_named(manifest, name))
    assert result.status is Status.MISMATCH, result.findings


@pytest.mark.parametrize("name", ["flash", "flash-vt", "columns"])
def test_stated_quotients_hold_numerically(manifest, name):
    captured = capture_named(manifest, name)
    programs = programs_of(captured)
    facts = _quotient_facts(programs)
    # the reference's softmax-then-dot is a quotient fact; a divisor along the contraction is none
    assert (len(facts) > 0) == (name != "columns"), facts
    rng = np.random.default_rng(0)
    consts = dict(programs.evaluator.values)
    for _ in range(3):
        params = {k: rng.standard_normal(leaf.shape) for k, leaf in enumerate(captured.inputs)}
        for dot, quotient in facts:
            lhs, rhs = evaluate(dot, params, consts), evaluate(quotient, params, consts)
            assert lhs.shape == rhs.shape and np.allclose(lhs, rhs, rtol=1e-5, atol=1e-6), (name, dot, quotient)
