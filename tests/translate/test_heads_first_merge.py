"""Attention heads laid out heads-first ([B, H, S, HD]) and sharded over H by jit alone: each device
holds one head, moves it back with `transpose(0, 2, 1, 3)`, squeezes it into [B, S, HD] and dots it
with its rows of `wo`; the SPMD partitioner all-reduces the partial outputs. Two facts relate that
to the reference's merge of every head, `o.transpose(0, 2, 1, 3).reshape(B, S, H * HD) @ wo`:
- a reshape the builder reads as a window of the value it moves (Builder.relaid_windows: the
  squeezed head) keeps its written form stated beside it, the form whose windows are the
  reference's merged heads' windows (exact: the same reshape);
- a sum over devices of values reshaped alike is built as the reshape of the sum and stated as the
  sum of the reshaped values too (collectives.combine; exact, the reducer runs element by element),
  where each device's dot with its rows of `wo` is a partial contraction of the reference's.
Checked numerically on the terms stated equal, and end to end in two styles (two jits with
`out_shardings`, one jit with `with_sharding_constraint`). Near misses: heads merged
without the transpose (mismatch) and the heads' rows of `wo` taken in another order (mismatch)."""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest

from equivci.hlo.ir import Shape
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.builder import Builder
from equivci.translate.collectives import combine

RNG = np.random.default_rng(31)


def _stated(ev: Builder, term) -> list:
    return [t for group in ev.equal_terms if group[0] is term for t in group[1:]]


def test_a_squeezed_head_keeps_its_written_reshape_stated_beside_it():
    ev = Builder(None, TermTable(), 1)  # type: ignore[arg-type]
    x = ev.table.make("param", (0,), (), (2, 1, 8, 4), "f32")
    head = ev.binary("multiply", x, x)  # a computed head, [b, 1, s, hd]
    moved = ev.transpose_term(head, (0, 2, 1, 3))
    squeezed = ev.reshape_term(moved, Shape("f32", (2, 8, 4)))
    stated = _stated(ev, squeezed)
    assert len(stated) == 1, stated
    written = stated[0]
    assert (written.op, written.args) == ("reshape", (moved,))
    value = RNG.standard_normal((2, 1, 8, 4)).astype(np.float32)
    np.testing.assert_array_equal(evaluate(squeezed, {0: value}, ev.values), evaluate(written, {0: value}, ev.values))


def test_a_sum_of_values_reshaped_alike_is_stated_as_the_sum_of_the_reshaped_values():
    ev = Builder(None, TermTable(), 4)  # type: ignore[arg-type]
    xs = [ev.table.make("param", (d,), (), (2, 1, 8, 6), "f32") for d in range(4)]
    members = [ev.reshape_term(ev.binary("multiply", x, x), Shape("f32", (2, 8, 6))) for x in xs]
    total = combine(ev, "add", members)
    assert total.op == "reshape"
    stated = _stated(ev, total)
    assert len(stated) == 1, stated
    written = stated[0]
    assert written.op == "binary" and written.shape == (2, 8, 6)
    values = {d: RNG.standard_normal((2, 1, 8, 6)).astype(np.float32) for d in range(4)}
    np.testing.assert_allclose(evaluate(total, values, ev.values), evaluate(written, values, ev.values), rtol=1e-6)
    np.testing.assert_allclose(
        evaluate(written, values, ev.values), sum(v * v for v in values.values()).reshape(2, 8, 6), rtol=1e-6
    )


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    B, S, D, H = 4, 8, 32, 4
    HD = D // H


    def inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
        return f(D, D), f(D, D), f(D, D), f(B, S, D)


    def heads_first(t):
        return t.reshape(B, S, H, HD).transpose(0, 2, 1, 3)


    def merge(o):
        return o.transpose(0, 2, 1, 3).reshape(B, S, D)


    def merge_no_transpose(o):
        return o.reshape(B, S, D)


    def attention(wq, wk, wo, x):
        q = (x @ wq).reshape(B, S, H, HD)
        k = (x @ wk).reshape(B, S, H, HD)
        p = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k), -1)
        return x + jnp.einsum("bhqk,bkhd->bqhd", p, q).reshape(B, S, D) @ wo


    def _heads_first_attention(q, k, wo, x, merge=merge, wo_rows=lambda w: w):
        p = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2), -1)
        return x + merge(p @ q) @ wo_rows(wo)


    def _two_jits(wq, wk, wo, x, mesh, **kw):
        heads = NamedSharding(mesh, P("data", "model"))
        rows = NamedSharding(mesh, P("data"))
        q, k = jax.jit(lambda wq, wk, x: (heads_first(x @ wq), heads_first(x @ wk)),
                       out_shardings=(heads, heads))(wq, wk, x)
        return jax.jit(lambda q, k, wo, x: _heads_first_attention(q, k, wo, x, **kw), out_shardings=rows)(q, k, wo, x)


    def two_jits(wq, wk, wo, x, mesh):
        return _two_jits(wq, wk, wo, x, mesh)


    def two_jits_unmerged(wq, wk, wo, x, mesh):
        return _two_jits(wq, wk, wo, x, mesh, merge=merge_no_transpose)


    def two_jits_rows_reversed(wq, wk, wo, x, mesh):
        return _two_jits(wq, wk, wo, x, mesh, wo_rows=lambda w: w.reshape(H, HD, D)[::-1].reshape(D, D))


    def one_jit(wq, wk, wo, x, mesh):
        pin = jax.lax.with_sharding_constraint
        heads = NamedSharding(mesh, P("data", "model"))
        q, k = pin(heads_first(x @ wq), heads), pin(heads_first(x @ wk), heads)
        return pin(_heads_first_attention(q, k, wo, x), NamedSharding(mesh, P("data")))
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    names = ["two_jits", "two_jits_unmerged", "two_jits_rows_reversed", "one_jit"]
    text = model_package.manifest_text(
        [(name.replace("_", "-"), "attention", name) for name in names], "{data: 2, model: 4}"
    )
    return model_package.write_package(tmp_path_factory.mktemp("heads_first_merge"), "model.py", MODELS, text)


@pytest.mark.parametrize("name", ["two-jits", "one-jit"])
def test_heads_first_attention_sharded_over_heads_verifies(manifest, name):
    result = model_package.verify_named(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["two-jits-unmerged", "two-jits-rows-reversed"])
def test_near_miss_heads_merged_wrongly_is_a_mismatch(manifest, name):
    result = model_package.verify_named(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
