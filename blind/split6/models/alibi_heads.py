"""ALiBi attention (per-head linear distance penalty, no position embeddings), heads split over a
tensor-parallel axis; each device must use the slopes of its global head numbers."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N_HEADS, HEAD_DIM, SEQ, BATCH = 8, 4, 8, 2
MODEL = N_HEADS * HEAD_DIM


def alibi_slopes(head_ids):
    # geometric sequence 2^(-8(h+1)/H) of the original paper
    return jnp.exp2(-8.0 * (head_ids.astype(jnp.float32) + 1.0) / N_HEADS)


def _attend(q, k, v, slopes):
    """q, k, v [B, h, S, hd]; slopes [h]."""
    rel = (jnp.arange(SEQ)[None, :] - jnp.arange(SEQ)[:, None]).astype(jnp.float32)   # k - q
    bias = slopes[:, None, None] * jnp.minimum(rel, 0.0)
    logits = jnp.matmul(q, jnp.swapaxes(k, -1, -2)) * HEAD_DIM**-0.5 + bias
    logits = jnp.where(rel <= 0, logits, -1e30)
    return jnp.matmul(jax.nn.softmax(logits, axis=-1), v)


def _heads(t, n):
    return t.reshape(BATCH, SEQ, n, HEAD_DIM).transpose(0, 2, 1, 3)


def alibi_attention(x, wq, wk, wv, wo):
    o = _attend(_heads(x @ wq, N_HEADS), _heads(x @ wk, N_HEADS), _heads(x @ wv, N_HEADS),
                alibi_slopes(jnp.arange(N_HEADS)))
    return o.transpose(0, 2, 1, 3).reshape(BATCH, SEQ, MODEL) @ wo


def alibi_attention_tp(x, wq, wk, wv, wo, mesh):
    n_local = N_HEADS // mesh.shape["tp"]

    def local(x, wq, wk, wv, wo):
        first = lax.axis_index("tp") * n_local
        slopes = alibi_slopes(first + jnp.arange(n_local))
        o = _attend(_heads(x @ wq, n_local), _heads(x @ wk, n_local), _heads(x @ wv, n_local), slopes)
        return lax.psum(o.transpose(0, 2, 1, 3).reshape(BATCH, SEQ, -1) @ wo, "tp")

    col = P(None, "tp")
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), col, col, col, P("tp", None)),
                         out_specs=P())(x, wq, wk, wv, wo)


def alibi_attention_tp_local_slopes(x, wq, wk, wv, wo, mesh):
    n_local = N_HEADS // mesh.shape["tp"]

    def local(x, wq, wk, wv, wo):
        slopes = alibi_slopes(jnp.arange(n_local))
        o = _attend(_heads(x @ wq, n_local), _heads(x @ wk, n_local), _heads(x @ wv, n_local), slopes)
        return lax.psum(o.transpose(0, 2, 1, 3).reshape(BATCH, SEQ, -1) @ wo, "tp")

    col = P(None, "tp")
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), col, col, col, P("tp", None)),
                         out_specs=P())(x, wq, wk, wv, wo)


def inputs():
    s, f = jax.ShapeDtypeStruct, jnp.float32
    return (s((BATCH, SEQ, MODEL), f), s((MODEL, MODEL), f), s((MODEL, MODEL), f),
            s((MODEL, MODEL), f), s((MODEL, MODEL), f))
