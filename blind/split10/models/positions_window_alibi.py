"""Position handling in attention: learned absolute positions with a sliding window (chunked prefill
at an offset), and ALiBi over a KV cache for a chunk of new tokens.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

# ---- learned positions at an offset + sliding window, sequence sharded over cp -------------------

T, D, HD, W, PMAX = 16, 16, 16, 5, 32


def window_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"pos_embed": f(PMAX, D), "wq": f(D, HD), "wk": f(D, HD), "wv": f(D, HD)}
    return params, f(T, D), jax.ShapeDtypeStruct((), jnp.int32)


def _window_visible(q_pos, k_pos):
    dist = q_pos[:, None] - k_pos[None, :]
    return (dist >= 0) & (dist < W)


def _window_visible_wide(q_pos, k_pos):
    dist = q_pos[:, None] - k_pos[None, :]
    return (dist >= 0) & (dist <= W)


def _softmax_attend(q, k, v, visible):
    s = jnp.where(visible, q @ k.T / jnp.sqrt(jnp.float32(HD)), -1e9)
    return jax.nn.softmax(s, axis=-1) @ v


def windowed_prefill(params, x, start):
    pos = start + jnp.arange(T)
    h = x + params["pos_embed"][pos]
    q, k, v = h @ params["wq"], h @ params["wk"], h @ params["wv"]
    return _softmax_attend(q, k, v, _window_visible(pos, pos))


def _cp_prefill(visible_fn):
    def local(params, x, start):
        n = x.shape[0]
        pos = start + lax.axis_index("cp") * n + lax.iota(jnp.int32, n)
        h = x + jnp.take(params["pos_embed"], pos, axis=0)
        k = lax.all_gather(h @ params["wk"], "cp", tiled=True)
        v = lax.all_gather(h @ params["wv"], "cp", tiled=True)
        k_pos = start + lax.iota(jnp.int32, k.shape[0])
        return _softmax_attend(h @ params["wq"], k, v, visible_fn(pos, k_pos))
    return local


def windowed_prefill_cp(params, x, start, mesh):
    return jax.shard_map(_cp_prefill(_window_visible), mesh=mesh, in_specs=(P(), P("cp"), P()),
                         out_specs=P("cp"))(params, x, start)


def windowed_prefill_cp_wide(params, x, start, mesh):
    return jax.shard_map(_cp_prefill(_window_visible_wide), mesh=mesh, in_specs=(P(), P("cp"), P()),
                         out_specs=P("cp"))(params, x, start)


# ---- ALiBi over a KV cache, heads sharded, vmap over local heads ---------------------------------

TQ, S, DM, H, HK = 4, 16, 32, 8, 4


def alibi_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return (f(TQ, DM), f(DM, H, HK), f(S, H, HK), f(S, H, HK), f(H, HK, DM),
            jax.ShapeDtypeStruct((), jnp.int32))


def alibi_slope(head):
    return 2.0 ** (-8.0 * (head + 1) / H)


def _one_head(q, k, v, slope, offset):
    q_pos = offset + jnp.arange(q.shape[0])
    k_pos = jnp.arange(k.shape[0])
    rel = (k_pos[None, :] - q_pos[:, None]).astype(jnp.float32)
    s = q @ k.T * HK ** -0.5 + slope * rel
    s = jnp.where(k_pos[None, :] <= q_pos[:, None], s, -jnp.inf)
    return jax.nn.softmax(s, axis=-1) @ v


_heads = jax.vmap(_one_head, in_axes=(1, 1, 1, 0, None), out_axes=1)


def alibi_chunk(x, wq, cache_k, cache_v, wo, offset):
    q = jnp.einsum("td,dhk->thk", x, wq)
    ctx = _heads(q, cache_k, cache_v, alibi_slope(jnp.arange(H)), offset)
    return jnp.einsum("thk,hkd->td", ctx, wo)


def alibi_chunk_tp(x, wq, cache_k, cache_v, wo, offset, mesh):
    def local(x, wq, cache_k, cache_v, wo, offset):
        n_local = wq.shape[1]
        head = lax.axis_index("heads") * n_local + jnp.arange(n_local)
        ctx = _heads(jnp.einsum("td,dhk->thk", x, wq), cache_k, cache_v, alibi_slope(head), offset)
        return lax.psum(jnp.einsum("thk,hkd->td", ctx, wo), "heads")

    sh = P(None, "heads")
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), sh, sh, sh, P("heads"), P()),
                         out_specs=P())(x, wq, cache_k, cache_v, wo, offset)


def alibi_chunk_tp_slopes(x, wq, cache_k, cache_v, wo, offset, mesh):
    def local(x, wq, cache_k, cache_v, wo, offset):
        n_local = wq.shape[1]
        head = jnp.arange(n_local)
        ctx = _heads(jnp.einsum("td,dhk->thk", x, wq), cache_k, cache_v, alibi_slope(head), offset)
        return lax.psum(jnp.einsum("thk,hkd->td", ctx, wo), "heads")

    sh = P(None, "heads")
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), sh, sh, sh, P("heads"), P()),
                         out_specs=P())(x, wq, cache_k, cache_v, wo, offset)
