"""Dots and products of squeezed values as dots of the unsqueezed ones (equivci/translate/squeezes.py).

A size-1 dim holds no data: dropped from an operand of a dot it is a free dim of the dot of the
unsqueezed operand (or, dropped from both, a batch pair of the two), and a product of two values
that each dropped one is the dot contracting those two dims (a sum over one index). Checked on
random arrays, on the terms the evaluator states for a one-device program (every stated group
evaluated against the others), and on expert-parallel programs in several styles: a rank holding
one expert (`w1[0]`) weights its output by its column of the combine weights, picked by index, by
a dynamic slice or by `jnp.take`, or scales it per feature, and psums it; a shared expert is added
after the psum. The near misses (another rank's column, the local id's column, the shared expert
inside the psum) are mismatches.
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
from equivci.terms.spec import DotSpec


@pytest.mark.parametrize("seed", range(10))
def test_the_identities_on_random_arrays(seed):
    rng = np.random.default_rng(seed)
    x, w, c = rng.standard_normal((2, 3, 4)), rng.standard_normal((1, 4, 5)), rng.standard_normal((2, 3, 1))
    # dot(x, squeeze(w)) = squeeze(dot(x, w)), w's size-1 dim a free dim
    np.testing.assert_allclose(x @ w[0], np.einsum("btd,udf->btuf", x, w)[:, :, 0])
    # dot(squeeze(h), squeeze(v)) = squeeze(dot(h, v) batched over the size-1 pair)
    h, v = rng.standard_normal((2, 3, 1, 5)), rng.standard_normal((1, 5, 4))
    np.testing.assert_allclose(h[:, :, 0] @ v[0], np.einsum("btuf,ufd->ubtd", h, v)[0])
    # bcast(squeeze(c)) * squeeze(y) = dot(y, c) over the size-1 pair, batched over c's dims
    y = rng.standard_normal((1, 2, 3, 4))
    np.testing.assert_allclose(c[..., 0][..., None] * y[0], np.einsum("ubtd,btu->btd", y, c))
    s = rng.standard_normal((4, 1))  # broadcast along other dims than the leading ones
    np.testing.assert_allclose(s[:, 0] * y[0], np.einsum("ubtd,du->dbt", y, s).transpose(1, 2, 0))


def _expert(x, w1, w2):
    return jnp.tanh(x @ w1) @ w2


def _groups_hold(fn, args):
    """Every group the evaluator stated evaluates alike on `args`; the dots among them (or under
    their reshape or transpose)."""
    built, want, _ = programs(fn, args)
    values = built.evaluator.values
    inputs = {k: np.asarray(a) for k, a in enumerate(args)}
    np.testing.assert_allclose(evaluate(built.reference_outputs[0], inputs, values), want, rtol=1e-5, atol=1e-5)
    dots = []
    for group in built.evaluator.equal_terms:
        first = evaluate(group[0], inputs, values)
        for other in group[1:]:
            np.testing.assert_allclose(evaluate(other, inputs, values), first, rtol=1e-5, atol=1e-5)
        dots += [u for t in group for u in (t, *t.args[:1]) if u.op == "dot"]  # also under a reshape
    return dots


def _unit_pairs(dots, kind):
    """The dots whose batch dims include a size-1 pair (kind "batch"), or that contract one size-1
    pair and nothing else (kind "contract": a product)."""
    found = []
    for t in dots:
        spec = DotSpec.parse(t.attrs[0])
        pairs = list(
            zip(spec.lhs_batch, spec.rhs_batch) if kind == "batch" else zip(spec.lhs_contract, spec.rhs_contract)
        )
        if kind == "contract" and len(pairs) != 1:
            continue
        if any(t.args[0].shape[i] == 1 and t.args[1].shape[j] == 1 for i, j in pairs):
            found.append(t)
    return found


RNG = np.random.default_rng(3)
W1, W2, X = (RNG.standard_normal(s).astype(np.float32) for s in [(4, 4, 5), (4, 5, 4), (2, 3, 4)])
COMBINE, SCALES = RNG.standard_normal((2, 3, 4)).astype(np.float32), RNG.standard_normal((4, 4)).astype(np.float32)


@pytest.mark.parametrize(
    ("pick", "weights"),
    [
        (lambda c, y: c[..., 1][..., None] * y, COMBINE),  # the combine column of expert 1
        (lambda s, y: s[:, 1] * y, SCALES),  # expert 1's per-feature scales [D, E]: broadcast along the leading dims
    ],
    ids=["column", "feature-scale"],
)
def test_the_stated_dots_hold_on_one_device(pick, weights):
    dots = _groups_hold(lambda a, w1, w2, x: pick(a, _expert(x, w1[1], w2[1])), (weights, W1, W2, X))
    assert _unit_pairs(dots, "batch"), "the expert's second dot is not stated batched over its size-1 pair"
    assert _unit_pairs(dots, "contract"), "the product is not stated as a dot over the size-1 pair"


@pytest.mark.parametrize(
    "op", [lambda c, y: c[..., 1][..., None] + y, lambda c, y: y / c[..., 1][..., None]], ids=["sum", "quotient"]
)
def test_no_dot_is_stated_for_a_sum_or_a_quotient(op):
    dots = _groups_hold(lambda c, w1, w2, x: op(c, _expert(x, w1[1], w2[1])), (COMBINE, W1, W2, X))
    assert _unit_pairs(dots, "batch") and not _unit_pairs(dots, "contract")


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, T, D, F, E = 2, 4, 8, 16, 4


    def inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
        return f(B, T, E), f(E, D, F), f(E, F, D), f(D, F), f(F, D), f(B, T, D)


    def _expert(x, w1, w2):
        return jax.nn.silu(x @ w1) @ w2


    def moe(c, w1, w2, ws1, ws2, x):
        every = jax.vmap(lambda a, b: _expert(x, a, b))(w1, w2)
        return jnp.einsum("ebtd,bte->btd", every, c) + _expert(x, ws1, ws2)


    def _ep(column, shared_inside=False):
        def body(c, w1, w2, ws1, ws2, x):
            routed = column(c, lax.axis_index("ep")) * _expert(x, w1[0], w2[0])
            if shared_inside:
                return lax.psum(routed + _expert(x, ws1, ws2), "ep")
            return lax.psum(routed, "ep") + _expert(x, ws1, ws2)

        specs = (P(), P("ep"), P("ep"), P(), P(), P())
        return lambda *a, mesh: jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P(), check_vma=False)(*a)


    moe_index = _ep(lambda c, e: c[..., e][..., None])
    moe_dynamic_slice = _ep(lambda c, e: lax.dynamic_slice_in_dim(c, e, 1, 2))
    moe_take = _ep(lambda c, e: jnp.take(c, e, axis=-1)[..., None])
    moe_next_rank = _ep(lambda c, e: c[..., (e + 1) % E][..., None])
    moe_local_id = _ep(lambda c, e: c[..., 0][..., None])
    moe_shared_inside = _ep(lambda c, e: c[..., e][..., None], shared_inside=True)
    """
)

NAMES = ["index", "dynamic-slice", "take", "next-rank", "local-id", "shared-inside"]
MANIFEST = model_package.manifest_text([(n, "moe", f"moe_{n.replace('-', '_')}") for n in NAMES], "{ep: 4}")


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("squeezed_dots"), "model.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["index", "dynamic-slice", "take"])
def test_a_rank_weighting_its_one_expert_by_its_column_verifies(manifest, name):
    result = model_package.verify_named(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.slow  # localization of each near miss: 20-50 s
@pytest.mark.parametrize("name", ["next-rank", "local-id", "shared-inside"])
def test_another_column_or_the_shared_expert_inside_the_psum_is_a_mismatch(manifest, name):
    result = model_package.verify_named(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
