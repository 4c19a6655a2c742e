"""A reshape that leaves a concatenation's dim alone is the concatenation of the reshaped parts
(translate/builder.py, `reshaped_parts`): row-major, the reshape then acts on the dims before that dim
and on those after it apart. Stated beside the written reshape, so that a device holding one KV group
of a fused QKV projection, whose rotated heads XLA builds already split ([b, s, 1, G, hd], the RoPE
halves joined along hd), meets the reference that joins the halves of all heads, then splits them
([b, s, K, G, hd]).

Checked against XLA on one device (the stated forms evaluate to what XLA computes), on terms (a
reshape that splits or merges the joined dim states nothing), and end to end on four devices with
near misses: the halves joined in the other order, the next group's heads.
"""

from __future__ import annotations

import textwrap

import jax.numpy as jnp
import model_package
import numpy as np
import one_device
import pytest
from model_package import verify_named as _verify

from equivci.hlo.ir import Shape
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.evaluator import Evaluator

RNG = np.random.default_rng(71)


def _rotated_then_split(q, c):
    b, s, k, g, h = q.shape
    x = q.reshape(b, s, k * g, h)
    x1, x2 = x[..., : h // 2], x[..., h // 2 :]
    return jnp.concatenate([x1 * c - x2, x2 * c + x1], axis=-1).reshape(q.shape)


def test_the_concatenation_of_reshaped_parts_computes_what_xla_computes():
    q = RNG.standard_normal((1, 8, 4, 2, 4)).astype(np.float32)
    c = RNG.standard_normal((1, 8, 1, 2)).astype(np.float32)
    programs, want, _ = one_device.programs(_rotated_then_split, (q, c))
    ev = programs.evaluator
    stated = [g for g in ev.equal_terms if any(t.op == "concat" and t.attrs == (4,) for t in g)]
    assert stated, ev.equal_terms
    for group in stated:
        values = [evaluate(t, {0: q, 1: c}, ev.values) for t in group]
        for v in values[1:]:
            np.testing.assert_array_equal(v, values[0])
    np.testing.assert_allclose(evaluate(programs.reference_outputs[0], {0: q, 1: c}, ev.values), want, rtol=1e-6)


@pytest.mark.parametrize(
    ("parts", "joined_dim", "out_shape", "stated"),
    [
        ([(2, 6, 3), (2, 6, 5)], 2, (2, 3, 2, 8), True),  # dims before the joined one split
        ([(2, 6, 3), (2, 6, 5)], 2, (12, 8), True),  # merged
        ([(2, 4, 3), (2, 4, 5)], 2, (8, 8), True),  # a dim of the joined size before it: not that one
        ([(4, 2), (4, 6)], 1, (4, 1, 8, 1), True),  # size-1 dims around it
        ([(2, 6, 3), (2, 6, 5)], 2, (2, 6, 2, 4), False),  # the joined dim itself split
        # merged into the dim before it: the builder relays it as row windows joined along a dim of
        # their own (relaid.py), which the fact then states on those pieces; every form must hold
        ([(2, 3), (2, 5)], 1, (16,), None),
    ],
)
def test_only_a_reshape_that_leaves_the_joined_dim_alone_is_stated_on_the_parts(parts, joined_dim, out_shape, stated):
    ev = Evaluator(None, TermTable(), 1)
    xs = [ev.table.make("param", (k,), (), shape, "f32") for k, shape in enumerate(parts)]
    joined = ev.table.make("concat", (joined_dim,), tuple(xs), tuple(
        sum(p[d] for p in parts) if d == joined_dim else parts[0][d] for d in range(len(parts[0]))
    ), "f32")
    before = len(ev.equal_terms)
    written = ev.reshape_term(joined, Shape("f32", out_shape))
    new = ev.equal_terms[before:]  # (other facts may state forms of their own: all must hold)
    on_parts = [g for g in new if any(t.op == "concat" and t.shape == out_shape for t in g)]
    assert stated is None or bool(on_parts) == stated, new
    values = {k: RNG.standard_normal(shape).astype(np.float32) for k, shape in enumerate(parts)}
    want = np.concatenate(list(values.values()), axis=joined_dim).reshape(out_shape)
    np.testing.assert_array_equal(evaluate(written, values, ev.values), want)
    for group in new:
        for t in group:
            np.testing.assert_array_equal(evaluate(t, values, ev.values), want)


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    B, S, D, K, G, H = 1, 8, 16, 4, 2, 4


    def inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.bfloat16)
        return f(B, S, D), f(D, K, G + 2, H)


    def _tables(seq):
        inv = 1.0 / (10000.0 ** (jnp.arange(0, H, 2, dtype=jnp.float32) / H))
        angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * inv[None, :]
        return jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]


    def _rope(x, order):
        c, s = _tables(x.shape[1])
        x1, x2 = x[..., : H // 2], x[..., H // 2 :]
        return jnp.concatenate(order([x1 * c - x2 * s, x2 * c + x1 * s]), axis=-1)


    def _queries(h, w, order=lambda halves: halves, group=lambda q: q):
        b, s, _ = h.shape
        qkv = jnp.einsum("bsd,dkgh->bskgh", h, w)  # one fused projection: G query heads, k, v per group
        q = group(qkv[:, :, :, :G])
        return _rope(q.reshape(b, s, q.shape[2] * G, H), order).reshape(q.shape)


    def _tp(local):
        def run(h, w, *, mesh):
            return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(None, "tp")), out_specs=P(None, None, "tp"))(h, w)

        return run


    queries = _queries
    queries_tp = _tp(_queries)
    queries_tp_halves_swapped = _tp(lambda h, w: _queries(h, w, order=lambda halves: halves[::-1]))
    """
)

CASES = [
    ("queries_tp", "queries", "queries_tp"),
    ("queries_tp_halves_swapped", "queries", "queries_tp_halves_swapped"),
]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    root = tmp_path_factory.mktemp("reshaped_concats")
    return model_package.write_package(root, "model.py", MODELS, model_package.manifest_text(CASES, "{tp: 4}"))


def test_rotated_queries_of_one_kv_group_per_device_verify(manifest):
    result = _verify(manifest, "queries_tp")
    assert result.status is Status.VERIFIED, result.findings


def test_halves_joined_in_the_other_order_are_a_mismatch(manifest):
    assert _verify(manifest, "queries_tp_halves_swapped").status is Status.MISMATCH
