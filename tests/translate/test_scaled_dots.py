"""A dot of an operand scaled along the dims the dot keeps is the scaled dot
(equivci.translate.scaled_dots): dot(x, w * bcast(s)) = dot(x, w) * bcast'(s).

The stated pairs are checked numerically on the terms (a per-column weight scale, a per-row
activation scale, a scale along a batch dim, a division), and none is stated for a scale along a
contracted dim. On JAX programs unlike the blind int8 linear: an activation scaled per token before
a data-parallel matmul, where each device scales its rows after its dot. Near misses: a scale along
the contracted dim applied after the dot (square weight, so the shapes agree), and the scales of
the wrong shard of rows.
"""

from __future__ import annotations

import textwrap

import jax.numpy as jnp
import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify
from one_device import evaluated

from equivci.results import Status
from equivci.terms.semantics import evaluate

RNG = np.random.default_rng(7)
X = RNG.standard_normal((3, 4, 5)).astype(np.float32)
W = RNG.standard_normal((3, 5, 6)).astype(np.float32)
Q = RNG.integers(-127, 128, (5, 6)).astype(np.int8)
COLS, ROWS, BATCH, INNER = (RNG.uniform(0.5, 2.0, n).astype(np.float32) for n in (6, 4, 3, 5))

SCALED = {
    "int8 weight, per output column": (lambda x, q, s: x[0] @ (q.astype(jnp.float32) * s[None, :]), (X, Q, COLS)),
    "activation, per row": (lambda x, w, s: (x[0] * s[:, None]) @ w[0], (X, W, ROWS)),
    "batched, per batch and column": (
        lambda x, w, s, c: jnp.einsum("bij,bjk->bik", x, w * s[:, None, None] * c[None, None, :]),
        (X, W, BATCH, COLS),
    ),
    "weight divided per column": (lambda x, w, s: x[1] @ (w[1] / s[None, :]), (X, W, COLS)),
}


def _stated(fn, args):
    """The equal-term groups the evaluator states for fn's program, and the input values."""
    ev, values = evaluated(fn, args)
    return ev, values


def _scaled_dot_groups(ev):
    """The groups that state a dot (under its layout ops) scaled by a broadcast."""
    return [g for g in ev.equal_terms if any(t.op == "binary" and _dot_under(t.args[0]) for t in g)]


def _dot_under(t) -> bool:
    return t.op == "dot" or (t.op in ("reshape", "slice", "transpose") and _dot_under(t.args[0]))


@pytest.mark.parametrize("case", sorted(SCALED))
def test_a_dot_of_an_operand_scaled_along_kept_dims_is_stated_equal_to_the_scaled_dot(case):
    ev, values = _stated(*SCALED[case])
    groups = _scaled_dot_groups(ev)
    assert groups, "no scaled dot stated"
    for group in groups:
        first = evaluate(group[0], values, ev.values)
        for other in group[1:]:
            np.testing.assert_allclose(evaluate(other, values, ev.values), first, rtol=1e-4, atol=1e-4)


NOT_SCALED = {  # near misses: nothing may come out of these dots
    "a scale along the contracted dim": (lambda x, w, s: x[0] @ (w[0] * s[:, None]), (X, W, INNER)),
    "a scale divided by the weight": (lambda x, w, s: x[0] @ (s[None, :] / w[0]), (X, W, COLS)),
}


@pytest.mark.parametrize("case", sorted(NOT_SCALED))
def test_a_scale_along_the_contracted_dim_or_over_the_weight_is_not_moved_out_of_the_dot(case):
    ev, _ = _stated(*NOT_SCALED[case])
    assert not _scaled_dot_groups(ev)


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    T, D = 8, 8


    def inputs():
        f = jnp.float32
        return jax.ShapeDtypeStruct((T, D), f), jax.ShapeDtypeStruct((D, D), f), jax.ShapeDtypeStruct((T,), f)


    def per_token(x, w, s):  # activation scales applied before the matmul
        return jnp.tanh((x * s[:, None]) @ w)


    def _rows(x, w, s, mesh, scales):
        def body(x, w, s):
            return jnp.tanh((x @ w) * scales(s)[:, None])

        return jax.shard_map(body, mesh=mesh, in_specs=(P("dp"), P(), P()), out_specs=P("dp"))(x, w, s)


    def per_token_dp(x, w, s, *, mesh):
        n = T // 2
        return _rows(x, w, s, mesh, lambda s: lax.dynamic_slice_in_dim(s, lax.axis_index("dp") * n, n))


    def per_token_dp_first_shard(x, w, s, *, mesh):
        return _rows(x, w, s, mesh, lambda s: s[: T // 2])


    def per_input_channel(x, w, s):  # a scale of the weight's contracted rows
        return jnp.tanh(x @ (w * s[:, None]))


    def per_input_channel_after(x, w, s, *, mesh):  # applied to the columns after the dot instead
        def body(x, w, s):
            return jnp.tanh((x @ w) * s[None, :])

        return jax.shard_map(body, mesh=mesh, in_specs=(P("dp"), P(), P()), out_specs=P("dp"))(x, w, s)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: per-token, reference: m.py:per_token, distributed: m.py:per_token_dp, inputs: m.py:inputs, mesh: {dp: 2}}
      - {name: per-token-first-shard, reference: m.py:per_token, distributed: m.py:per_token_dp_first_shard, inputs: m.py:inputs, mesh: {dp: 2}}
      - {name: contracted-scale-after, reference: m.py:per_input_channel, distributed: m.py:per_input_channel_after, inputs: m.py:inputs, mesh: {dp: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("scaled_dots"), "m.py", MODELS, MANIFEST)


def test_rows_scaled_after_each_devices_dot_verify(manifest):
    result = _verify(manifest, "per-token")
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize(
    "name", ["contracted-scale-after", pytest.param("per-token-first-shard", marks=pytest.mark.slow)]
)
def test_near_miss_scale_along_the_contracted_dim_or_of_the_wrong_shard_is_a_mismatch(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
