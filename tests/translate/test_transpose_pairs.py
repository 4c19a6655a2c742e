"""A transpose of a transpose is one transpose by the composed permutation
(equivci.translate.shapes.transpose): XLA fuses the pair where they are adjacent, but not across
the copy a sharding constraint leaves between them, so without the composition the two programs
reach a dot in different forms.

Checked numerically on the handler, and on JAX programs in a style unlike the blind
jit-partitioned attention: a distributed program that keeps activations sequence-major
([seq, batch, dim], Megatron's layout) under a constraint, against a batch-major einsum
reference; and a near miss whose key transpose swaps batch and sequence (same shape, B == S).
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
from equivci.terms.spec import transpose_text
from equivci.translate.evaluator import Evaluator
from equivci.translate.shapes import transpose

RNG = np.random.default_rng(0)


def _transposed(ev: Evaluator, x, perm: tuple[int, ...]):
    shape = Shape("f32", tuple(x.shape[k] for k in perm))
    inst = Instruction("t", "transpose", shape, ("x",), {"dimensions": "{" + ",".join(map(str, perm)) + "}"})
    return transpose(ev, inst, [x], 0)


@pytest.mark.parametrize(("p", "q"), [((1, 0, 2), (1, 2, 0)), ((2, 0, 1), (0, 2, 1)), ((1, 2, 0), (2, 0, 1))])
def test_a_transpose_of_a_transpose_is_one_transpose(p, q) -> None:
    ev = Evaluator(None, TermTable(), 1)
    x = ev.table.make("param", (0,), (), (2, 3, 4), "f32")
    term = _transposed(ev, _transposed(ev, x, p), q)
    value = RNG.standard_normal((2, 3, 4))
    expected = value.transpose(p).transpose(q)
    if term is x:
        np.testing.assert_array_equal(value, expected)
        return
    assert term.op == "transpose" and term.args == (x,)
    assert term.attrs == (transpose_text(tuple(p[k] for k in q)),)
    np.testing.assert_array_equal(evaluate(term, {0: value}), expected)


def test_a_transpose_undone_is_its_operand() -> None:
    ev = Evaluator(None, TermTable(), 1)
    x = ev.table.make("param", (0,), (), (2, 3, 4), "f32")
    assert _transposed(ev, _transposed(ev, x, (1, 2, 0)), (2, 0, 1)) is x


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    B, S, D = 4, 4, 8


    def inputs():
        f = jnp.float32
        return (jax.ShapeDtypeStruct((B, S, D), f), jax.ShapeDtypeStruct((D, D), f),
                jax.ShapeDtypeStruct((D, D), f), jax.ShapeDtypeStruct((D, D), f))


    def attention(x, wq, wk, wv):
        q, k, v = (jnp.einsum("bsd,de->bse", x, w) for w in (wq, wk, wv))
        p = jax.nn.softmax(jnp.einsum("bse,bte->bst", q, k), axis=-1)
        return jnp.einsum("bst,bte->bse", p, v)


    def _sequence_major(x, wq, wk, wv, mesh, keys_t):
        seq_major = NamedSharding(mesh, P(None, "dp", None))
        xs = jax.lax.with_sharding_constraint(jnp.swapaxes(x, 0, 1), seq_major)  # [s, b, d]
        q, k, v = (jax.lax.with_sharding_constraint(xs @ w, seq_major) for w in (wq, wk, wv))
        p = jax.nn.softmax(jnp.swapaxes(q, 0, 1) @ keys_t(k), axis=-1)  # MARK:scores
        out = p @ jnp.swapaxes(v, 0, 1)
        return jax.lax.with_sharding_constraint(out, NamedSharding(mesh, P("dp", None, None)))


    def attention_seq_major(x, wq, wk, wv, mesh):
        return _sequence_major(x, wq, wk, wv, mesh, lambda k: k.transpose(1, 2, 0))


    def attention_seq_major_keys_swapped(x, wq, wk, wv, mesh):
        return _sequence_major(x, wq, wk, wv, mesh, lambda k: k.transpose(0, 2, 1))
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: seq-major, reference: m.py:attention, distributed: m.py:attention_seq_major, inputs: m.py:inputs,
         mesh: {dp: 2}}
      - {name: seq-major-keys-swapped, reference: m.py:attention, distributed: m.py:attention_seq_major_keys_swapped,
         inputs: m.py:inputs, mesh: {dp: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("transposes"), "m.py", MODELS, MANIFEST)


def test_sequence_major_attention_under_constraints_verifies(manifest) -> None:
    result = _verify(manifest, "seq-major")
    assert result.status is Status.VERIFIED, result.findings


def test_keys_transposed_over_batch_and_sequence_is_a_mismatch(manifest) -> None:
    result = _verify(manifest, "seq-major-keys-swapped")
    assert result.status is Status.MISMATCH, (result.status, result.findings)
