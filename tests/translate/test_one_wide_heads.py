"""An elementwise op on a broadcast that keeps a size-1 dim of its operand, stated as written beside
its unit-reshaped form (equivci.translate.elementwise.one_wide_written): a device with one head of
the reference's per-head vector r, `r[h0:h0 + 1][None, :, None, None] * d[:, None]`, has the
broadcast [1, 1, 1, 1] -> [B, 1, T, T] keep r's size-1 dim, which is the one-wide window of the
reference's broadcast [H] -> [B, H, T, T] along the heads; the builder's normal form squeezes that
dim away (`reshape(bcast(scalar) * d)`), so the written form, an exact restatement, is what meets
the reference's window. Ops on such a result (log1p, negate) are stated as written too.

Checked on the terms the builder states (both sides evaluated) and on models in three styles: a
Kerple-log bias with slopes cut at `axis_index` by `dynamic_slice`, an ALiBi bias over position
ids with the slopes an input sharded over the heads, and a per-head query scale; one head per
device. A device that cuts the first head's slope everywhere is a mismatch.
"""

from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import model_package
import numpy as np
import pytest

from equivci.hlo.parser import parse_module
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.evaluator import Evaluator

RNG = np.random.default_rng(5)
R = RNG.standard_normal(4).astype(np.float32)
D = RNG.standard_normal((2, 8, 8)).astype(np.float32)


def _stated(fn):
    module = parse_module(jax.jit(fn).lower(R, D).as_text(dialect="hlo"))
    ev = Evaluator(module, TermTable(), 1)
    params = [ev.table.make("param", (k,), (), a.shape, "f32") for k, a in enumerate((R, D))]
    ev.run(module.entry, [[p] for p in params])
    return ev


def _slope_times_distance(r, d):  # a difference too: the operands' order is kept
    bias = -r[1:2][None, :, None, None] * jnp.log1p(jnp.abs(r[2:3])[None, :, None, None] * d[:, None])
    return bias - r[3:4][None, :, None, None] / (1.0 + d[:, None] ** 2)


def _two_heads(r, d):  # a window two heads wide: no size-1 dim kept, nothing stated
    return r[1:3][None, :, None, None] * d[:, None]


def test_the_written_form_is_stated_beside_the_squeezed_one_and_agrees():
    ev = _stated(_slope_times_distance)
    assert len(ev.one_wide) >= 3  # the product inside log1p, log1p, the negated slope's product
    for outside, written in ev.one_wide.items():
        assert [outside, written] in ev.equal_terms
        np.testing.assert_allclose(
            evaluate(outside, {0: R, 1: D}, ev.values), evaluate(written, {0: R, 1: D}, ev.values)
        )
    expected = np.asarray(jax.jit(_slope_times_distance)(R, D))
    assert any(np.allclose(evaluate(t, {0: R, 1: D}, ev.values), expected) for t in ev.one_wide)  # the output's


def test_nothing_is_stated_for_a_window_wider_than_one():
    assert _stated(_two_heads).one_wide == {}


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, T, H, K = 2, 8, 4, 4


    def inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
        return f(H), f(H), f(B, T, H, K), jax.ShapeDtypeStruct((B, T), jnp.int32)


    def _kerple(r1, r2, pos):
        dist = jnp.abs(pos[:, :, None] - pos[:, None, :]).astype(jnp.float32)
        sp = jax.nn.softplus
        return -sp(r1)[None, :, None, None] * jnp.log1p(sp(r2)[None, :, None, None] * dist[:, None])


    def kerple(r1, r2, q, pos):
        return _kerple(r1, r2, pos)


    def _kerple_tp(first, r1, r2, q, pos, mesh):
        def local(r1, r2, q, pos):
            h0 = 0 if first else lax.axis_index("tp")  # MARK:first
            return _kerple(lax.dynamic_slice_in_dim(r1, h0, 1), lax.dynamic_slice_in_dim(r2, h0, 1), pos)

        return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P(), P()), out_specs=P(None, "tp"),
                             check_vma=False)(r1, r2, q, pos)


    def kerple_tp(r1, r2, q, pos, *, mesh):
        return _kerple_tp(False, r1, r2, q, pos, mesh)


    def kerple_first_head(r1, r2, q, pos, *, mesh):
        return _kerple_tp(True, r1, r2, q, pos, mesh)


    def _alibi(slopes, q, pos):
        rel = (pos[:, None, :] - pos[:, :, None]).astype(jnp.float32)
        return jnp.einsum("bqhk,bshk->bhqs", q, q) + slopes[None, :, None, None] * rel[:, None]


    def alibi(r1, r2, q, pos):
        return _alibi(r1, q, pos)


    def alibi_tp(r1, r2, q, pos, *, mesh):
        return jax.shard_map(_alibi, mesh=mesh, in_specs=(P("tp"), P(None, None, "tp"), P()),
                             out_specs=P(None, "tp"), check_vma=False)(r1, q, pos)


    def _scaled(scale, q):
        return jnp.tanh(q * jnp.exp(scale)[None, None, :, None])


    def scaled(r1, r2, q, pos):
        return _scaled(r1, q)


    def scaled_tp(r1, r2, q, pos, *, mesh):
        return jax.shard_map(_scaled, mesh=mesh, in_specs=(P("tp"), P(None, None, "tp")),
                             out_specs=P(None, None, "tp"), check_vma=False)(r1, q)
    """
)

CASES = [
    ("kerple", "kerple", "kerple_tp"),
    ("kerple_first_head", "kerple", "kerple_first_head"),
    ("alibi", "alibi", "alibi_tp"),
    ("scaled", "scaled", "scaled_tp"),
]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    text = model_package.manifest_text(CASES, "{tp: 4}")
    return model_package.write_package(tmp_path_factory.mktemp("one_wide_heads"), "model.py", MODELS, text)


@pytest.mark.parametrize("name", ["kerple", "alibi", "scaled"])
def test_one_head_per_device_of_a_per_head_broadcast_verifies(manifest, name):
    result = model_package.verify_named(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


def test_the_first_head_s_slope_on_every_device_is_a_mismatch(manifest):
    result = model_package.verify_named(manifest, "kerple_first_head")
    assert result.status is Status.MISMATCH, result.findings
