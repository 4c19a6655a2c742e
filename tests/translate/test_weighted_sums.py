"""A sum over dims R of a broadcast times a gather, as the dot it is (picks.weighted_sum):
sum_R a[.., r, ..] * y[.., r, ..] = dot(a, y; contracting R, batch the kept dims a reads), stated
beside the sum, exact over the reals.

The stated dot is evaluated against XLA on one device; no dot is stated where the other factor is
no gather. Then the top-k combine the reference writes with `take_along_axis`, its gates broadcast
over the picked rows and summed over the choices, verifies against an expert-parallel device
that contracts the gates with a one-hot of its local ids by einsum (`one_hot(idx - lo, E_local)`),
and so does one that selects its gates with `where(idx[..., None] == lo + arange(E_local), p, 0)`,
and one that picks its own experts' rows at its local ids clamped, `clip(idx - lo, 0, E_local - 1)`,
its gates masked to its experts, `where(lo <= idx < lo + E_local, p, 0)` (picks.masked_local_ids:
for e in [0, n) the masked gate times [clamp(x - lo) == e] is the gate times [x == lo + e])
(GELU experts: the builder moves GELU's 0.5 in front of the picked rows); the near miss (the ids
not offset by the device's first expert) is a mismatch.
"""

from __future__ import annotations

import textwrap

import jax.numpy as jnp
import model_package
import numpy as np
import pytest
from one_device import programs

from equivci.results import Status
from equivci.terms.semantics import evaluate

RNG = np.random.default_rng(31)
N, E, K, D = 6, 5, 2, 3
YS = RNG.standard_normal((N, E, D)).astype(np.float32)
GATES = RNG.standard_normal((N, K)).astype(np.float32)
IDX = RNG.integers(0, E, (N, K)).astype(np.int32)


def _dots(fn, args):
    """The groups that state a dot beside a reduce, each evaluated against the written sum."""
    built, want, _ = programs(fn, args)
    values = built.evaluator.values
    params = dict(enumerate(args))
    np.testing.assert_allclose(evaluate(built.reference_outputs[0], params, values), want, rtol=1e-5)
    found = []
    for group in built.evaluator.equal_terms:
        written = group[0].op == "reduce" or (group[0].op == "binary" and group[0].args[0].op == "reduce")
        if written and any(t.op in ("dot", "transpose") or t.args and t.args[0].op == "transpose" for t in group[1:]):
            first = evaluate(group[0], params, values)
            for other in group[1:]:
                np.testing.assert_allclose(evaluate(other, params, values), first, rtol=1e-5, atol=1e-6)
            found.append(group)
    return found


def test_gates_times_picked_rows_summed_over_the_choices_is_their_dot():
    def fn(ys, gates, idx):
        picked = jnp.take_along_axis(ys, (idx % E)[:, :, None], axis=1)
        return jnp.sum(gates[:, :, None] * picked, axis=1)

    assert _dots(fn, (YS, GATES, IDX))


def test_gates_summed_with_the_picks_first_is_their_dot_too():
    def fn(ys, gates, idx):
        picked = jnp.take_along_axis(ys, (idx % E)[:, :, None], axis=1)
        return jnp.sum(picked * gates[:, :, None], axis=1)

    assert _dots(fn, (YS, GATES, IDX))


def test_a_weighted_sum_of_scaled_picks_is_the_scaled_dot():
    def fn(ys, gates, idx):  # the builder moves the 0.5 in front of the product
        picked = jnp.take_along_axis(0.5 * ys, (idx % E)[:, :, None], axis=1)
        return jnp.sum(gates[:, :, None] * picked, axis=1)

    assert _dots(fn, (YS, GATES, IDX))


LO, LOCAL = 2, 3
WIDE_YS = RNG.standard_normal((N, LO + LOCAL + 1, D)).astype(np.float32)  # a clamp to LOCAL reads a row more
IDS = 8  # ids past the device's experts on both sides
LOCAL_IDX = RNG.integers(0, IDS, (N, K)).astype(np.int32)


def _masked_forms(fn, args):
    """The stated groups holding the gates against a one-hot of the ids at lo + arange(LOCAL), every
    group evaluated against XLA's values."""
    built, want, _ = programs(fn, args)
    values, params = built.evaluator.values, dict(enumerate(args))
    np.testing.assert_allclose(evaluate(built.reference_outputs[0], params, values), want, rtol=1e-5)
    found = []
    for group in built.evaluator.equal_terms:
        first = evaluate(group[0], params, values)
        for other in group[1:]:
            np.testing.assert_allclose(evaluate(other, params, values), first, rtol=1e-5, atol=1e-6)
        owned = [
            t
            for t in group
            if t.op == "reduce"
            and t.args[0].op == "binary"
            and any(
                a.op == "unary" and a.args[0].op == "binary" and _holds(built, a.args[0].args[1], LO + np.arange(LOCAL))
                for a in t.args[0].args
            )
        ]
        found.extend(owned)
    return found


def _holds(built, t, lanes):
    value = built.evaluator.folded(t)
    return value is not None and value.shape[-1] == len(lanes) and np.array_equal(value[(0,) * (value.ndim - 1)], lanes)


def _local_pick(first=0, top=LOCAL - 1, width=LOCAL, last=LOCAL):
    """A device's pick of its experts [LO, LO + LOCAL) at its clamped local ids, its gates masked to
    the local ids in [first, last)."""

    def fn(ys, gates, idx):
        local = idx % IDS - LO
        hit = (local >= first) & (local < last)
        picked = jnp.take_along_axis(ys[:, LO : LO + width], jnp.clip(local, 0, top)[:, :, None], axis=1)
        return jnp.sum(jnp.where(hit, gates, 0.0)[:, :, None] * picked, axis=1)

    return fn


def test_masked_gates_at_clamped_local_ids_are_the_gates_at_the_owned_ids():
    assert _masked_forms(_local_pick(), (WIDE_YS, GATES, LOCAL_IDX))


@pytest.mark.parametrize(
    "first, top, width, last",
    [
        (-1, LOCAL - 1, LOCAL, LOCAL),
        (0, LOCAL - 1, LOCAL, LOCAL + 1),
        (0, LOCAL, LOCAL + 1, LOCAL),
        (0, LOCAL - 2, LOCAL, LOCAL),
    ],
    ids=["a mask one early", "a mask one late", "a wider clamp", "a narrower clamp"],
)
def test_no_owned_ids_for_another_mask_or_clamp(first, top, width, last):
    assert _masked_forms(_local_pick(first, top, width, last), (WIDE_YS, GATES, LOCAL_IDX)) == []


def test_no_dot_beside_a_weighted_sum_of_an_input():
    ys = RNG.standard_normal((N, K, D)).astype(np.float32)
    assert _dots(lambda ys, gates: jnp.sum(gates[:, :, None] * ys, axis=1), (ys, GATES)) == []


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    T, D, F, E, K, EP = 16, 8, 16, 8, 2, 4
    E_LOCAL = E // EP


    def inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
        return f(D, E), f(E, D, F), f(E, F, D), f(T, D)


    def _route(wg, x):
        top_p, top_i = lax.top_k(jax.nn.softmax(x @ wg, axis=-1), K)
        return top_p, top_i


    def _experts(w1, w2, x):
        return jnp.einsum("tef,efd->ted", jax.nn.gelu(jnp.einsum("td,edf->tef", x, w1)), w2)


    def moe(wg, w1, w2, x):
        top_p, top_i = _route(wg, x)
        picked = jnp.take_along_axis(_experts(w1, w2, x), top_i[:, :, None], axis=1)
        return jnp.sum(top_p[:, :, None] * picked, axis=1)


    def _ep(wg, w1, w2, x, mesh, first):
        def body(wg, w1, w2, x):
            top_p, top_i = _route(wg, x)
            local = jax.nn.one_hot(top_i - first(lax.axis_index("ep")), E_LOCAL)
            combine = jnp.einsum("tk,tke->te", top_p, local)
            return lax.psum(jnp.einsum("te,ted->td", combine, _experts(w1, w2, x)), "ep")

        e = P("ep")
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), e, e, P()), out_specs=P(), check_vma=False)(wg, w1, w2, x)


    def moe_ep(wg, w1, w2, x, *, mesh):
        return _ep(wg, w1, w2, x, mesh, lambda me: me * E_LOCAL)


    def moe_ep_where(wg, w1, w2, x, *, mesh):
        def body(wg, w1, w2, x):
            top_p, top_i = _route(wg, x)
            mine = top_i[:, :, None] == lax.axis_index("ep") * E_LOCAL + jnp.arange(E_LOCAL)
            combine = jnp.where(mine, top_p[:, :, None], 0.0).sum(1)
            return lax.psum(jnp.einsum("te,ted->td", combine, _experts(w1, w2, x)), "ep")

        e = P("ep")
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), e, e, P()), out_specs=P(), check_vma=False)(wg, w1, w2, x)


    def _clamped(wg, w1, w2, x, mesh, masked):
        def body(wg, w1, w2, x):
            top_p, top_i = _route(wg, x)
            local = top_i - lax.axis_index("ep") * E_LOCAL
            hit = (local >= 0) & (local < E_LOCAL)
            rows = jnp.take_along_axis(_experts(w1, w2, x), jnp.clip(local, 0, E_LOCAL - 1)[..., None], axis=1)
            gates = jnp.where(hit, top_p, 0.0) if masked else top_p
            return lax.psum(jnp.sum(gates[..., None] * rows, axis=1), "ep")

        e = P("ep")
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), e, e, P()), out_specs=P(), check_vma=False)(wg, w1, w2, x)


    def moe_ep_clamped(wg, w1, w2, x, *, mesh):
        return _clamped(wg, w1, w2, x, mesh, True)


    def moe_ep_clamped_unmasked(wg, w1, w2, x, *, mesh):
        return _clamped(wg, w1, w2, x, mesh, False)


    def moe_ep_no_offset(wg, w1, w2, x, *, mesh):
        return _ep(wg, w1, w2, x, mesh, lambda me: 0)
    """
)

MANIFEST = model_package.manifest_text(
    [
        ("ep", "moe", "moe_ep"),
        ("ep-where", "moe", "moe_ep_where"),
        ("ep-clamped", "moe", "moe_ep_clamped"),
        ("ep-no-offset", "moe", "moe_ep_no_offset"),
        ("ep-clamped-unmasked", "moe", "moe_ep_clamped_unmasked"),
    ],
    "{ep: 4}",
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("weighted_sums"), "model.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["ep", "ep-where", "ep-clamped"])
def test_a_device_contracting_gates_with_its_experts_one_hot_verifies_against_take_along_axis(manifest, name):
    result = model_package.verify_named(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["ep-no-offset", "ep-clamped-unmasked"])
def test_local_ids_not_offset_or_not_masked_are_a_mismatch(manifest, name):
    result = model_package.verify_named(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
