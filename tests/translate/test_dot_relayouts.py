"""A dot of a relayout along free dims is the relayout of the dot, and several consecutive
contracting dims are one merged contraction (equivci.translate.relayouts).

Each fact is checked numerically on the terms the evaluator builds (the normal form against the
dot as written, on random arrays), its guard on a near miss (a reshape that regroups a contracting
dim is not lifted), and on JAX programs in a style unlike the blind fused-QKV case: a reference with
three-dimensional head weights and einsums, a distributed program that flattens them per device
(and a near miss that flattens the output projection in the wrong order).
"""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify

from equivci.hlo.ir import Instruction, Shape
from equivci.layers.segments import program_order
from equivci.results import Status
from equivci.terms.ir import Term, TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.evaluator import Evaluator
from equivci.translate.reductions import dot

RNG = np.random.default_rng(0)


def _dot_inst(out: tuple[int, ...], lc: str, rc: str, lb: str = "", rb: str = "") -> Instruction:
    attrs = {"lhs_contracting_dims": lc, "rhs_contracting_dims": rc}
    if lb:
        attrs |= {"lhs_batch_dims": lb, "rhs_batch_dims": rb}
    return Instruction("d", "dot", Shape("f32", out), ("a", "b"), attrs)


def _check(build) -> Term:
    """`build(ev)` -> (the evaluator's dot term, its numpy value, the dot's operands as written):
    the fact changed the term, and the two agree on random inputs. Returns the term."""
    ev = Evaluator(None, TermTable(), 1)
    term, expected, written = build(ev)
    assert not (term.op == "dot" and term.args == written), "the fact did not fire"
    values = {k: RNG.standard_normal(shape).astype(np.float32) for k, shape in enumerate(SHAPES)}
    np.testing.assert_allclose(evaluate(term, values), expected(values), rtol=1e-5, atol=1e-5)
    return term


SHAPES = [(2, 3, 8), (8, 24), (2, 3, 2, 4), (8, 5)]


def test_a_dot_of_a_sliced_head_split_weight_is_the_window_of_the_dot() -> None:
    # x [2,3,8] @ reshape(reshape(W [8,24] -> [8,3,2,4])[:, :, 1:2, :] -> [8,12])
    def build(ev):
        t = ev.table
        x = t.make("param", (0,), (), SHAPES[0], "f32")
        w = t.make("param", (1,), (), SHAPES[1], "f32")
        split = ev.reshape_term(w, Shape("f32", (8, 3, 2, 4)))
        flat = ev.reshape_term(ev.slice_term(split, 2, 1, 2), Shape("f32", (8, 12)))
        term = dot(ev, _dot_inst((2, 3, 12), "{2}", "{0}"), [x, flat], 0)

        def value(v):
            return v[0] @ v[1].reshape(8, 3, 2, 4)[:, :, 1:2, :].reshape(8, 12)

        return term, value, (x, flat)

    term = _check(build)
    # the window is taken of the dot with the whole weight (what the reference's projection is)
    assert [[(a.op, a.shape) for a in t.args] for t in program_order([term]) if t.op == "dot"] == [
        [("param", SHAPES[0]), ("param", SHAPES[1])]
    ]


def test_several_consecutive_contracting_dims_are_one_merged_contraction() -> None:
    # einsum("bshk,hkd->bsd") with the pairs given in reverse order, as XLA writes them
    def build(ev):
        t = ev.table
        out = t.make("param", (2,), (), SHAPES[2], "f32")
        wo = ev.reshape_term(t.make("param", (3,), (), SHAPES[3], "f32"), Shape("f32", (2, 4, 5)))
        term = dot(ev, _dot_inst((2, 3, 5), "{3,2}", "{1,0}"), [out, wo], 0)
        return term, lambda v: np.einsum("bshk,hkd->bsd", v[2], v[3].reshape(2, 4, 5)), (out, wo)

    _check(build)


def test_a_reshape_that_regroups_a_contracting_dim_is_not_lifted() -> None:
    ev = Evaluator(None, TermTable(), 1)
    x = ev.table.make("param", (0,), (), (3, 8), "f32")
    w = ev.table.make("param", (1,), (), (4, 16), "f32")
    regrouped = ev.reshape_term(w, Shape("f32", (8, 8)))  # the contracting 8 is made of two rows of w
    term = dot(ev, _dot_inst((3, 8), "{1}", "{0}"), [x, regrouped], 0)
    assert term.op == "dot" and term.args[1] is regrouped


def test_contracting_dims_in_different_orders_are_not_merged() -> None:
    ev = Evaluator(None, TermTable(), 1)
    a = ev.reshape_term(ev.table.make("param", (0,), (), (3, 8), "f32"), Shape("f32", (3, 2, 4)))
    b = ev.table.make("param", (1,), (), (4, 2, 5), "f32")
    term = dot(ev, _dot_inst((3, 5), "{1,2}", "{1,0}"), [a, b], 0)  # pairs (1,1), (2,0)
    assert term.op == "dot" and term.args == (a, b)


def test_contracting_dims_no_operand_split_are_not_merged() -> None:
    # a dispatch mask's (expert, slot) contraction keeps its form
    ev = Evaluator(None, TermTable(), 1)
    y = ev.table.make("param", (0,), (), (2, 3, 4), "f32")
    mask = ev.table.make("param", (1,), (), (5, 2, 3), "f32")
    term = dot(ev, _dot_inst((4, 5), "{0,1}", "{1,2}"), [y, mask], 0)
    assert term.op == "dot" and term.args == (y, mask)


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, S, D, H, K = 2, 4, 16, 4, 4


    def heads_inputs():
        f32 = jnp.float32
        return (jax.ShapeDtypeStruct((B, S, D), f32), jax.ShapeDtypeStruct((D, H, K), f32),
                jax.ShapeDtypeStruct((H * K, D), f32))


    def heads(x, w, wo):
        q = jnp.einsum("bsd,dhk->bshk", x, w)
        return jnp.einsum("bshk,hkd->bsd", jnp.tanh(q), wo.reshape(H, K, D))


    def _flat(x, w, wo, mesh, out_rows):
        def body(x, w, wo):
            h = w.shape[1]
            q = (x @ w.reshape(D, h * K)).reshape(B, S, h, K)
            return lax.psum(jnp.tanh(q).reshape(B, S, h * K) @ out_rows(wo), "tp")

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "tp", None), P("tp", None)),
                             out_specs=P())(x, w, wo)


    def heads_flat_tp(x, w, wo, *, mesh):
        return _flat(x, w, wo, mesh, lambda wo: wo)


    def heads_flat_tp_kmajor(x, w, wo, *, mesh):
        return _flat(x, w, wo, mesh, lambda wo: wo.reshape(-1, K, D).transpose(1, 0, 2).reshape(-1, D))  # MARK:kmajor
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: heads-flat, reference: m.py:heads, distributed: m.py:heads_flat_tp, inputs: m.py:heads_inputs,
         mesh: {tp: 2}}
      - {name: heads-flat-kmajor, reference: m.py:heads, distributed: m.py:heads_flat_tp_kmajor,
         inputs: m.py:heads_inputs, mesh: {tp: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("relayouts"), "m.py", MODELS, MANIFEST)


def test_heads_flattened_per_device_verify(manifest) -> None:
    result = _verify(manifest, "heads-flat")
    assert result.status is Status.VERIFIED, result.findings


def test_an_output_projection_flattened_in_the_wrong_order_is_a_mismatch(manifest) -> None:
    result = _verify(manifest, "heads-flat-kmajor")
    assert result.status is Status.MISMATCH, (result.status, result.findings)
