"""A dot with a size-1 batch pair is the dot without it (equivci.translate.unit_batches): a
device's dot of one squeezed KV head with its query heads is the squeeze of the grouped dot over
its one group.

The stated pairs are checked numerically on the terms, for the squeezed operand on either side,
the head taken by `w[:, g]` or by `lax.dynamic_index_in_dim`, the scores written by einsum or by
lax.dot_general with the heads first. On JAX programs unlike the blind replicated-KV GQA: grouped
scores returned in the dot's own layout, each device indexing its KV head of a [d, G, hd] weight; the
correct model moves its first unrelated op past the scores' dot. Near misses: the KV head of the
tile order (`i % G`) and of the next group (`i // 2 + 1` clipped), which must be `mismatch`.
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

from equivci.hlo.parser import parse_module
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.terms.spec import DotSpec
from equivci.translate.evaluator import Evaluator

RNG = np.random.default_rng(11)
Q = RNG.standard_normal((2, 5, 3, 4)).astype(np.float32)  # [b, t, query heads of one group, hd]
X = RNG.standard_normal((2, 6, 8)).astype(np.float32)  # [b, s, d]
WK = RNG.standard_normal((8, 2, 4)).astype(np.float32)  # [d, G, hd]

SQUEEZED = {
    "KV head on the right, einsum": lambda q, x, w: jnp.einsum("bthk,bsk->bhts", q, x @ w[:, 1]),
    "KV head on the left, einsum": lambda q, x, w: jnp.einsum("bsk,bthk->bhst", x @ w[:, 0], q),
    "dynamic index, dot_general heads first": lambda q, x, w: lax.dot_general(
        jnp.transpose(q, (0, 2, 1, 3)),
        jnp.einsum("bsd,dk->bsk", x, lax.dynamic_index_in_dim(w, 1, 1, keepdims=False)),
        (((3,), (2,)), ((0,), (0,))),
    ),
}


def _stated(fn):
    args = (Q, X, WK)
    module = parse_module(jax.jit(fn).lower(*args).as_text(dialect="hlo"))
    ev = Evaluator(module, TermTable(), 1)
    params = [
        ev.table.make("param", (k,), (), np.shape(a), module.entry.parameters()[k].shape.dtype)
        for k, a in enumerate(args)
    ]
    ev.run(module.entry, [[p] for p in params])
    return ev, {k: np.asarray(a) for k, a in enumerate(args)}


def _unit_batched(t) -> bool:
    """t is (layout ops of) a dot with a size-1 batch pair."""
    if t.op in ("reshape", "slice", "transpose"):
        return _unit_batched(t.args[0])
    return t.op == "dot" and any(t.args[0].shape[k] == 1 for k in DotSpec.parse(t.attrs[0]).lhs_batch)


@pytest.mark.parametrize("case", sorted(SQUEEZED))
def test_a_dot_of_a_squeezed_operand_is_stated_equal_to_the_squeeze_of_a_unit_batched_dot(case):
    ev, values = _stated(SQUEEZED[case])
    groups = [g for g in ev.equal_terms if any(_unit_batched(t) for t in g)]
    assert groups, "no dot with a size-1 batch pair stated"
    for group in groups:
        first = evaluate(group[0], values, ev.values)
        for other in group[1:]:
            np.testing.assert_allclose(evaluate(other, values, ev.values), first, rtol=1e-5, atol=1e-5)


def test_a_dot_of_unsqueezed_operands_states_no_unit_batch_pair():
    ev, _ = _stated(lambda q, x, w: jnp.einsum("bthk,bsk->bhts", q, x @ w.reshape(8, 8)[:, 4:]))
    assert not any(_unit_batched(t) for g in ev.equal_terms for t in g)


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, T, D, G, M, HD = 2, 4, 8, 2, 4, 4


    def inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
        return f(B, T, D), f(D, G * M, HD), f(D, G, HD)


    def scores(x, wq, wk):  # grouped: [b, G, M, t, s]
        q = jnp.einsum("btd,dhk->bthk", x, wq).reshape(B, T, G, M, HD)
        k = jnp.einsum("btd,dgk->btgk", x, wk)
        return jnp.einsum("btgqk,bsgk->btgqs", q, k).reshape(B, T, G * M, T)


    def _tp(x, wq, wk, mesh, group):
        def body(x, wq, wk):
            kv = lax.dynamic_index_in_dim(wk, group(lax.axis_index("tp")), 1, keepdims=False)
            q = jnp.einsum("btd,dhk->bthk", x, wq)
            return jnp.einsum("bthk,bsk->bths", q, x @ kv)

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "tp"), P()),
                             out_specs=P(None, None, "tp"))(x, wq, wk)


    def scores_tp(x, wq, wk, *, mesh):
        return _tp(x, wq, wk, mesh, lambda i: i // 2)


    def scores_tp_tiled(x, wq, wk, *, mesh):
        return _tp(x, wq, wk, mesh, lambda i: i % G)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: grouped-scores, reference: m.py:scores, distributed: m.py:scores_tp, inputs: m.py:inputs, mesh: {tp: 4}}
      - {name: grouped-scores-tiled, reference: m.py:scores, distributed: m.py:scores_tp_tiled, inputs: m.py:inputs, mesh: {tp: 4}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("unit_batches"), "m.py", MODELS, MANIFEST)


def test_grouped_scores_of_one_kv_head_per_device_verify(manifest):
    result = _verify(manifest, "grouped-scores")
    assert result.status is Status.VERIFIED, result.findings


def test_near_miss_kv_head_of_the_tile_order_is_a_mismatch(manifest):
    result = _verify(manifest, "grouped-scores-tiled")
    assert result.status is Status.MISMATCH, (result.status, result.findings)
