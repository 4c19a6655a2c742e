"""Sequence parallelism on a 4-way `sp` axis, activations sharded over the sequence.

1. Megatron-SP MLP sublayer: RMSNorm on the local sequence chunk, all_gather of the normalized
   chunks (untiled, the gathered [B, n, T/n, D] folded back to [B, T, D]), column/row-parallel
   weights over the same axis, and psum_scatter(tiled=True) back onto the sequence dim.
2. Causal attention with local queries and all-gathered K/V, computed blockwise over the gathered
   K/V chunks with an online (flash-style) softmax in lax.scan.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, F = 2, 16, 32, 64
NEG = -1e30


def _rms(x, w):
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w


def mlp_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"norm": f(D), "w_in": f(D, F), "w_out": f(F, D)}, f(B, T, D)


def mlp_sublayer(params, x):
    h = _rms(x, params["norm"])
    return x + jax.nn.gelu(h @ params["w_in"]) @ params["w_out"]


def _sp_mlp(params, x):
    b, t_local, d = x.shape
    h = _rms(x, params["norm"])
    full = lax.all_gather(h, "sp", axis=1)
    full = full.reshape(b, -1, d)
    partial = jax.nn.gelu(full @ params["w_in"]) @ params["w_out"]
    return x + lax.psum_scatter(partial, "sp", scatter_dimension=1, tiled=True)


def _sp_mlp_gather_leading(params, x):
    b, t_local, d = x.shape
    h = _rms(x, params["norm"])
    full = lax.all_gather(h, "sp")
    full = full.reshape(b, -1, d)
    partial = jax.nn.gelu(full @ params["w_in"]) @ params["w_out"]
    return x + lax.psum_scatter(partial, "sp", scatter_dimension=1, tiled=True)


_MLP_SPECS = {"norm": P(), "w_in": P(None, "sp"), "w_out": P("sp")}


def mlp_sublayer_sp(params, x, mesh):
    return jax.shard_map(_sp_mlp, mesh=mesh, in_specs=(_MLP_SPECS, P(None, "sp")),
                         out_specs=P(None, "sp"))(params, x)


def mlp_sublayer_sp_gather_leading(params, x, mesh):
    return jax.shard_map(_sp_mlp_gather_leading, mesh=mesh, in_specs=(_MLP_SPECS, P(None, "sp")),
                         out_specs=P(None, "sp"))(params, x)


# ---- blockwise causal attention over gathered K/V -----------------------------------------------

H, HD = 2, 8


def attn_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD), "wo": f(H, HD, D)}, f(B, T, D)


def causal_attention(params, x):
    q, k, v = (jnp.einsum("btd,dhe->bthe", x, params[n]) for n in ("wq", "wk", "wv"))
    s = jnp.einsum("bqhe,bkhe->bhqk", q, k) / jnp.sqrt(float(HD))
    s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, NEG)
    o = jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(s, axis=-1), v)
    return x + jnp.einsum("bqhe,hed->bqd", o, params["wo"])


def _blocks(t, n):
    # [B, T, H, HD] -> [n, B, T/n, H, HD]
    return jnp.moveaxis(t.reshape(t.shape[0], n, -1, *t.shape[2:]), 1, 0)


def _flash_sp(params, x):
    t_local = x.shape[1]
    n = lax.axis_size("sp")
    q, k, v = (jnp.einsum("btd,dhe->bthe", x, params[name]) for name in ("wq", "wk", "wv"))
    k = lax.all_gather(k, "sp", axis=1, tiled=True)
    v = lax.all_gather(v, "sp", axis=1, tiled=True)
    q = q * HD ** -0.5
    q_pos = lax.axis_index("sp") * t_local + jnp.arange(t_local)

    def step(carry, blk):
        m, l, acc = carry
        k_j, v_j, j = blk
        k_pos = j * t_local + jnp.arange(t_local)
        s = jnp.einsum("bqhe,bkhe->bhqk", q, k_j)
        s = jnp.where(q_pos[:, None] >= k_pos[None, :], s, NEG)
        m_new = jnp.maximum(m, s.max(axis=-1))
        corr = jnp.exp(m - m_new)
        p = jnp.exp(s - m_new[..., None])
        l = l * corr + p.sum(axis=-1)
        acc = acc * corr[..., None] + jnp.einsum("bhqk,bkhe->bhqe", p, v_j)
        return (m_new, l, acc), None

    b = x.shape[0]
    init = (jnp.full((b, H, t_local), NEG), jnp.zeros((b, H, t_local)),
            jnp.zeros((b, H, t_local, HD)))
    (m, l, acc), _ = lax.scan(step, init, (_blocks(k, n), _blocks(v, n), jnp.arange(n)))
    o = (acc / l[..., None]).transpose(0, 2, 1, 3)
    return x + jnp.einsum("bqhe,hed->bqd", o, params["wo"])


def _flash_sp_stale_sum(params, x):
    t_local = x.shape[1]
    n = lax.axis_size("sp")
    q, k, v = (jnp.einsum("btd,dhe->bthe", x, params[name]) for name in ("wq", "wk", "wv"))
    k = lax.all_gather(k, "sp", axis=1, tiled=True)
    v = lax.all_gather(v, "sp", axis=1, tiled=True)
    q = q * HD ** -0.5
    q_pos = lax.axis_index("sp") * t_local + jnp.arange(t_local)

    def step(carry, blk):
        m, l, acc = carry
        k_j, v_j, j = blk
        k_pos = j * t_local + jnp.arange(t_local)
        s = jnp.einsum("bqhe,bkhe->bhqk", q, k_j)
        s = jnp.where(q_pos[:, None] >= k_pos[None, :], s, NEG)
        m_new = jnp.maximum(m, s.max(axis=-1))
        corr = jnp.exp(m - m_new)
        p = jnp.exp(s - m_new[..., None])
        l = l + p.sum(axis=-1)
        acc = acc * corr[..., None] + jnp.einsum("bhqk,bkhe->bhqe", p, v_j)
        return (m_new, l, acc), None

    b = x.shape[0]
    init = (jnp.full((b, H, t_local), NEG), jnp.zeros((b, H, t_local)),
            jnp.zeros((b, H, t_local, HD)))
    (m, l, acc), _ = lax.scan(step, init, (_blocks(k, n), _blocks(v, n), jnp.arange(n)))
    o = (acc / l[..., None]).transpose(0, 2, 1, 3)
    return x + jnp.einsum("bqhe,hed->bqd", o, params["wo"])


def causal_attention_sp(params, x, mesh):
    return jax.shard_map(_flash_sp, mesh=mesh, in_specs=(P(), P(None, "sp")),
                         out_specs=P(None, "sp"), check_vma=False)(params, x)


def causal_attention_sp_stale_sum(params, x, mesh):
    return jax.shard_map(_flash_sp_stale_sum, mesh=mesh, in_specs=(P(), P(None, "sp")),
                         out_specs=P(None, "sp"), check_vma=False)(params, x)
