"""An elementwise op of broadcasts is the broadcast of the op (equivci.translate.elementwise.
broadcast_outside): every element of op(bcast(a), bcast(b)) is op of the same numbers as the
element of a op b it copies, so the two are equal in floats, not just over the reals. A norm's
statistic broadcast over the features before its last ops (`+ eps`, `sqrt`, `rsqrt` on every copy
— named-axis code that drops and re-broadcasts reduced dims, or `broadcast_to(var, x.shape)`) then
meets the statistic finished before the broadcast.

Checked on the terms the builder makes (values, and the forms left alone: broadcasts that differ,
integers, constants of several values) and on JAX programs in three styles, sharded by jit alone,
by shard_map and on one device, with near misses (the root left out, the statistic taken over the
wrong axis) that must be a mismatch.
"""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify

from equivci.hlo.ir import Shape
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.elementwise import binary_terms
from equivci.translate.evaluator import Evaluator
from equivci.translate.shapes import broadcast_term


def _rows(ev: Evaluator, k: int):
    return ev.table.make("param", (k,), (), (4, 8), "f32")


def test_an_op_of_broadcasts_is_the_broadcast_of_the_op() -> None:
    ev = Evaluator(None, TermTable(), 1)
    a, b = _rows(ev, 0), _rows(ev, 1)
    wide = Shape("f32", (4, 8, 16))
    ba, bb = (broadcast_term(ev, t, wide, (0, 1)) for t in (a, b))
    term = binary_terms(ev, "add", [ba, bb], wide)
    assert term.op == "bcast" and term.args[0].op == "binary" and term.args[0].args == (a, b)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 8)), rng.standard_normal((4, 8))
    np.testing.assert_allclose(evaluate(term, {0: x, 1: y}), np.broadcast_to((x + y)[..., None], (4, 8, 16)))
    turned = Shape("f32", (8, 16, 4))  # a broadcast that also moves the operand's dims
    ta, tb = (broadcast_term(ev, t, turned, (2, 0)) for t in (a, b))
    product = binary_terms(ev, "multiply", [ta, tb], turned)
    assert product.op == "bcast" and product.attrs == ta.attrs  # the written broadcast, dims where it put them
    np.testing.assert_allclose(evaluate(product, {0: x, 1: y}), np.broadcast_to((x * y).T[:, None, :], (8, 16, 4)))


def test_a_splat_and_a_constant_factor_move_inside_the_broadcast() -> None:
    """(c * bcast(a)) + eps, the builder's normal form of `mean` broadcast then `+ eps`, is
    bcast(c * a + eps)."""
    ev = Evaluator(None, TermTable(), 1)
    a = _rows(ev, 0)
    wide = Shape("f32", (4, 8, 16))
    scaled = binary_terms(
        ev,
        "divide",
        [broadcast_term(ev, a, wide, (0, 1)), ev.const(np.full((4, 8, 16), 16.0, np.float32), "f32")],
        wide,
    )
    eps = ev.const(np.full((4, 8, 16), 1e-5, np.float32), "f32")
    term = binary_terms(ev, "add", [scaled, eps], wide)
    assert term.op == "bcast" and term.args[0].shape == (4, 8)
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_allclose(
        evaluate(term, {0: x}), np.broadcast_to((x / 16 + np.float32(1e-5))[..., None], (4, 8, 16)), rtol=1e-6
    )


def test_forms_that_are_not_one_broadcast_are_kept() -> None:
    ev = Evaluator(None, TermTable(), 1)
    a, b = _rows(ev, 0), _rows(ev, 1)
    wide = Shape("f32", (4, 8, 8))
    along_last, along_middle = broadcast_term(ev, a, wide, (0, 1)), broadcast_term(ev, b, wide, (0, 2))
    assert binary_terms(ev, "add", [along_last, along_middle], wide).op == "binary"  # two broadcasts
    ramp = ev.const(np.arange(256, dtype=np.float32).reshape(4, 8, 8), "f32")
    assert binary_terms(ev, "add", [along_last, ramp], wide).op == "binary"  # not one value everywhere
    i = ev.table.make("param", (2,), (), (4, 8), "s32")
    bi = broadcast_term(ev, i, Shape("s32", (4, 8, 8)), (0, 1))
    assert binary_terms(ev, "add", [bi, bi], Shape("s32", (4, 8, 8))).op == "binary"  # index arithmetic


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P

    B, S, E = 4, 8, 16


    def ln_inputs():
        return (jax.ShapeDtypeStruct((B, S, E), jnp.float32),)


    def layer_norm(x):
        mu = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
        return (x - mu) / jnp.sqrt(var + 1e-5)


    def rms_norm(x):
        return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)


    def _spread(stat, like):
        # named-axis style: drop the reduced dim, put it back, broadcast to the features
        return jnp.broadcast_to(jnp.expand_dims(jnp.squeeze(stat, -1), -1), like.shape)


    def _ln_spread(x, no_root=False):
        c = x - _spread(jnp.mean(x, axis=-1, keepdims=True), x)
        var = _spread(jnp.mean(jnp.square(c), axis=-1, keepdims=True), x)
        return c / (var + 1e-5) if no_root else c / jnp.sqrt(var + 1e-5)


    def ln_jit(x, *, mesh):
        sh = NamedSharding(mesh, P("data"))
        return jax.jit(_ln_spread, in_shardings=(sh,), out_shardings=sh)(x)


    def ln_jit_no_root(x, *, mesh):
        sh = NamedSharding(mesh, P("data"))
        return jax.jit(lambda x: _ln_spread(x, no_root=True), in_shardings=(sh,), out_shardings=sh)(x)  # MARK:root


    def _rms_to(x, axis):
        ms = jnp.broadcast_to(jnp.mean(x * x, axis=axis)[..., None] if axis == -1 else jnp.mean(x * x, axis=axis, keepdims=True), x.shape)
        return x * lax.rsqrt(ms + 1e-6)


    def rms_seq_sharded(x, *, mesh):
        return jax.shard_map(lambda x: _rms_to(x, -1), mesh=mesh, in_specs=P(None, "seq"), out_specs=P(None, "seq"))(x)


    def rms_seq_sharded_wrong_axis(x, *, mesh):
        return jax.shard_map(lambda x: _rms_to(x, 0), mesh=mesh, in_specs=P(None, "seq"), out_specs=P(None, "seq"))(x)  # MARK:axis


    def ln_one_device(x, *, mesh):
        return _ln_spread(x)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: ln-jit, reference: m.py:layer_norm, distributed: m.py:ln_jit, inputs: m.py:ln_inputs, mesh: {data: 2}}
      - {name: ln-jit-no-root, reference: m.py:layer_norm, distributed: m.py:ln_jit_no_root, inputs: m.py:ln_inputs, mesh: {data: 2}}
      - {name: rms-seq, reference: m.py:rms_norm, distributed: m.py:rms_seq_sharded, inputs: m.py:ln_inputs, mesh: {seq: 4}}
      - {name: rms-seq-wrong-axis, reference: m.py:rms_norm, distributed: m.py:rms_seq_sharded_wrong_axis, inputs: m.py:ln_inputs, mesh: {seq: 4}}
      - {name: ln-one-device, reference: m.py:layer_norm, distributed: m.py:ln_one_device, inputs: m.py:ln_inputs, mesh: {data: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("spread"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["ln-jit", "rms-seq", "ln-one-device"])
def test_norms_with_the_statistic_broadcast_before_its_last_ops_verify(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["ln-jit-no-root", "rms-seq-wrong-axis"])
def test_a_statistic_finished_differently_is_a_mismatch(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
