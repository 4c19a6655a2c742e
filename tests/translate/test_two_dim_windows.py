"""Windows over two dims at once carried through the elementwise ops of attention: an FSDP × TP
block holds one device's batch rows and heads, and RoPE's halves and the causal mask act on that
window. The facts: rules `elementwise/binary_lift_nested` and `layouts/bcast_as_slice_nested`
(numeric instances and near misses in tests/terms/test_rules_numeric.py), and a broadcast of a constant
reshaped only to add unit dims is the broadcast of the constant (translate/shapes.broadcast_term: a
device's mask over its one batch row against the reference's mask broadcast over every row; a
computed value keeps its unit dims, which may be a device's window of a real dim).

Checked on the terms the evaluator builds, and on JAX programs in a style unlike the bench's
fsdp_tp (a dp × tp mesh without FSDP gathers, `jnp.split` halves, tables and mask built in the block,
RoPE and the scores in f32 between bf16 casts; unproven before these facts):
the block verifies, and a near miss whose causal mask is shifted by one is a mismatch.
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
from equivci.translate.evaluator import Evaluator
from equivci.translate.shapes import broadcast_term


def test_a_broadcast_of_a_constant_given_unit_dims_is_the_broadcast_of_the_constant() -> None:
    ev = Evaluator(None, TermTable(), 1)
    value = np.tril(np.ones((4, 4), dtype=bool)) * np.arange(16.0).reshape(4, 4)
    mask = ev.const(value.astype(np.float32), "f32")
    one_row = ev.reshape_term(mask, Shape("f32", (1, 4, 4)))
    term = broadcast_term(ev, one_row, Shape("f32", (1, 2, 4, 4)), (0, 2, 3))
    assert term.op == "bcast" and term.args[0] is mask and term.attrs == ("n1,n2,i0,i1",)
    np.testing.assert_array_equal(ev.folded(term), np.broadcast_to(value, (1, 2, 4, 4)))


def test_a_computed_value_given_a_unit_dim_keeps_it() -> None:
    # one KV head of a device, [b, s, 1, d], repeated for its query heads: the unit dim is a window of
    # the reference's KV heads, which the reference's operand keeps as its own dim
    ev = Evaluator(None, TermTable(), 1)
    head = ev.table.make("param", (0,), (), (2, 3, 4), "f32")
    kv = ev.reshape_term(head, Shape("f32", (2, 3, 1, 4)))
    term = broadcast_term(ev, kv, Shape("f32", (2, 3, 1, 2, 4)), (0, 1, 2, 4))
    assert term.op == "bcast" and term.args[0] is kv and term.attrs == ("i0,i1,i2,n2,i3",)


def test_a_kept_unit_dim_of_a_value_stays_an_operand_dim() -> None:
    # [1, 4] is the value itself (one row of a batch), not a value given a unit dim: dim 0 stays its own
    ev = Evaluator(None, TermTable(), 1)
    row = ev.table.make("param", (0,), (), (1, 4), "f32")
    term = broadcast_term(ev, row, Shape("f32", (1, 4, 3)), (0, 1))
    assert term.op == "bcast" and term.args[0] is row and term.attrs == ("i0,i1,n3",)


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, S, D, H, K = 2, 8, 16, 4, 4


    def inputs():
        bf16 = jnp.bfloat16
        w = jax.ShapeDtypeStruct((D, H * K), bf16)
        return (jax.ShapeDtypeStruct((B, S, D), bf16), w, w, w, jax.ShapeDtypeStruct((H * K, D), bf16))


    def _rope(t):
        pos = jnp.arange(S, dtype=jnp.float32)[:, None]
        ang = pos / (100.0 ** (jnp.arange(K // 2, dtype=jnp.float32) / (K // 2)))
        cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
        lo, hi = jnp.split(t.astype(jnp.float32), 2, axis=-1)
        return jnp.concatenate([lo * cos - hi * sin, hi * cos + lo * sin], axis=-1).astype(t.dtype)


    def _block(x, wq, wk, wv, wo, shift):
        heads = lambda w: (x @ w).reshape(x.shape[0], S, -1, K)  # noqa: E731
        q, k, v = _rope(heads(wq)), _rope(heads(wk)), heads(wv)
        s = jnp.einsum("bshk,bthk->bhst", q, k, preferred_element_type=jnp.float32) * K ** -0.5
        causal = jnp.tril(jnp.ones((S, S), dtype=bool), k=shift)
        p = jax.nn.softmax(jnp.where(causal, s, -1e9), axis=-1).astype(v.dtype)
        o = jnp.einsum("bhst,bthk->bshk", p, v)
        return o.reshape(x.shape[0], S, -1) @ wo


    def block(x, wq, wk, wv, wo):
        return _block(x, wq, wk, wv, wo, 0)


    def _block_dp_tp(x, wq, wk, wv, wo, mesh, shift):
        def body(x, wq, wk, wv, wo):
            return lax.psum(_block(x, wq, wk, wv, wo, shift), "tp")

        cols = P(None, "tp")
        return jax.shard_map(body, mesh=mesh, in_specs=(P("dp"), cols, cols, cols, P("tp")),
                             out_specs=P("dp"))(x, wq, wk, wv, wo)


    def block_dp_tp(x, wq, wk, wv, wo, *, mesh):
        return _block_dp_tp(x, wq, wk, wv, wo, mesh, 0)


    def block_dp_tp_mask_shifted(x, wq, wk, wv, wo, *, mesh):
        return _block_dp_tp(x, wq, wk, wv, wo, mesh, 1)  # MARK:shifted
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: dp-tp-rope-mask, reference: m.py:block, distributed: m.py:block_dp_tp, inputs: m.py:inputs,
         mesh: {dp: 2, tp: 2}}
      - {name: dp-tp-mask-shifted, reference: m.py:block, distributed: m.py:block_dp_tp_mask_shifted,
         inputs: m.py:inputs, mesh: {dp: 2, tp: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("two_dim"), "m.py", MODELS, MANIFEST)


def test_a_dp_tp_attention_block_with_rope_and_a_causal_mask_verifies(manifest) -> None:
    result = _verify(manifest, "dp-tp-rope-mask")
    assert result.status is Status.VERIFIED, result.findings


def test_a_causal_mask_shifted_by_one_is_a_mismatch(manifest) -> None:
    result = _verify(manifest, "dp-tp-mask-shifted")
    assert result.status is Status.MISMATCH, (result.status, result.findings)
