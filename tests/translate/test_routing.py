"""Expert-parallel routing (equivci/translate/routing.py): the mask lemma, and near misses of the
dispatch/combine pattern that must not verify. The end-to-end correct case is also in the zoo
(moe-ep); here the mesh is smaller and the defects target each check of the proof."""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify

from equivci.results import Status
from equivci.translate.routing import _one_slot_each

MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    T, D, F, E = 8, 4, 8, 2


    def inputs():
        f = jnp.float32
        return (jax.ShapeDtypeStruct((T, D), f), jax.ShapeDtypeStruct((D, E), f),
                jax.ShapeDtypeStruct((E, D, F), f), jax.ShapeDtypeStruct((E, F, D), f))


    def wide_inputs():
        f = jnp.float32
        return (jax.ShapeDtypeStruct((4 * T, D), f), jax.ShapeDtypeStruct((D, E), f),
                jax.ShapeDtypeStruct((E, D, F), f), jax.ShapeDtypeStruct((E, F, D), f))


    def expert(x, w1, w2):
        return jnp.tanh(x @ w1) @ w2


    def reference(x, w_router, w1, w2):
        probs = jax.nn.softmax(x @ w_router, axis=-1)
        choice = jnp.argmax(probs, axis=-1)
        gate = jnp.take_along_axis(probs, choice[:, None], axis=-1)
        outs = jax.vmap(expert, in_axes=(None, 0, 0))(x, w1, w2)
        return gate * jnp.take_along_axis(outs, choice[None, :, None], axis=0)[0]


    def mask(choice):
        onehot = jax.nn.one_hot(choice, E, dtype=jnp.int32)
        slot = jnp.cumsum(onehot, axis=0) * onehot - 1
        return jax.nn.one_hot(slot, choice.shape[0], dtype=jnp.float32) * onehot[..., None]


    def moe(x, w_router, w1, w2, mesh, bug):
        def body(x, w_router, w1, w2):
            probs = jax.nn.softmax(x @ w_router, axis=-1)
            choice = jnp.argmax(probs, axis=-1)
            gate = jnp.take_along_axis(probs, choice[:, None], axis=-1)
            dispatch = mask(choice)
            buffers = jnp.einsum("tec,td->ecd", dispatch, x)
            received = lax.all_to_all(buffers, "ep", 0, 0, tiled=True)
            if bug == "other_expert":  # every device runs the next device's expert
                j = (lax.axis_index("ep") + 1) % E
                y = expert(received, w1[j], w2[j])  # MARK:other_expert
            else:
                y = expert(received, w1[lax.axis_index("ep")], w2[lax.axis_index("ep")])
            back = lax.all_to_all(y, "ep", 0, 0, tiled=True)
            combine = mask((choice + 1) % E) if bug == "other_mask" else dispatch  # MARK:other_mask
            return jnp.einsum("tec,ecd->td", combine, back) * gate

        return jax.shard_map(body, mesh=mesh, in_specs=(P("ep"), P(), P(), P()), out_specs=P("ep"))(x, w_router, w1, w2)


    def correct(x, w_router, w1, w2, *, mesh):
        return moe(x, w_router, w1, w2, mesh, None)


    def other_expert(x, w_router, w1, w2, *, mesh):
        return moe(x, w_router, w1, w2, mesh, "other_expert")  # MARK:pass-other_expert


    def other_mask(x, w_router, w1, w2, *, mesh):
        return moe(x, w_router, w1, w2, mesh, "other_mask")  # MARK:pass-other_mask
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: correct, reference: moe.py:reference, distributed: moe.py:correct, inputs: moe.py:inputs, mesh: {ep: 2}}
      - {name: other_expert, reference: moe.py:reference, distributed: moe.py:other_expert, inputs: moe.py:inputs, mesh: {ep: 2}}
      - {name: other_mask, reference: moe.py:reference, distributed: moe.py:other_mask, inputs: moe.py:inputs, mesh: {ep: 2}}
      - {name: wide, reference: moe.py:reference, distributed: moe.py:correct, inputs: moe.py:wide_inputs, mesh: {ep: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("moe_models"), "moe.py", MODELS, MANIFEST)


def test_dispatch_and_combine_with_replicated_weights_verify(manifest):
    result = _verify(manifest, "correct")
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["other_expert", "other_mask"])
def test_near_misses_are_not_verified(manifest, name):
    result = _verify(manifest, name)
    assert result.status in (Status.MISMATCH, Status.UNPROVEN), name
    places = [(f.path, f.line) for f in result.findings]
    # Each wrong choice is made by a static argument that `correct` passes otherwise
    # (diagnose/arguments.py). The expert is picked under an `if` on it: the branch's statement is
    # the code written for that call and leads, the call that passes the flag its tied note next.
    # The mask is picked by a conditional expression inside one statement that every call runs:
    # the call that passes the flag leads, the op's line its tied note next.
    passed = ("moe.py", model_package.line_of(MODELS, f"pass-{name}"))
    written = ("moe.py", model_package.line_of(MODELS, name))
    assert places[:2] == ([written, passed] if name == "other_expert" else [passed, written]), result.findings
    assert result.findings[0].tie is not None and result.findings[0].tie == result.findings[1].tie


def test_routing_past_the_enumeration_bound_is_reported(manifest):
    """16 tokens per device: 2**16 index vectors, past the lemma's bound. Unproven, and it says why."""
    result = _verify(manifest, "wide")
    assert result.status is Status.UNPROVEN, result.findings
    notes = [f.message for f in result.findings if "routing lemma did not check" in f.message]
    assert notes and "16 tokens" in notes[0] and "4096" in notes[0], result.findings


def _mask(q: list[int], experts: int, slots: int) -> np.ndarray:
    m = np.zeros((len(q), experts, slots))
    used = [0] * experts
    for t, e in enumerate(q):
        m[t, e, used[e]] = 1
        used[e] += 1
    return m


def test_mask_lemma():
    q = np.array([1, 0, 1, 1])
    m = _mask(list(q), 2, 4)
    assert _one_slot_each(m, q)
    shared = m.copy()
    shared[1] = 0
    shared[1, 1, 0] = 1  # token 1 in token 0's slot, and in the wrong expert
    assert not _one_slot_each(shared, q)
    two_slots = m.copy()
    two_slots[0, 1, 3] = 1  # token 0 in two slots
    assert not _one_slot_each(two_slots, q)
    dropped = m.copy()
    dropped[3] = 0  # token 3 has no slot (capacity overflow)
    assert not _one_slot_each(dropped, q)
    assert not _one_slot_each(m, np.array([1, 0, 1, 0]))  # slot's expert is not the index


def test_numeric_ops_follow_the_term_semantics():
    """Builder.numeric (which the mask lemma runs) against the numpy model of the terms."""
    from equivci.hlo.ir import Module, Shape
    from equivci.terms.ir import TermTable
    from equivci.terms.semantics import evaluate
    from equivci.terms.spec import bcast_spec, transpose_text
    from equivci.translate.evaluator import Evaluator

    table = TermTable()
    ev = Evaluator(Module.__new__(Module), table, 1)
    rng = np.random.default_rng(0)
    x, y = (table.make("param", (k,), (), (3, 4), "s32") for k in (0, 1))
    env = {k: rng.integers(-5, 5, size=(3, 4)).astype(np.int32) for k in (0, 1)}
    wide = table.make("bcast", (bcast_spec(2, (4, 2, 3), (2, 0)),), (x,), (4, 2, 3), "s32")  # transposing
    cmp = table.make("binary", ("compare-GE:s32",), (wide, wide), (4, 2, 3), "pred")
    conv = table.make("unary", ("convert",), (cmp,), (4, 2, 3), "f32")
    # the layout ops and the two-operand ones, on operands that differ (an operand taken for another shows)
    less = table.make("binary", ("compare-LT:s32",), (x, y), (3, 4), "pred")
    terms = (
        wide, cmp, conv, less,
        ev.slice_term(x, 1, 1, 3),
        ev.reshape_term(x, Shape("s32", (2, 6))),
        table.make("transpose", (transpose_text((1, 0)),), (x,), (4, 3), "s32"),
        ev.concat([x, y], 0),
        table.make("binary", ("subtract",), (x, y), (3, 4), "s32"),
        table.make("ternary", ("select",), (less, x, y), (3, 4), "s32"),
    )
    assert [t.op for t in terms[4:8]] == ["slice", "reshape", "transpose", "concat"]
    for term in terms:
        args = [evaluate(a, env) for a in term.args]
        assert np.array_equal(ev.numeric(term, args), evaluate(term, env)), term.op


def test_a_combine_reads_the_expert_output_in_either_operand_order():
    """The builder reads a dot that a dot reads in one operand order (relayouts.reoriented), which
    may put an expert's weights first: the combine over dot(w, h) is the combine over dot(h, w) with
    its contracted dims renamed (routing._other_order). Checked on random arrays; a combine whose
    free dims the swap would reorder is refused."""
    from equivci.hlo.ir import Module, Shape
    from equivci.terms.ir import TermTable
    from equivci.terms.semantics import evaluate
    from equivci.terms.spec import DotSpec
    from equivci.translate.evaluator import Evaluator
    from equivci.translate.routing import _dot_spec, _other_order

    table = TermTable()
    ev = Evaluator(Module.__new__(Module), table, 1)
    rng = np.random.default_rng(1)
    m, h, w = (table.make("param", (k,), (), s, "f32") for k, s in enumerate([(4, 2, 3), (2, 3, 6), (6, 5)]))
    env = {k: rng.standard_normal(s) for k, s in enumerate([(4, 2, 3), (2, 3, 6), (6, 5)])}
    f32 = ("f32", "f32")
    written = ev.mk("dot", (DotSpec((), (), (2,), (0,), 3, 2, f32).text(),), [h, w], Shape("f32", (2, 3, 5)))
    back = ev.mk("dot", (DotSpec((), (), (0,), (2,), 2, 3, f32).text(),), [w, h], Shape("f32", (5, 2, 3)))
    combine = ev.mk("dot", (DotSpec((), (), (1, 2), (1, 2), 3, 3, f32).text(),), [m, back], Shape("f32", (4, 5)))
    renamed, other = _other_order(ev, _dot_spec(combine), back)
    assert other is written and renamed.rc == [0, 1]
    spec = DotSpec((), (), tuple(renamed.lc), tuple(renamed.rc), 3, 3, f32).text()
    again = ev.mk("dot", (spec,), [m, other], Shape("f32", (4, 5)))
    np.testing.assert_allclose(evaluate(again, env), evaluate(combine, env), rtol=1e-6)
    # contracting only the expert dim leaves back's dims 0 and 2 free: swapped, they come out 2, 0
    one = ev.mk("dot", (DotSpec((), (), (1,), (1,), 3, 3, f32).text(),), [m, back], Shape("f32", (4, 3, 5, 3)))
    assert _other_order(ev, _dot_spec(one), back) is None
