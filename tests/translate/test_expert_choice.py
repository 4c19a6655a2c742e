"""Expert-choice MoE on a {data, expert} mesh (issue 13): each expert picks its top-C tokens of
the sequence, every device holds its batch rows of its experts' choices. The facts that make the
devices meet the reference, each checked numerically against XLA here:

* a device's constant table cut along two dims at once is the nested window of the reference's
  table (translate/constants.py, `two_dim_windows`): a top-k's positions over a device's rows and
  experts (test_constant_windows.py holds the pool's own tests);
* a window along two lower dims of a reference value that is itself a window along a higher dim
  (`slices/reorder_onto_reference_nested`): a device's rows and experts of the top-k values, which
  the reference cuts out of its sort along the sorted dim;
* a sum over a dot's batch dims as the dot contracting them (reductions.summed_batches), its
  contraction pairs in the lhs's order (reductions.contraction_sorted), and a dot whose operands
  swap without moving a dim (gates times an expert's rows) read in the canonical operand order too
  (relayouts.canonical_dot): a combine vmapped over the local experts, summed over them, then
  psummed, against the reference's einsum contracting experts and slots.

The models: a replicated router whose probabilities each device slices with
`dynamic_slice_in_dim(axis_index * EL)` (by `lax.top_k` or by `argsort(-p)` and
`take_along_axis`), and a router sharded over experts with the softmax normaliser psum'd over
them (the combine vmapped over the local experts, or the reference's einsums). Near misses: the next device's
experts sliced, the softmax normalised over the device's experts only, each expert's bottom-C
tokens.
"""

from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import model_package
import numpy as np
import pytest
from one_device import programs

from equivci.results import Status
from equivci.terms.semantics import evaluate

RNG = np.random.default_rng(13)


def _stated(built, term):
    """The terms stated equal to `term`."""
    return [t for group in built.evaluator.equal_terms if term in group for t in group if t is not term]


def _check_holds(built, args, want, terms):
    params = dict(enumerate(args))
    for t in terms:
        np.testing.assert_allclose(evaluate(t, params, built.evaluator.values), want, rtol=1e-5, atol=1e-5)


# -- a sum over a dot's batch dims ------------------------------------------------------------------------
G = RNG.standard_normal((4, 6, 3)).astype(np.float32)  # [e, t, c]
Y = RNG.standard_normal((4, 3, 5)).astype(np.float32)  # [e, c, d]

SUMMED_BATCH = {
    "vmap": lambda g, y: jax.vmap(lambda a, b: a @ b)(g, y).sum(0),
    "einsum": lambda g, y: jnp.einsum("etc,ecd->etd", g, y).sum(0),
}


@pytest.mark.parametrize("style", sorted(SUMMED_BATCH))
def test_a_sum_over_a_dots_batch_dim_is_the_dot_contracting_it(style):
    built, want, _ = programs(SUMMED_BATCH[style], (G, Y))
    out = built.reference_outputs[0]
    contracted = [t for t in _stated(built, out) if t.op == "dot" and len(t.attrs[0].split("|")[2].split(",")) == 2]
    assert contracted, [t.op for t in _stated(built, out)]
    _check_holds(built, (G, Y), want, [out, *contracted])


@pytest.mark.parametrize(
    "fn",
    [
        lambda g, y: jax.vmap(lambda a, b: a @ b)(g, y).max(0),  # another reducer
        lambda g, y: jnp.einsum("etc,ecd->etd", g, y).sum(1),  # a free dim summed
    ],
    ids=["max", "free-dim"],
)
def test_no_contraction_for_another_reducer_or_a_free_dim(fn):
    built, want, _ = programs(fn, (G, Y))
    out = built.reference_outputs[0]
    assert not [t for t in _stated(built, out) if t.op == "dot"]
    _check_holds(built, (G, Y), want, [out, *_stated(built, out)])


def test_contraction_pairs_in_the_lhs_order_are_the_same_dot():
    """einsum orders the pairs by their letters ("bect,becd": c before e); sizes alike, so that pairs
    matched the wrong way round would still be a well-typed dot."""
    d, y = RNG.standard_normal((2, 3, 3, 4)).astype(np.float32), RNG.standard_normal((2, 3, 3, 5)).astype(np.float32)
    built, want, _ = programs(lambda d, y: jnp.einsum("bect,becf->btf", d, y), (d, y))
    out = built.reference_outputs[0]
    spec = out.attrs[0].split("|")
    assert spec[2] == "2,1"  # as einsum wrote it
    ordered = [t for t in _stated(built, out) if t.op == "dot" and t.attrs[0].split("|")[2] == "1,2"]
    assert ordered
    _check_holds(built, (d, y), want, ordered)


# -- the layers on {data: 2, expert: 2} -----------------------------------------------------------------
MODELS = textwrap.dedent(
    '''\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, T, D, F, E = 4, 8, 8, 16, 4
    CAP = T * 2 // E
    EP = 2
    EL = E // EP


    def inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
        return {"router": f(D, E), "w1": f(E, D, F), "w2": f(E, F, D)}, f(B, T, D)


    def _top_k(p):
        """p [B, e, T] -> gates, token ids [B, e, C]: each expert's top-C tokens."""
        return lax.top_k(p, CAP)


    def _by_argsort(p):
        idx = jnp.argsort(-p, axis=-1)[..., :CAP]
        return jnp.take_along_axis(p, idx, axis=-1), idx


    def _bottom_k(p):
        g, i = lax.top_k(-p, CAP)
        return -g, i


    def _layer(params, x, probs, choose=_top_k):
        gates, idx = choose(probs.transpose(0, 2, 1))
        dispatch = jax.nn.one_hot(idx, T, dtype=x.dtype)
        xin = jnp.einsum("bect,btd->becd", dispatch, x)
        y = jnp.einsum("becf,efd->becd", jax.nn.relu(jnp.einsum("becd,edf->becf", xin, params["w1"])), params["w2"])
        return jnp.einsum("bect,bec,becd->btd", dispatch, gates, y)


    def moe(params, x):
        return _layer(params, x, jax.nn.softmax(x @ params["router"], axis=-1))


    def _global_softmax(logits):
        m = lax.pmax(lax.stop_gradient(logits.max(-1, keepdims=True)), "expert")
        e = jnp.exp(logits - m)
        return e / lax.psum(e.sum(-1, keepdims=True), "expert")


    def _local_softmax(logits):
        return jax.nn.softmax(logits, axis=-1)


    def _vmapped_combine(params, x, probs):
        gates, idx = _top_k(probs.transpose(0, 2, 1))
        dispatch = jax.nn.one_hot(idx, T, dtype=x.dtype)
        xin = jnp.einsum("bect,btd->becd", dispatch, x)
        y = jnp.einsum("becf,efd->becd", jax.nn.relu(jnp.einsum("becd,edf->becf", xin, params["w1"])), params["w2"])
        one = lambda d, g, y: jnp.einsum("bct,bc,bcd->btd", d, g, y)
        return lax.psum(jax.vmap(one, in_axes=(1, 1, 1))(dispatch, gates, y).sum(0), "expert")


    def _einsums(params, x, probs):
        return lax.psum(_layer(params, x, probs), "expert")


    def _run(body, router_spec, params, x, mesh):
        specs = {"router": router_spec, "w1": P("expert"), "w2": P("expert")}
        return jax.shard_map(body, mesh=mesh, in_specs=(specs, P("data")), out_specs=P("data"), check_vma=False)(
            params, x
        )


    def _sliced(offset, choose=_top_k):
        def body(params, x):
            probs = jax.nn.softmax(x @ params["router"], axis=-1)
            mine = lax.dynamic_slice_in_dim(probs, offset(lax.axis_index("expert")), EL, axis=-1)
            return lax.psum(_layer(params, x, mine, choose), "expert")

        return lambda params, x, mesh: _run(body, P(), params, x, mesh)


    def _sharded(softmax, layer):
        def body(params, x):
            return layer(params, x, softmax(x @ params["router"]))

        return lambda params, x, mesh: _run(body, P(None, "expert"), params, x, mesh)


    sliced = _sliced(lambda i: i * EL)
    sliced_argsort = _sliced(lambda i: i * EL, _by_argsort)
    sliced_next_experts = _sliced(lambda i: (i + 1) % EP * EL)
    sliced_bottom_k = _sliced(lambda i: i * EL, _bottom_k)
    sharded_vmapped = _sharded(_global_softmax, _vmapped_combine)
    sharded_einsum = _sharded(_global_softmax, _einsums)
    sharded_local_softmax = _sharded(_local_softmax, _vmapped_combine)
    '''
)

CORRECT = ["sliced", "sliced-argsort", "sharded-vmapped", "sharded-einsum"]
NEAR_MISSES = ["sharded-local-softmax", "sliced-next-experts", "sliced-bottom-k"]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    cases = [(name, "moe", name.replace("-", "_")) for name in CORRECT + NEAR_MISSES]
    text = model_package.manifest_text(cases, "{data: 2, expert: 2}")
    return model_package.write_package(tmp_path_factory.mktemp("expert_choice"), "model.py", MODELS, text)


@pytest.mark.parametrize("name", CORRECT)
def test_expert_choice_on_data_and_expert_shards_verifies(manifest, name):
    result = model_package.verify_named(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", [NEAR_MISSES[0], *(pytest.param(n, marks=pytest.mark.slow) for n in NEAR_MISSES[1:])])
def test_near_misses_of_expert_choice_are_mismatches(manifest, name):
    result = model_package.verify_named(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
