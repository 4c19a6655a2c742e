"""Prefix sums over a sharded sequence, in other styles than test_running_sums.py: each device's
running sum plus an exclusive prefix of the shard totals over the device axis.

Facts (equivci/translate/windows.py, reductions.py): a dot whose operands are windows of one range
along a batch dim they share is that window of the dot of the wholes (linear attention's per-token
outer product `einsum("bsc,bsd->bscd", k, v)` of a device's tokens), and an elementwise select of
windows (elu's `where(x > 0, x, expm1(x))`) the window of the select; a dot with a constant operand
of ones and zeros in runs along its contraction (`tensordot((arange(n) < me).astype(f), gathered,
1)`) is the sum of the kept pieces; a dot with an operand that is zero everywhere is zero (device 0
adds no earlier totals); totals of adjacent windows added in any order are the total of their union
(cumsums.merged_totals). Checked on values here, and end to end: the totals all-gathered and summed
by a masked tensordot and an exclusive running sum verify, and so do the earlier totals by log-step
ppermute doubling on a {dp, sp} mesh (its search stops at the pass that proves it: it grew past the
machine before). Near misses (the own shard's total counted, a cyclic doubling,
the later shards weighted 2, the neighbour's v in the outer product) are refuted by the oracle.
"""

from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify

from equivci.hlo.parser import parse_module
from equivci.results import Status
from equivci.terms.ir import Term, TermTable
from equivci.terms.semantics import evaluate
from equivci.translate import windows
from equivci.translate.evaluator import Evaluator

MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, S, C = 2, 16, 4


    def inputs():
        return jax.ShapeDtypeStruct((B, S, C), jnp.float32), jax.ShapeDtypeStruct((C, C), jnp.float32)


    def _outer(x, w):  # elu + 1 features, one outer product per token (a dot over the batch dims b, s)
        k = jax.nn.elu(x @ w) + 1.0
        return jnp.einsum("bsc,bsd->bscd", k, x)


    def mixer(x, w):
        return jnp.tanh(jnp.cumsum(_outer(x, w), axis=1).sum(-1)) + x


    def exclusive_mixer(x, w):
        v = x @ w
        return jnp.tanh(jnp.cumsum(v, axis=1) - v) + x


    def _dotted(keep):  # every device's total gathered on a new leading axis, a masked tensordot of them
        def prefix(total):
            me = lax.axis_index("sp")
            every = lax.all_gather(total, "sp")
            return jnp.tensordot(keep(jnp.arange(every.shape[0]), me).astype(total.dtype), every, axes=1)

        return prefix


    def _doubling(cyclic):  # the earlier devices' totals by log-step doubling over ppermute
        def prefix(total):
            n = lax.axis_size("sp")
            acc = lax.ppermute(total, "sp", [(i, i + 1) for i in range(n - 1)])
            shift = 1
            while shift < n:
                pairs = [(i, (i + shift) % n) for i in range(n)] if cyclic else [(i, i + shift) for i in range(n - shift)]
                acc = acc + lax.ppermute(acc, "sp", pairs)
                shift *= 2
            return acc

        return prefix


    def _sp(x, w, mesh, prefix, spec=P(None, "sp"), neighbour=False):
        def body(xs, w):
            v = xs
            if neighbour:
                n = lax.axis_size("sp")
                v = lax.ppermute(xs, "sp", [(i, (i + 1) % n) for i in range(n)])
            k = jax.nn.elu(xs @ w) + 1.0
            u = jnp.einsum("bsc,bsd->bscd", k, v)
            run = jnp.cumsum(u, axis=1) + prefix(u.sum(1))[:, None]
            return jnp.tanh(run.sum(-1)) + xs

        return jax.shard_map(body, mesh=mesh, in_specs=(spec, P()), out_specs=spec)(x, w)


    def dotted(x, w, *, mesh):
        return _sp(x, w, mesh, _dotted(lambda k, me: k < me))


    def doubling(x, w, *, mesh):
        return _sp(x, w, mesh, _doubling(False), P("dp", "sp"))


    def exclusive(x, w, *, mesh):
        def body(xs, w):
            v = xs @ w
            return jnp.tanh(jnp.cumsum(v, axis=1) - v + _dotted(lambda k, me: k < me)(v.sum(1))[:, None]) + xs

        return jax.shard_map(body, mesh=mesh, in_specs=(P(None, "sp"), P()), out_specs=P(None, "sp"))(x, w)


    def own_counted(x, w, *, mesh):
        return _sp(x, w, mesh, _dotted(lambda k, me: k <= me))


    def later_doubled(x, w, *, mesh):  # the earlier shards weighted 1, the others 2
        return _sp(x, w, mesh, _dotted(lambda k, me: jnp.where(k < me, 1, 2)))


    def cyclic(x, w, *, mesh):
        return _sp(x, w, mesh, _doubling(True), P("dp", "sp"))


    def neighbour_v(x, w, *, mesh):
        return _sp(x, w, mesh, _dotted(lambda k, me: k < me), neighbour=True)
    """
)

CASES = {
    "dotted": ("mixer", "{sp: 4}"),
    "doubling": ("mixer", "{dp: 2, sp: 4}"),
    "exclusive": ("exclusive_mixer", "{sp: 4}"),
    "own-counted": ("mixer", "{sp: 4}"),
    "later-doubled": ("mixer", "{sp: 4}"),
    "cyclic": ("mixer", "{dp: 2, sp: 4}"),
    "neighbour-v": ("mixer", "{sp: 4}"),
}
MANIFEST = model_package.manifest_text([(n, ref, n.replace("-", "_"), mesh) for n, (ref, mesh) in CASES.items()])


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("prefix_sums"), "model.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["dotted", "exclusive"])
def test_a_shard_plus_an_exclusive_prefix_of_the_totals_verifies(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.slow  # 16 s beside other work
def test_a_prefix_by_ppermute_doubling_verifies(manifest):
    result = _verify(manifest, "doubling")
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize(
    "name", ["own-counted", "later-doubled", "neighbour-v", pytest.param("cyclic", marks=pytest.mark.slow)]
)
def test_other_prefixes_are_mismatches(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)


# -- the facts, on values --------------------------------------------------------------------------


def _built(fn, *args) -> tuple[Evaluator, Term, dict[int, np.ndarray]]:
    """The evaluator run over fn's program on one device, its one output's term, its inputs by number."""
    module = parse_module(jax.jit(fn).lower(*args).as_text(dialect="hlo"))
    ev = Evaluator(module, TermTable(), 1)
    params = [ev.table.make("param", (k,), (), a.shape, "f32") for k, a in enumerate(args)]
    (out,) = ev.run(module.entry, [[p] for p in params])
    return ev, out[0] if isinstance(out, tuple) else out, dict(enumerate(args))


def _stated_with(ev: Evaluator, t: Term) -> list[Term]:
    """The terms stated equal to t, through the stated groups."""
    found, frontier = {id(t): t}, [t]
    while frontier:
        u = frontier.pop()
        for group in ev.equal_terms:
            if any(v is u for v in group):
                for v in group:
                    if id(v) not in found:
                        found[id(v)] = v
                        frontier.append(v)
    return list(found.values())


def _products(t: Term) -> int:
    """How many dots and multiplies t is built of."""
    return (t.op == "dot" or t.attrs == ("multiply",)) + sum(_products(a) for a in t.args)


RNG = np.random.default_rng(3)
K = RNG.standard_normal((2, 8, 3)).astype(np.float32)
V = RNG.standard_normal((2, 8, 5)).astype(np.float32)


def _outer(k, v):
    return jnp.einsum("bsc,bsd->bscd", jax.nn.elu(k) + 1.0, v)


@pytest.mark.parametrize("lo, hi", [(0, 3), (2, 6), (5, 8)])
def test_a_dot_of_windows_along_a_shared_batch_dim_is_the_window_of_the_dot(lo, hi):
    """dot(x[a:b], y[a:b] along batch dims paired) = dot(x, y)[a:b], through elu's select too."""
    ev, out, params = _built(lambda k, v: _outer(k[:, lo:hi], v[:, lo:hi]), K, V)
    w = windows.window_form(ev, out)
    assert w is not None and (w.dim, w.start, w.stop) == (1, lo, hi)
    whole = evaluate(w.whole, params, ev.values)
    np.testing.assert_allclose(whole, np.asarray(_outer(K, V)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(whole[:, lo:hi], evaluate(out, params, ev.values), rtol=1e-5, atol=1e-6)


def test_near_miss_a_dot_of_windows_of_different_ranges_is_no_window():
    """Tokens 0:3 of k against tokens 1:4 of v: each token's product mixes two tokens."""
    ev, out, _ = _built(lambda k, v: _outer(k[:, 0:3], v[:, 1:4]), K, V)
    assert windows.window_form(ev, out) is None


TOTALS = RNG.standard_normal((4, 2, 3)).astype(np.float32)


@pytest.mark.parametrize("mask", [[1, 1, 0, 0], [0, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1]])
def test_a_dot_with_a_mask_of_ones_and_zeros_is_the_sum_of_the_kept_pieces(mask):
    """dot(mask, concat(t_0, ..., t_3)) = sum of the t_j where mask_j = 1, stated beside the dot (or
    the dot itself zero, for an all-zero mask); every stated form evaluates as the dot."""
    keep = np.asarray(mask, np.float32)
    ev, out, params = _built(lambda t: jnp.tensordot(keep, t, axes=1), TOTALS)
    want = np.tensordot(keep, TOTALS, axes=1)
    forms = _stated_with(ev, out)
    assert any(_products(t) == 0 for t in forms), "no sum of the kept pieces was stated"
    for t in forms:
        np.testing.assert_allclose(evaluate(t, params, ev.values), want, rtol=1e-6, atol=1e-6)


def test_near_miss_a_dot_with_a_mask_of_other_numbers_states_no_pieces():
    """[1, 2, 0, 0] weights the second piece twice: no sum of pieces is stated."""
    keep = np.asarray([1, 2, 0, 0], np.float32)
    ev, out, params = _built(lambda t: jnp.tensordot(keep, t, axes=1), TOTALS)
    forms = _stated_with(ev, out)
    assert all(_products(t) for t in forms)
    want = np.tensordot(keep, TOTALS, axes=1)
    for t in forms:
        np.testing.assert_allclose(evaluate(t, params, ev.values), want, rtol=1e-6, atol=1e-6)


ROWS = RNG.standard_normal((8, 3)).astype(np.float32)


@pytest.mark.parametrize(
    "fn",
    [
        lambda v: (v[4:6].sum(0) + v[2:4].sum(0)) + (v[0:2].sum(0) + 0.0),
        lambda v: v[3:8].sum(0) + v[0:3].sum(0),
        lambda v: v[0:2].sum(0) + (v[5:8].sum(0) + v[2:5].sum(0)),
    ],
)
def test_totals_of_adjacent_windows_added_in_any_order_are_the_total_of_their_union(fn):
    """sum(x[b:c]) + sum(x[a:b]) = sum(x[a:c]), in any grouping, zeros left out: the stated form is
    one sum of one window, and evaluates as the written sum."""
    ev, out, params = _built(fn, ROWS)
    merged = [t for t in _stated_with(ev, out) if t.op == "reduce"]
    assert merged, "no total of the union was stated"
    want = np.asarray(fn(ROWS))
    for t in merged:
        np.testing.assert_allclose(evaluate(t, params, ev.values), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "fn",
    [
        lambda v: v[4:6].sum(0) + v[0:2].sum(0),  # a gap
        lambda v: v[0:4].sum(0) + v[2:6].sum(0),  # an overlap
        lambda v: v[0:2].sum(0) + v[2:4].max(0),  # another reducer
    ],
)
def test_near_miss_totals_that_do_not_tile_a_window_state_no_union(fn):
    ev, out, params = _built(fn, ROWS)
    want = np.asarray(fn(ROWS))
    for t in _stated_with(ev, out):
        np.testing.assert_allclose(evaluate(t, params, ev.values), want, rtol=1e-5, atol=1e-6)
