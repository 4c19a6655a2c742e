"""One multi-query-attention decode step with a KV cache (single shared K/V head).

The new token's K/V are written at `pos` with lax.dynamic_update_slice; attention reads a sliding
window of the last WINDOW cache slots through lax.dynamic_slice. Query heads are sharded over tp.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, D, H, HD, T, WINDOW = 2, 32, 8, 8, 16, 4


def decode_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    weights = (f(D, H * HD), f(D, HD), f(D, HD), f(H * HD, D))
    return f(B, D), weights, f(B, T, HD), f(B, T, HD), jax.ShapeDtypeStruct((), jnp.int32)


def decode_step(x, weights, cache_k, cache_v, pos):
    wq, wk, wv, wo = weights
    cache_k = cache_k.at[:, pos, :].set(x @ wk)
    cache_v = cache_v.at[:, pos, :].set(x @ wv)
    keys = jnp.stack([cache_k[:, pos - WINDOW + 1 + i] for i in range(WINDOW)], axis=1)
    vals = jnp.stack([cache_v[:, pos - WINDOW + 1 + i] for i in range(WINDOW)], axis=1)
    q = (x @ wq).reshape(B, H, HD)
    p = jax.nn.softmax(jnp.einsum("bhe,bwe->bhw", q, keys) / jnp.sqrt(HD), axis=-1)
    out = jnp.einsum("bhw,bwe->bhe", p, vals).reshape(B, H * HD) @ wo
    return out, cache_k, cache_v


def _window_ending_at(cache, pos):
    return lax.dynamic_slice(cache, (0, pos - (WINDOW - 1), 0), (B, WINDOW, HD))


def _window_before(cache, pos):
    return lax.dynamic_slice(cache, (0, pos - WINDOW, 0), (B, WINDOW, HD))


def _sharded_step(read_window):
    def local(x, wq, wk, wv, wo, cache_k, cache_v, pos):
        cache_k = lax.dynamic_update_slice(cache_k, (x @ wk)[:, None, :], (0, pos, 0))
        cache_v = lax.dynamic_update_slice(cache_v, (x @ wv)[:, None, :], (0, pos, 0))
        k = read_window(cache_k, pos)
        v = read_window(cache_v, pos)
        q = lax.dot_general(x, wq, (((1,), (0,)), ((), ()))).reshape(B, -1, HD)
        s = lax.dot_general(q, k, (((2,), (2,)), ((0,), (0,)))) * (HD ** -0.5)
        p = jax.nn.softmax(s, axis=-1)
        o = lax.dot_general(p, v, (((2,), (1,)), ((0,), (0,))))
        partial = o.reshape(B, -1) @ wo
        return lax.psum(partial, "tp"), cache_k, cache_v

    return local


def _decode_tp(x, weights, cache_k, cache_v, pos, mesh, read_window):
    wq, wk, wv, wo = weights
    fn = jax.shard_map(
        _sharded_step(read_window), mesh=mesh,
        in_specs=(P(), P(None, "tp"), P(), P(), P("tp", None), P(), P(), P()),
        out_specs=(P(), P(), P()))
    return fn(x, wq, wk, wv, wo, cache_k, cache_v, pos)


def decode_step_tp(x, weights, cache_k, cache_v, pos, mesh):
    return _decode_tp(x, weights, cache_k, cache_v, pos, mesh, _window_ending_at)


def decode_step_tp_v2(x, weights, cache_k, cache_v, pos, mesh):
    return _decode_tp(x, weights, cache_k, cache_v, pos, mesh, _window_before)
