"""A product of two broadcasts summed over dims both read, as the dot it is (reductions.summed_product):

    sum_R bcast(a) * bcast(b) = dot_general(a, b; contracting R, batch the kept dims both read)

`(p[..., None, :] * v_t[..., None, :, :]).sum(-1)`, `jnp.sum(p[..., :, None] * v[..., None, :, :],
axis=-2)` and `jnp.einsum` build one term; a sum over a dim only one operand reads (a count times the
other) and a sum in f16 (whose dot rounds once) stay the sums they are. Checked against XLA, and end
to end: a column-parallel projection written as a summed product verifies against `x @ w`; summed
over the tokens instead of the features it is a mismatch.
"""

from __future__ import annotations

import textwrap

import jax.numpy as jnp
import model_package
import numpy as np
import pytest
from jax import lax
from model_package import verify_named as _verify
from one_device import programs as _programs

from equivci.results import Status
from equivci.terms.ir import Term
from equivci.terms.semantics import evaluate

RNG = np.random.default_rng(12)
P_ = RNG.standard_normal((2, 3, 5, 6)).astype(np.float32)  # [b, h, q, k]
V = RNG.standard_normal((2, 3, 6, 4)).astype(np.float32)  # [b, h, k, d]

STYLES = {
    "einsum": lambda p, v: jnp.einsum("bhqk,bhkd->bhqd", p, v),
    "kept-last": lambda p, v: (p[..., None, :] * jnp.swapaxes(v, -1, -2)[..., None, :, :]).sum(-1),
    "sum-axis": lambda p, v: jnp.sum(p[..., :, None] * v[..., None, :, :], axis=-2),
}


def _out(fn, args) -> Term:
    programs, want, _ = _programs(fn, args)
    out = programs.reference_outputs[0]
    got = evaluate(out, dict(enumerate(args)), programs.evaluator.values)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    return out


def test_a_summed_product_of_broadcasts_is_the_dot_however_written() -> None:
    terms = {name: _out(fn, (P_, V)) for name, fn in STYLES.items()}
    assert terms["einsum"].op == "dot"
    assert _form(terms["kept-last"]) == _form(terms["einsum"]) == _form(terms["sum-axis"])


def _ops(t: Term) -> set[str]:
    return {t.op}.union(*(_ops(a) for a in t.args))


def _form(t: Term) -> tuple:
    return (t.op, t.attrs, t.shape, t.dtype, tuple(_form(a) for a in t.args))


@pytest.mark.parametrize("fn", [
    lambda p, v: jnp.sum(p[..., :, None] * v[..., None, :, :], axis=-1),  # d: only v reads it
    lambda p, v: jnp.sum(p[..., :, None] * v[..., None, :, :], axis=(-2, -1)),  # k and d
    # summed in f16 (jnp.sum would accumulate in f32)
    lambda p, v: lax.reduce(p.astype(jnp.float16)[..., :, None] * v.astype(jnp.float16)[..., None, :, :],
                            jnp.float16(0), lax.add, (3,)),
])
def test_a_sum_over_a_dim_one_operand_is_broadcast_along_or_in_f16_stays_a_sum(fn) -> None:
    programs, _, _ = _programs(fn, (P_, V))
    assert "dot" not in _ops(programs.reference_outputs[0])


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    S = D = 8  # as many tokens as features: a sum over the wrong one is well shaped
    F = 16


    def inputs():
        return jax.ShapeDtypeStruct((S, D), jnp.float32), jax.ShapeDtypeStruct((D, F), jnp.float32)


    def proj(x, w):
        return x @ w


    def _tp(body):
        def run(x, w, *, mesh):
            return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "tp")), out_specs=P(None, "tp"))(x, w)
        return run


    proj_summed = _tp(lambda x, w: (x[:, :, None] * w[None]).sum(1))
    proj_summed_last = _tp(lambda x, w: (x[:, None, :] * w.T[None]).sum(-1))
    proj_summed_tokens = _tp(lambda x, w: (x[:, :, None] * w[None]).sum(0))
    """
)

MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {name}, reference: m.py:proj, distributed: m.py:{fn}, inputs: m.py:inputs, mesh: {{tp: 4}}}}\n"
    for name, fn in [("summed", "proj_summed"), ("summed-last", "proj_summed_last"), ("summed-tokens", "proj_summed_tokens")]
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("summed_products"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["summed", "summed-last"])
def test_a_projection_written_as_a_summed_product_verifies(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


def test_near_miss_a_product_summed_over_the_wrong_axis_is_a_mismatch(manifest) -> None:
    result = _verify(manifest, "summed-tokens")
    assert result.status is Status.MISMATCH, (result.status, result.findings)
