"""Grouped-query attention with one fused projection, columns laid out per KV group:
for each KV head: its G query heads, then its k head, then its v head (Megatron layout).
Attention written with explicit lax.dot_general batch dimensions.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BATCH, SEQ, DMODEL = 2, 6, 16
KV_HEADS, GROUP, HEAD_DIM = 4, 2, 4
SLOTS = GROUP + 2
FUSED = KV_HEADS * SLOTS * HEAD_DIM


def shapes():
    return (jax.ShapeDtypeStruct((BATCH, SEQ, DMODEL), jnp.float32),
            jax.ShapeDtypeStruct((DMODEL, FUSED), jnp.float32),
            jax.ShapeDtypeStruct((KV_HEADS * GROUP * HEAD_DIM, DMODEL), jnp.float32))


def _attend(q, k, v):
    # q [b, kv, g, s, d]; k, v [b, kv, s, d]
    scores = lax.dot_general(q, k, (((4,), (3,)), ((0, 1), (0, 1))))  # [b, kv, g, s, t]
    scores = scores * HEAD_DIM ** -0.5
    probs = jax.nn.softmax(scores, axis=-1)
    return lax.dot_general(probs, v, (((4,), (2,)), ((0, 1), (0, 1))))  # [b, kv, g, s, d]


def _split(proj, kv):
    # proj [b, s, kv, slots, d]
    q = jnp.transpose(proj[:, :, :, :GROUP], (0, 2, 3, 1, 4))
    k = jnp.transpose(proj[:, :, :, GROUP], (0, 2, 1, 3))
    v = jnp.transpose(proj[:, :, :, GROUP + 1], (0, 2, 1, 3))
    return q, k, v


def gqa(x, w_fused, w_out):
    proj = (x @ w_fused).reshape(BATCH, SEQ, KV_HEADS, SLOTS, HEAD_DIM)
    o = _attend(*_split(proj, KV_HEADS))
    o = jnp.transpose(o, (0, 3, 1, 2, 4)).reshape(BATCH, SEQ, -1)
    return o @ w_out


def gqa_tp(x, w_fused, w_out, mesh):
    kv_local = KV_HEADS // mesh.shape["model"]

    def body(x, w_cols, w_rows):
        proj = (x @ w_cols).reshape(BATCH, SEQ, kv_local, SLOTS, HEAD_DIM)
        o = _attend(*_split(proj, kv_local))
        o = jnp.transpose(o, (0, 3, 1, 2, 4)).reshape(BATCH, SEQ, -1)
        return lax.psum(o @ w_rows, "model")

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "model"), P("model", None)),
                         out_specs=P())(x, w_fused, w_out)


def gqa_tp_regroup(x, w_fused, w_out, mesh):
    kv_local = KV_HEADS // mesh.shape["model"]

    def body(x, w_cols, w_rows):
        proj = (x @ w_cols).reshape(BATCH, SEQ, SLOTS, kv_local, HEAD_DIM).swapaxes(2, 3)
        o = _attend(*_split(proj, kv_local))
        o = jnp.transpose(o, (0, 3, 1, 2, 4)).reshape(BATCH, SEQ, -1)
        return lax.psum(o @ w_rows, "model")

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "model"), P("model", None)),
                         out_specs=P())(x, w_fused, w_out)
