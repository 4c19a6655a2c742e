"""A fused QKV kernel laid out per KV group ([q_0 .. q_{G-1}, k, v] for group 0, then group 1, ...),
column-sharded so that each device holds whole groups: the device's slab [b, t, 1, G + 2, hd] has
one group, and its k slot is one window of its projection where the reference's (every group's)
is not.

The facts (each checked numerically here):
- a reshape of slices and reshapes of y that the builder finds to be one window of y keeps its
  written form stated beside it (Builder.reshape_term): the device's k, `slab[..., G, :]` squeezed
  to [b, t, 1, hd], is the window [G*hd, (G+1)*hd) of its columns, and written, the squeeze of
  slot G of its [1, G + 2, hd] split, which is the reference's squeeze of slot G of every group's
  split, narrowed to the device's group;
- a dot of relaid operands keeps its written form stated beside the dot of their bases
  (reductions._dot): the reference's `einsum("bngqk,bknd->bqngd", probs, v)` reads v as a slot of
  the [b, t, groups, G + 2, hd] split and is built as a window of the dot with the whole split;
  written, it is the dot of v, whose window along the group (a batch dim) is the device's dot.

On JAX programs in two styles: the slab reshaped and its slots indexed (as a flax checkpoint's
fused kernel is used), and the slab split at the slot bounds with jnp.split, k and v squeezed.
Near misses: k and v read from each other's slots, and a group's query heads in reverse order.
"""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest
from egglog import EGraph, union
from model_package import verify_named as _verify
from test_dot_relayouts import _dot_inst

from equivci.hlo.ir import Shape
from equivci.prove.saturate import _run, proved_equal
from equivci.results import Status
from equivci.terms.ir import Term, TermTable
from equivci.terms.load import Loader
from equivci.terms.semantics import evaluate
from equivci.translate.evaluator import Evaluator
from equivci.translate.reductions import dot

RNG = np.random.default_rng(0)

# b, t, groups, slots per group (G query heads, k, v), head_dim
B, T, N, S, HD = 2, 3, 2, 4, 4


def _slot(ev: Evaluator, projection: Term, groups: int, slot: int) -> Term:
    """`projection.reshape(B, T, groups, S, HD)[..., slot, :]` as the evaluator builds it."""
    split = ev.reshape_term(projection, Shape("f32", (B, T, groups, S, HD)))
    return ev.reshape_term(ev.slice_term(split, 3, slot, slot + 1), Shape("f32", (B, T, groups, HD)))


def _proved(a: Term, b: Term, groups: list[list[Term]]) -> bool:
    egraph = EGraph()
    loader = Loader(egraph)
    ea, eb = loader.expr(a), loader.expr(b)
    for group in groups:
        first = loader.expr(group[0])
        loader.facts += [union(first).with_(loader.expr(t)) for t in group[1:]]
    loader.flush()
    _run(egraph, 12)
    return proved_equal(egraph, ea, eb)


def _projections(ev: Evaluator) -> tuple[Term, Term]:
    """x @ w over every group's columns (the reference's) and over group 1's (a device's)."""
    x = ev.table.make("param", (0,), (), (B, T, 8), "f32")
    w = ev.table.make("param", (1,), (), (8, N * S * HD), "f32")
    reference = dot(ev, _dot_inst((B, T, N * S * HD), "{2}", "{0}"), [x, w], 0)
    columns = ev.slice_term(w, 1, S * HD, 2 * S * HD)
    return reference, dot(ev, _dot_inst((B, T, S * HD), "{2}", "{0}"), [x, columns], 0)


def test_a_squeezed_slot_of_one_group_is_the_reference_slot_narrowed_to_the_group() -> None:
    ev = Evaluator(None, TermTable(), 1)
    reference, device = _projections(ev)
    reference_k, device_k = _slot(ev, reference, N, 2), _slot(ev, device, 1, 2)
    # the device's slot is one window of its columns; its written form is stated beside it
    assert device_k.op == "reshape" and device_k.args[0].op == "slice"
    stated = next((g for g in ev.equal_terms if device_k in g), [device_k])
    assert any(t.op == "reshape" and t.args[0].op == "slice" and t.args[0].attrs[0] == 3 for t in stated)
    values = {0: RNG.standard_normal((B, T, 8)), 1: RNG.standard_normal((8, N * S * HD))}
    expected = (values[0] @ values[1]).reshape(B, T, N, S, HD)[:, :, 1:2, 2, :]
    for t in stated:
        np.testing.assert_allclose(evaluate(t, values), expected, rtol=1e-6)
    group_1 = ev.table.make("slice", (2, 1, 2), (reference_k,), (B, T, 1, HD), "f32")
    assert _proved(device_k, group_1, ev.equal_terms)
    # another slot or the other group is another value
    other_slot = ev.table.make("slice", (2, 1, 2), (_slot(ev, reference, N, 3),), (B, T, 1, HD), "f32")
    group_0 = ev.table.make("slice", (2, 0, 1), (reference_k,), (B, T, 1, HD), "f32")
    for wrong in (other_slot, group_0):
        assert not np.allclose(evaluate(wrong, values), expected)
        assert not _proved(device_k, wrong, ev.equal_terms)


def test_a_dot_of_relaid_operands_keeps_its_written_form_beside_it() -> None:
    # einsum("bngqk,bknd->bqngd", probs, v) with v a slot of the [b, t, n, S, hd] split: built as a
    # window of the dot with the whole split (relayouts), the written dot of v stated beside it
    ev = Evaluator(None, TermTable(), 1)
    flat = ev.table.make("param", (0,), (), (B, T, N * S * HD), "f32")
    probs = ev.table.make("param", (1,), (), (B, N, 2, T, T), "f32")
    v = _slot(ev, flat, N, 3)
    term = dot(ev, _dot_inst((B, N, HD, 2, T), "{1}", "{4}", "{0,2}", "{0,1}"), [v, probs], 0)
    assert term.op != "dot" or term.args[0] is not v, "the dot was not relaid"
    written = next((g for g in ev.equal_terms if term in g), [term])
    assert any(t.op == "dot" and t.args == (v, probs) for t in written)
    values = {0: RNG.standard_normal((B, T, N * S * HD)), 1: RNG.standard_normal((B, N, 2, T, T))}
    expected = np.einsum("bknd,bngqk->bndgq", values[0].reshape(B, T, N, S, HD)[:, :, :, 3, :], values[1])
    for t in written:
        np.testing.assert_allclose(evaluate(t, values), expected, rtol=1e-6)


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, T, D, N, G, HD = 2, 4, 16, 2, 2, 4


    def inputs():
        f32 = jnp.float32
        return (jax.ShapeDtypeStruct((B, T, D), f32), jax.ShapeDtypeStruct((D, N * (G + 2) * HD), f32),
                jax.ShapeDtypeStruct((N * G * HD, D), f32))


    def _attend(q, k, v):  # q [b, t, n, G, hd], k and v [b, t, n, hd]
        s = jnp.einsum("bqngd,bknd->bngqk", q, k) * HD ** -0.5
        return jnp.einsum("bngqk,bknd->bqngd", jax.nn.softmax(s, axis=-1), v)


    def attention(x, w, wo):
        slab = (x @ w).reshape(B, T, N, G + 2, HD)
        return _attend(slab[..., :G, :], slab[..., G, :], slab[..., G + 1, :]).reshape(B, T, -1) @ wo


    def _tp(x, w, wo, mesh, local):
        def body(x, w, wo):
            return lax.psum(local(x, w).reshape(B, T, -1) @ wo, "mp")

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "mp"), P("mp", None)), out_specs=P())(
            x, w, wo)


    def _sliced(q_slots, k_slot, v_slot):
        def local(x, w):
            slab = (x @ w).reshape(B, T, -1, G + 2, HD)
            return _attend(slab[..., q_slots, :], slab[..., k_slot, :], slab[..., v_slot, :])

        return local


    def sliced_tp(x, w, wo, *, mesh):
        return _tp(x, w, wo, mesh, _sliced(slice(0, G), G, G + 1))


    def swapped_kv_tp(x, w, wo, *, mesh):
        return _tp(x, w, wo, mesh, _sliced(slice(0, G), G + 1, G))  # MARK:swapped


    def reversed_heads_tp(x, w, wo, *, mesh):
        return _tp(x, w, wo, mesh, _sliced(slice(G - 1, None, -1), G, G + 1))  # MARK:reversed


    def split_tp(x, w, wo, *, mesh):  # the slab split at the slot bounds, k and v squeezed
        def local(x, w):
            q, k, v = jnp.split((x @ w).reshape(B, T, -1, G + 2, HD), [G, G + 1], axis=3)
            return _attend(q, k.squeeze(3), v.squeeze(3))

        return _tp(x, w, wo, mesh, local)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: sliced, reference: m.py:attention, distributed: m.py:sliced_tp, inputs: m.py:inputs, mesh: {mp: 2}}
      - {name: split, reference: m.py:attention, distributed: m.py:split_tp, inputs: m.py:inputs, mesh: {mp: 2}}
      - {name: swapped-kv, reference: m.py:attention, distributed: m.py:swapped_kv_tp, inputs: m.py:inputs,
         mesh: {mp: 2}}
      - {name: reversed-heads, reference: m.py:attention, distributed: m.py:reversed_heads_tp, inputs: m.py:inputs,
         mesh: {mp: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("grouped_qkv"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["sliced", "split"])
def test_whole_groups_of_a_group_major_fused_kernel_verify(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["swapped-kv", "reversed-heads"])
def test_near_misses_of_group_slots_are_mismatches(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
