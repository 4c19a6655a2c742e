"""Running sums of a sharded dim (equivci/translate/cumsums.py, reductions.over_pieces): a device's
running sum of its window plus the totals of the shards before it (an exclusive scan over shards) is
its window of the reference's running sum.

Facts: CS(v)[a:b] = CS(v[a:b]) + sum(v[0:a]); the last running sum is the total; a reduction over a
concatenation along the reduced dim is the reducer of the pieces' reductions, identity pieces left
out; a reduction of the identity is the identity; x + 0 = x. Each is checked on values here (the
stated groups' members evaluate alike), and end to end in two styles unlike blind split 5's: the
totals all-gathered tiled along the sequence dim and masked there, and a psum of each device's total
placed in its own slot. Near misses (an inclusive scan, the later shards' totals, a shard too few, no
carry, shard 0 adding a constant one) are refuted by the oracle.
"""

from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import model_package
import numpy as np
import pytest
from jax import lax
from model_package import verify_named as _verify

from equivci.capture.types import LeafPlacement
from equivci.hlo.parser import parse_module
from equivci.prove.programs import build_programs
from equivci.results import Status
from equivci.terms.ir import Term
from equivci.terms.semantics import evaluate
from equivci.translate.builder import Builder

MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, S, C = 2, 16, 4


    def inputs():
        return jax.ShapeDtypeStruct((B, S, C), jnp.float32), jax.ShapeDtypeStruct((C, C), jnp.float32)


    def mixer(x, w):
        return jnp.tanh(jnp.cumsum(x @ w, axis=1)) + x


    def _sp(x, w, mesh, carry_of):
        def body(xs, w):
            me = lax.axis_index("sp")
            run = jnp.cumsum(xs @ w, axis=1)
            return jnp.tanh(run + carry_of(run[:, -1:, :], me)) + xs

        return jax.shard_map(body, mesh=mesh, in_specs=(P(None, "sp"), P()), out_specs=P(None, "sp"))(x, w)


    def _gathered(keep):  # the totals all-gathered along the sequence dim, the shards `keep` picks summed
        def carry(total, me):
            every = lax.all_gather(total, "sp", axis=1, tiled=True)  # [B, n, C]
            shard = jnp.arange(every.shape[1])[None, :, None]
            return jnp.sum(jnp.where(keep(shard, me), every, 0.0), axis=1, keepdims=True)

        return carry


    def _slotted(total, me):  # each device's total psummed into its own slot, the earlier slots summed
        n = lax.axis_size("sp")
        slots = jnp.zeros((n,) + total.shape, total.dtype).at[me].set(total)
        every = lax.psum(slots, "sp")
        return jnp.sum(jnp.where((jnp.arange(n) < me)[:, None, None, None], every, 0.0), axis=0)


    def gathered(x, w, *, mesh):
        return _sp(x, w, mesh, _gathered(lambda k, me: k < me))


    def slotted(x, w, *, mesh):
        return _sp(x, w, mesh, _slotted)


    def inclusive(x, w, *, mesh):
        return _sp(x, w, mesh, _gathered(lambda k, me: k <= me))


    def later(x, w, *, mesh):
        return _sp(x, w, mesh, _gathered(lambda k, me: k > me))


    def one_short(x, w, *, mesh):
        return _sp(x, w, mesh, _gathered(lambda k, me: k < me - 1))


    def local(x, w, *, mesh):
        return _sp(x, w, mesh, lambda total, me: 0.0)


    def first_adds_one(x, w, *, mesh):  # shard 0 adds a constant where it should add nothing
        return _sp(x, w, mesh, lambda total, me: jnp.where(me == 0, 1.0, _gathered(lambda k, me: k < me)(total, me)))
    """
)

NAMES = ("gathered", "slotted", "inclusive", "later", "one-short", "local", "first-adds-one")
MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {n}, reference: m.py:mixer, distributed: m.py:{n.replace('-', '_')}, inputs: m.py:inputs, "
    "mesh: {sp: 4}}\n"
    for n in NAMES
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("running_sums"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["gathered", "slotted"])
def test_a_shard_plus_the_earlier_shards_totals_verifies(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["inclusive", "later", "one-short", "local", "first-adds-one"])
def test_carries_of_other_shards_are_mismatches(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)


# -- the stated facts, on values ------------------------------------------------------------------

V = np.random.default_rng(5).standard_normal((8, 3)).astype(np.float32)


def _translated(fn, *args) -> Builder:
    hlo = jax.jit(fn).lower(*args).as_text(dialect="hlo")
    module = parse_module(hlo)
    leaves = tuple(
        LeafPlacement(f"[{k}]", a.shape, str(a.dtype), (tuple((0, n) for n in a.shape),)) for k, a in enumerate(args)
    )
    want = jax.tree_util.tree_leaves(jax.eval_shape(fn, *args))
    outs = tuple(
        LeafPlacement(f"[{k}]", w.shape, str(w.dtype), (tuple((0, n) for n in w.shape),)) for k, w in enumerate(want)
    )
    return build_programs(module, module, leaves, outs, 1).evaluator


def _value(ev: Builder, t: Term, params: dict) -> np.ndarray:
    """t's value; running sums (opaque reduce-windows) by Builder.numeric."""
    if t.op == "opaque" or (t.op in ("binary", "bcast", "slice", "reshape") and _has_opaque(t)):
        value = ev.numeric(t, [_value(ev, a, params) for a in t.args])
        assert value is not None, t.op
        return value
    return evaluate(t, params, ev.values)


def _has_opaque(t: Term) -> bool:
    return t.op == "opaque" or any(_has_opaque(a) for a in t.args)


def _stated_running_sums(ev: Builder) -> list[list[Term]]:
    return [g for g in ev.equal_terms if any(_has_opaque(t) for t in g)]


@pytest.mark.parametrize("start", [0, 2, 5])
def test_a_running_sum_of_a_window_is_the_window_less_what_precedes_it(start):
    """CS(v)[a:a+3] = CS(v[a:a+3]) + sum(v[0:a]) is stated and true; CS(u)[-1:] is built as sum(u)."""
    ev = _translated(lambda v: (jnp.cumsum(v, axis=0), jnp.cumsum(v[start : start + 3], axis=0)), V)
    groups = _stated_running_sums(ev)
    windows = [g for g in groups if any(t.op == "slice" and t.shape == (3, 3) for t in g)]
    assert windows, "the window of the whole running sum was not stated"
    for group in groups:
        first, *rest = (_value(ev, t, {0: V}) for t in group)
        for other in rest:
            np.testing.assert_allclose(other, first, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_value(ev, windows[0][0], {0: V}), np.cumsum(V, 0)[start : start + 3], rtol=1e-5)
    local = next(u for g in windows for t in g for u in (t, *t.args) if u.op == "opaque" and u.shape == (3, 3))
    last = ev.slice_term(local, 0, 2, 3)
    assert last.op == "reshape" and last.args[0].op == "reduce"
    np.testing.assert_allclose(_value(ev, last, {0: V}), V[start : start + 3].sum(0, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize(
    "name, fn",
    [
        ("reversed", lambda v: lax.cumsum(v[2:5], axis=0, reverse=True)),
        ("two wide", lambda v: lax.reduce_window(v[2:5], 0.0, lax.add, (2, 1), (1, 1), ((1, 0), (0, 0)))),
        ("strided", lambda v: lax.reduce_window(v[2:6], 0.0, lax.add, (4, 1), (2, 1), ((3, 0), (0, 0)))),
    ],
)
def test_near_miss_windowed_sums_that_are_no_running_sums_state_nothing(name, fn):
    """A reversed cumsum (padded after), a sliding sum of two, a strided window: no fact."""
    assert _stated_running_sums(_translated(fn, V)) == []


def test_near_miss_the_last_row_of_a_reversed_running_sum_is_no_total():
    """lax.cumsum(reverse=True) holds the total in its first row: its last row stays a slice."""
    ev = _translated(lambda v: lax.cumsum(v, axis=0, reverse=True), V)
    (scan,) = ev.window_sums
    assert ev.slice_term(scan, 0, 7, 8).op == "slice"


GROUPS = np.random.default_rng(7).standard_normal((4, 6, 3)).astype(np.float32)  # [group, token, expert]


def _sorted_shares(v):
    """Each group's running sums over its tokens of its experts' shares, largest first (an aligned map:
    the same lanes as an argmax's), exclusive."""
    shares = lax.top_k(jax.nn.softmax(v, axis=-1), v.shape[-1])[0]
    return jnp.cumsum(shares, axis=1) - shares


@pytest.mark.parametrize("groups", [(0, 1), (1, 3)])
def test_a_running_sum_of_a_window_along_another_dim_is_its_window(groups):
    """CS(v[a:b along d]) = CS(v)[a:b along d] for d other than the running dim: a device's token
    groups, through a softmax (reduces over the experts) and a top-k of each token's shares (an
    aligned map), sum their tokens on their own."""
    lo, hi = groups
    ev = _translated(lambda v: (_sorted_shares(v), _sorted_shares(v[lo:hi])), GROUPS)
    stated = [g for g in _stated_running_sums(ev) if any(t.op == "slice" and t.shape[0] == hi - lo for t in g)]
    assert stated, "the window of the whole running sum was not stated"
    for group in stated:
        first, *rest = (_value(ev, t, {0: GROUPS}) for t in group)
        for other in rest:
            np.testing.assert_allclose(other, first, rtol=1e-6)


def test_near_miss_a_running_sum_of_a_window_along_its_own_dim_is_no_plain_window():
    """Tokens 2:5 of each group sum from their own first token: CS(v[:, 2:5]) is no window of CS(v)."""
    ev = _translated(lambda v: jnp.cumsum(v[:, 2:5], axis=1), GROUPS)
    for group in _stated_running_sums(ev):
        assert any(t.op == "binary" and t.attrs == ("add",) for t in group), "stated without what precedes"


@pytest.mark.parametrize(
    "name, fn",
    [
        ("rows of a window", lambda v: jnp.cumsum(jnp.tanh(v[:, 1:3])[2:6], axis=0)),
        ("window of a window", lambda v: jnp.cumsum(jnp.tanh(v[1:7])[1:4], axis=0)),
    ],
)
def test_every_stated_running_sum_of_nested_windows_holds(name, fn):
    """A running sum of a window of a value that is itself a window (a device's sequence window of
    its data-parallel rows) is related to the whole's running sum step by step: each stated group
    evaluates alike; a window along the summed dim is never stated as a plain window of it."""
    ev = _translated(fn, V)
    groups = _stated_running_sums(ev)
    assert groups
    for group in groups:
        first, *rest = (_value(ev, t, {0: V}) for t in group)
        for other in rest:
            np.testing.assert_allclose(other, first, rtol=1e-5, atol=1e-5)
