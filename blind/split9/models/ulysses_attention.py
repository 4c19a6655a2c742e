"""DeepSpeed-Ulysses style sequence parallelism for causal self-attention.

Activations arrive sharded over the sequence; an all-to-all trades the sequence shard for a head
shard before attention and a second all-to-all trades it back.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

B, S, H, HD, D = 2, 16, 8, 4, 32


def arg_specs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(B, S, D), {"wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD), "wo": f(H, HD, D)}


def causal_attention(q, k, v):
    """q, k, v: [b, s, h, e] with the whole sequence present."""
    s = q.shape[1]
    logits = jnp.einsum("bqhe,bkhe->bhqk", q, k) * q.shape[-1] ** -0.5
    mask = jnp.arange(s)[:, None] >= jnp.arange(s)[None, :]
    probs = jax.nn.softmax(jnp.where(mask, logits, jnp.finfo(logits.dtype).min), axis=-1)
    return jnp.einsum("bhqk,bkhe->bqhe", probs, v)


def self_attention(x, w):
    q, k, v = (jnp.einsum("bsd,dhe->bshe", x, w[n]) for n in ("wq", "wk", "wv"))
    return jnp.einsum("bshe,hed->bsd", causal_attention(q, k, v), w["wo"])


def _seq_to_heads(t):
    return jax.lax.all_to_all(t, "sp", split_axis=2, concat_axis=1, tiled=True)


def _heads_to_seq(t):
    return jax.lax.all_to_all(t, "sp", split_axis=1, concat_axis=2, tiled=True)


def _heads_to_seq_packed(t):
    return jax.lax.all_to_all(t, "sp", split_axis=1, concat_axis=3, tiled=True)


def _ulysses(x, w, mesh, back):
    def body(x_blk, w):
        b, s_blk, _ = x_blk.shape
        q, k, v = (_seq_to_heads(jnp.einsum("bsd,dhe->bshe", x_blk, w[n])) for n in ("wq", "wk", "wv"))
        o = back(causal_attention(q, k, v)).reshape(b, s_blk, H, HD)
        return jnp.einsum("bshe,hed->bsd", o, w["wo"])

    return jax.shard_map(body, mesh=mesh, in_specs=(P(None, "sp"), P()), out_specs=P(None, "sp"))(x, w)


def ulysses_attention(x, w, mesh):
    return _ulysses(x, w, mesh, _heads_to_seq)


def ulysses_attention_packed(x, w, mesh):
    return _ulysses(x, w, mesh, _heads_to_seq_packed)
