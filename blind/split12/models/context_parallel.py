"""Context (sequence) parallel attention on {cp: 4}, two production patterns.

1. Load-balanced causal attention (Llama-3 style "zigzag"): the sequence is cut in 2 * cp chunks and
   shard i holds chunks i and 2*cp - 1 - i so every shard gets the same causal work. The wrapper
   permutes the tokens into that order, shards them, all-gathers K/V over cp (so the keys arrive in the
   permuted order, whose positions are the static order table) and masks with global positions;
   the output is permuted back.
2. Sliding-window (Mistral-style) attention with a K/V halo: shard i receives the last WINDOW - 1
   keys/values of shard i - 1 by `lax.ppermute`; shard 0's halo (zeros) lies at negative positions
   and is masked out.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P


@dataclasses.dataclass(frozen=True)
class AttnConfig:
    batch: int = 2
    seq: int = 32
    d_model: int = 16
    heads: int = 2
    head_dim: int = 8
    window: int = 4


CFG = AttnConfig()
NEG = -1e30


def attn_inputs():
    c = CFG
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    w = {"wq": f(c.d_model, c.heads, c.head_dim), "wk": f(c.d_model, c.heads, c.head_dim),
         "wv": f(c.d_model, c.heads, c.head_dim), "wo": f(c.heads, c.head_dim, c.d_model)}
    return w, f(c.batch, c.seq, c.d_model)


def _project(w, x):
    return (jnp.einsum("...sd,dhk->...shk", x, w["wq"]), jnp.einsum("...sd,dhk->...shk", x, w["wk"]),
            jnp.einsum("...sd,dhk->...shk", x, w["wv"]))


def _masked_attention(w, q, k, v, allowed):
    scores = jnp.einsum("...qhk,...shk->...hqs", q, k) * CFG.head_dim ** -0.5
    probs = jax.nn.softmax(jnp.where(allowed, scores, NEG), axis=-1)
    return jnp.einsum("...hqs,...shk,hkd->...qd", probs, v, w["wo"])


def causal_attention(w, x):
    q, k, v = _project(w, x)
    pos = jnp.arange(CFG.seq)
    return _masked_attention(w, q, k, v, pos[:, None] >= pos[None, :])


def window_attention(w, x):
    q, k, v = _project(w, x)
    pos = jnp.arange(CFG.seq)
    delta = pos[:, None] - pos[None, :]
    return _masked_attention(w, q, k, v, (delta >= 0) & (delta < CFG.window))


# ---- 1. zigzag load-balanced causal context parallelism -----------------------------------------

def _zigzag_order(n_shards):
    chunk = CFG.seq // (2 * n_shards)
    chunks = np.arange(CFG.seq).reshape(2 * n_shards, chunk)
    return np.concatenate([np.concatenate([chunks[i], chunks[2 * n_shards - 1 - i]])
                           for i in range(n_shards)])


def _second_chunk_good(i, n):
    return 2 * n - 1 - i


def _second_chunk_shifted(i, n):
    return 2 * n - i


def _zigzag_local(w, x, second_chunk):
    n, i = lax.axis_size("cp"), lax.axis_index("cp")
    chunk = CFG.seq // (2 * n)
    offs = jnp.arange(chunk)
    q_pos = jnp.concatenate([i * chunk + offs, second_chunk(i, n) * chunk + offs])
    q, k, v = _project(w, x)
    k_all = lax.all_gather(k, "cp", axis=1, tiled=True)
    v_all = lax.all_gather(v, "cp", axis=1, tiled=True)
    k_pos = jnp.asarray(_zigzag_order(n))
    return _masked_attention(w, q, k_all, v_all, q_pos[:, None] >= k_pos[None, :])


def _zigzag(w, x, mesh, second_chunk):
    order = _zigzag_order(mesh.shape["cp"])
    fn = jax.shard_map(lambda w, x: _zigzag_local(w, x, second_chunk), mesh=mesh,
                       in_specs=(P(), P(None, "cp")), out_specs=P(None, "cp"))
    out = fn(w, x[:, order])
    return out[:, np.argsort(order)]


def causal_attention_zigzag(w, x, mesh):
    return _zigzag(w, x, mesh, _second_chunk_good)


def causal_attention_zigzag_shifted(w, x, mesh):
    return _zigzag(w, x, mesh, _second_chunk_shifted)


# ---- 2. sliding window with a ppermute halo -----------------------------------------------------

def _halo_tail(t):
    return t[:, -(CFG.window - 1):]


def _halo_head(t):
    return t[:, :CFG.window - 1]


def _window_local(w, x, halo_of):
    n, i = lax.axis_size("cp"), lax.axis_index("cp")
    local = x.shape[1]
    q, k, v = _project(w, x)
    with jax.named_scope("halo_exchange"):
        to_next = [(j, j + 1) for j in range(n - 1)]
        k_halo = lax.ppermute(halo_of(k), "cp", to_next)
        v_halo = lax.ppermute(halo_of(v), "cp", to_next)
    keys = jnp.concatenate([k_halo, k], axis=1)
    values = jnp.concatenate([v_halo, v], axis=1)
    q_pos = i * local + jnp.arange(local)
    k_pos = i * local - (CFG.window - 1) + jnp.arange(local + CFG.window - 1)
    delta = q_pos[:, None] - k_pos[None, :]
    allowed = (delta >= 0) & (delta < CFG.window) & (k_pos[None, :] >= 0)
    return _masked_attention(w, q, keys, values, allowed)


def _windowed(w, x, mesh, halo_of):
    fn = jax.shard_map(lambda w, x: _window_local(w, x, halo_of), mesh=mesh,
                       in_specs=(P(), P(None, "cp")), out_specs=P(None, "cp"))
    return fn(w, x)


def window_attention_halo(w, x, mesh):
    return _windowed(w, x, mesh, _halo_tail)


def window_attention_halo_head(w, x, mesh):
    return _windowed(w, x, mesh, _halo_head)
