"""A reference `lax.scan` against a distributed program that runs no loop (the recurrence written as
a Python loop, its states stacked by hand).

Facts: a `while` with a constant trip count is its body applied that many times, so the reference's
loops are unrolled where the distributed program runs none (no invariant relates a loop to
straight-line code: translate/programs.py); a reshape of a concatenation whose parts are runs of
whole slabs along an output dim is the concatenation of the reshaped parts there, checked on labels
(`Builder.parts_dim`: a scan's [b, 1, c] states joined as [t * b, 1, c] and read [t, b, c]); a
transpose of a concatenation is the concatenation of the transposed parts along the dim the joined
dim moves to, a part's transpose that moves only size-1 dims being a reshape
(`Builder.transposed_parts`: `hs.swapaxes(0, 1)` of the stacked states). Checked on values, and end
to end: a gated linear recurrence and an exponential moving average, batch-sharded, stacked along
time by `jnp.stack(axis=1)` or along a new leading dim and swapped, verify; near misses (the state
updated from the input one step late, the gate of the next step) are refuted by the oracle.
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
from equivci.translate.evaluator import Evaluator

RNG = np.random.default_rng(39)


def _joined(ev: Evaluator, parts: list[tuple[int, ...]], dim: int):
    xs = [ev.table.make("param", (k,), (), shape, "f32") for k, shape in enumerate(parts)]
    values = {k: RNG.standard_normal(p).astype(np.float32) for k, p in enumerate(parts)}
    joined = xs[0]
    for x in xs[1:]:  # concatenations are binary terms
        shape = tuple(joined.shape[d] + x.shape[d] if d == dim else x.shape[d] for d in range(len(x.shape)))
        joined = ev.table.make("concat", (dim,), (joined, x), shape, "f32")
    return joined, values


@pytest.mark.parametrize(
    ("parts", "dim", "out", "stated"),
    [
        ([(4, 1, 3)] * 3, 0, (3, 4, 3), True),  # a scan's states joined along b, read [t, b, c]
        ([(4, 1, 3), (8, 1, 3)], 0, (3, 4, 3), True),  # two slabs in one part
        ([(2, 3), (4, 3)], 0, (3, 2, 3), True),
        ([(3, 1, 3), (3, 1, 3)], 0, (3, 2, 3), False),  # a part is no whole slab: (3, 1, 3) is half of one
        ([(3, 2), (3, 2)], 1, (2, 6), False),  # row-major, each row reads from both parts
    ],
)
def test_a_reshape_of_parts_that_are_whole_slabs_is_their_concatenation(parts, dim, out, stated):
    ev = Evaluator(None, TermTable(), 1)
    joined, values = _joined(ev, parts, dim)
    before = len(ev.equal_terms)
    written = ev.reshape_term(joined, Shape("f32", out))
    new = ev.equal_terms[before:]
    on_parts = [g for g in new if any(t.op == "concat" and t.shape == out for t in g)]
    assert bool(on_parts) == stated, new
    want = np.concatenate(list(values.values()), axis=dim).reshape(out)
    np.testing.assert_array_equal(evaluate(written, values, ev.values), want)
    for group in new:
        for t in group:
            np.testing.assert_array_equal(evaluate(t, values, ev.values), want)


@pytest.mark.parametrize(
    ("parts", "dim", "perm", "out_dim"),
    [
        ([(4, 1, 3)] * 3, 1, (1, 0, 2), 0),
        ([(2, 3, 5), (2, 4, 5)], 1, (2, 0, 1), 2),
        ([(1, 4, 3), (1, 4, 3)], 0, (1, 0, 2), 1),  # each part's transpose moves only its size-1 dim
    ],
)
def test_a_transpose_of_a_concatenation_is_the_concatenation_of_transposes(parts, dim, perm, out_dim):
    ev = Evaluator(None, TermTable(), 1)
    joined, values = _joined(ev, parts, dim)
    before = len(ev.equal_terms)
    written = ev.transpose_term(joined, perm)
    new = [g for g in ev.equal_terms[before:] if written in g]
    assert new and any(t.op == "concat" and t.attrs == (out_dim,) for t in new[0]), new
    want = np.concatenate(list(values.values()), axis=dim).transpose(perm)
    for t in new[0]:
        np.testing.assert_array_equal(evaluate(t, values, ev.values), want)


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, T, D = 4, 6, 8


    def inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
        return f(B, T, D), f(D, D)


    def recurrence(x, w):  # a gated diagonal linear recurrence, lax.scan over time
        a, u = jax.nn.sigmoid(x @ w), x

        def step(h, au):
            h = au[0] * h + au[1]
            return h, h

        _, hs = lax.scan(step, jnp.zeros((B, D)), (a.swapaxes(0, 1), u.swapaxes(0, 1)))
        return hs.swapaxes(0, 1)


    def ema(x, w):  # an exponential moving average of a projection, fori_loop into a buffer
        v = x @ w

        def step(t, carry):
            h, out = carry
            h = 0.9 * h + 0.1 * v[:, t]
            return h, out.at[:, t].set(h)

        return lax.fori_loop(0, T, step, (jnp.zeros((B, D)), jnp.zeros((B, T, D))))[1]


    def _dp(local):
        def run(x, w, *, mesh):
            return jax.shard_map(local, mesh=mesh, in_specs=(P("dp"), P()), out_specs=P("dp"))(x, w)

        return run


    def _recurrence_loop(lag=0, gate_shift=0):
        def local(x, w):
            a, h, hs = jax.nn.sigmoid(x @ w), jnp.zeros((x.shape[0], D)), []
            for t in range(T):
                h = a[:, min(t + gate_shift, T - 1)] * h + x[:, max(t - lag, 0)]
                hs.append(h)
            return jnp.stack(hs, axis=1)  # MARK:stack

        return local


    def _ema_loop(x, w):
        v, h, hs = x @ w, jnp.zeros((x.shape[0], D)), []
        for t in range(T):
            h = 0.9 * h + 0.1 * v[:, t]
            hs.append(h)
        return jnp.stack(hs).swapaxes(0, 1)


    recurrence_dp = _dp(_recurrence_loop())
    recurrence_dp_late_input = _dp(_recurrence_loop(lag=1))
    recurrence_dp_next_gate = _dp(_recurrence_loop(gate_shift=1))
    ema_dp = _dp(_ema_loop)
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    root = tmp_path_factory.mktemp("scan_stacks")
    cases = [
        ("recurrence-dp", "recurrence", "recurrence_dp"),
        ("recurrence-dp-late-input", "recurrence", "recurrence_dp_late_input"),
        ("recurrence-dp-next-gate", "recurrence", "recurrence_dp_next_gate"),
        ("ema-dp", "ema", "ema_dp"),
    ]
    return model_package.write_package(root, "model.py", MODELS, model_package.manifest_text(cases, "{dp: 2}"))


@pytest.mark.parametrize("name", ["recurrence-dp", "ema-dp"])
def test_a_scan_against_a_python_loop_verifies(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["recurrence-dp-late-input", "recurrence-dp-next-gate"])
def test_a_near_miss_of_the_loop_is_refuted(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, result.findings
