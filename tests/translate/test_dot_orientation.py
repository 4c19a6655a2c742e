"""A dot's operands may come transposed or in either order: dot(transpose(x), y) is a dot of x
with its dims renamed (equivci.translate.relayouts.through_transposes), and transpose(dot(x, y))
is the transposed dot of the swapped operands (equivci.terms.spec.swapped_dot, stated by the loader).

Each fact is checked numerically on the terms (the form against the dot as written, on random
arrays), and on JAX programs in a style unlike the blind jit-partitioned attention: a reference
that moves heads in front with explicit transposes and `@`, a shard_map program that keeps
[batch, seq, heads, head_dim] and computes the context as einsum(v, probs) (the operands of the
reference's dot swapped), and a near miss that reads the probabilities transposed.
"""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify

from equivci.hlo.ir import Instruction, Shape
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.terms.spec import DotSpec, swapped_dot, transpose_text
from equivci.translate.evaluator import Evaluator
from equivci.translate.reductions import dot

RNG = np.random.default_rng(0)


def _dot_inst(out: tuple[int, ...], lc: str, rc: str, lb: str, rb: str) -> Instruction:
    attrs = {"lhs_contracting_dims": lc, "rhs_contracting_dims": rc, "lhs_batch_dims": lb, "rhs_batch_dims": rb}
    return Instruction("d", "dot", Shape("f32", out), ("a", "b"), attrs)


def test_a_dot_of_transposed_operands_is_a_dot_of_the_operands() -> None:
    # q [b, s, h, e] and k [b, s, h, e] moved to [b, h, s, e] and [b, h, e, s], then a batched dot;
    # the lhs's free dims (s, f) come out in the order opposite to q's, so one transpose remains
    ev = Evaluator(None, TermTable(), 1)
    q = ev.table.make("param", (0,), (), (2, 3, 4, 5, 6), "f32")  # [b, s, h, f, e]
    k = ev.table.make("param", (1,), (), (2, 7, 4, 6), "f32")  # [b, t, h, e]
    qt = ev.mk("transpose", (transpose_text((0, 2, 3, 1, 4)),), [q], Shape("f32", (2, 4, 5, 3, 6)))  # [b,h,f,s,e]
    kt = ev.mk("transpose", (transpose_text((0, 2, 3, 1)),), [k], Shape("f32", (2, 4, 6, 7)))  # [b, h, e, t]
    term = dot(ev, _dot_inst((2, 4, 5, 3, 7), "{4}", "{2}", "{0,1}", "{0,1}"), [qt, kt], 0)
    assert term.op == "transpose" and term.args[0].op == "dot" and term.args[0].args == (q, k)
    values = {0: RNG.standard_normal((2, 3, 4, 5, 6)), 1: RNG.standard_normal((2, 7, 4, 6))}
    expected = np.einsum("bshfe,bthe->bhfst", values[0], values[1])
    np.testing.assert_allclose(evaluate(term, values), expected, rtol=1e-6)


def test_a_dot_whose_transposes_keep_the_free_order_needs_no_transpose() -> None:
    ev = Evaluator(None, TermTable(), 1)
    q = ev.table.make("param", (0,), (), (2, 3, 4, 6), "f32")  # [b, s, h, e]
    k = ev.table.make("param", (1,), (), (2, 7, 4, 6), "f32")
    qt = ev.mk("transpose", (transpose_text((0, 2, 1, 3)),), [q], Shape("f32", (2, 4, 3, 6)))
    kt = ev.mk("transpose", (transpose_text((0, 2, 3, 1)),), [k], Shape("f32", (2, 4, 6, 7)))
    term = dot(ev, _dot_inst((2, 4, 3, 7), "{3}", "{2}", "{0,1}", "{0,1}"), [qt, kt], 0)
    assert term.op == "dot" and term.args == (q, k)
    values = {0: RNG.standard_normal((2, 3, 4, 6)), 1: RNG.standard_normal((2, 7, 4, 6))}
    np.testing.assert_allclose(evaluate(term, values), np.einsum("bshe,bthe->bhst", *values.values()), rtol=1e-6)


@pytest.mark.parametrize("perm", [(0, 1, 2, 3), (0, 3, 1, 2), (3, 2, 1, 0)])
def test_a_transposed_dot_is_the_transposed_dot_of_the_swapped_operands(perm) -> None:
    # dot(v [b, k, h, e], p [b, h, q, k]) over batch (b, h), contracting k: [b, h, e, q]
    written = DotSpec((0, 2), (0, 1), (1,), (3,), 4, 4, ("f32", "f32"))
    spec, composed = swapped_dot(written, perm)
    table = TermTable()
    v = table.make("param", (0,), (), (2, 5, 3, 4), "f32")
    p = table.make("param", (1,), (), (2, 3, 6, 5), "f32")
    out = (2, 3, 4, 6)
    original = table.make("dot", (written.text(),), (v, p), out, "f32")
    shape = tuple(out[k] for k in perm)
    lhs = table.make("transpose", (transpose_text(perm),), (original,), shape, "f32")
    inner = (2, 3, 6, 4)
    swapped = table.make("dot", (spec.text(),), (p, v), inner, "f32")
    rhs = table.make("transpose", (transpose_text(composed),), (swapped,), tuple(inner[k] for k in composed), "f32")
    values = {0: RNG.standard_normal((2, 5, 3, 4)), 1: RNG.standard_normal((2, 3, 6, 5))}
    assert rhs.shape == lhs.shape
    np.testing.assert_allclose(evaluate(rhs, values), evaluate(lhs, values), rtol=1e-6)


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, S, D, H, K = 2, 4, 16, 4, 4


    def attn_inputs():
        f32 = jnp.float32
        return (jax.ShapeDtypeStruct((B, S, D), f32), jax.ShapeDtypeStruct((3, D, H * K), f32),
                jax.ShapeDtypeStruct((H * K, D), f32))


    def attn(x, w, wo):
        def heads_first(t):
            return t.reshape(B, S, H, K).transpose(0, 2, 1, 3)

        q, k, v = (heads_first(x @ w[i]) for i in range(3))
        p = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2), axis=-1)
        return (p @ v).transpose(0, 2, 1, 3).reshape(B, S, H * K) @ wo


    def _attn_tp(x, w, wo, mesh, probs_of):
        def body(x, w, wo):
            h = w.shape[2] // K
            q, k, v = ((x @ w[i]).reshape(B, S, h, K) for i in range(3))
            p = probs_of(jax.nn.softmax(jnp.einsum("bshk,bthk->bhst", q, k), axis=-1))
            ctx = jnp.einsum("bthk,bhst->bshk", v, p)
            return lax.psum(ctx.reshape(B, S, h * K) @ wo, "tp")

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, None, "tp"), P("tp", None)),
                             out_specs=P())(x, w, wo)


    def attn_tp(x, w, wo, *, mesh):
        return _attn_tp(x, w, wo, mesh, lambda p: p)


    def attn_tp_probs_transposed(x, w, wo, *, mesh):
        return _attn_tp(x, w, wo, mesh, lambda p: p.transpose(0, 1, 3, 2))  # MARK:transposed
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: attn-v-first, reference: m.py:attn, distributed: m.py:attn_tp, inputs: m.py:attn_inputs,
         mesh: {tp: 2}}
      - {name: attn-probs-transposed, reference: m.py:attn, distributed: m.py:attn_tp_probs_transposed,
         inputs: m.py:attn_inputs, mesh: {tp: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("orientation"), "m.py", MODELS, MANIFEST)


def test_attention_with_the_context_dot_operands_swapped_verifies(manifest) -> None:
    result = _verify(manifest, "attn-v-first")
    assert result.status is Status.VERIFIED, result.findings


def test_attention_reading_the_probabilities_transposed_is_a_mismatch(manifest) -> None:
    result = _verify(manifest, "attn-probs-transposed")
    assert result.status is Status.MISMATCH, (result.status, result.findings)
