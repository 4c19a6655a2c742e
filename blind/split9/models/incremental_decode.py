"""A pre-norm decoder block evaluated two ways: on the whole sequence with a causal mask
(reference), and token by token with a KV cache inside lax.while_loop (teacher forcing), heads and
MLP columns sharded over `tp`. Incremental decoding must reproduce the causal forward exactly.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, N, D, H, HD, F = 2, 6, 16, 4, 4, 32
NEG = -1e9


def seq_args():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(B, N, D), {"n1": f(D), "n2": f(D), "wq": f(D, H * HD), "wk": f(D, H * HD),
                        "wv": f(D, H * HD), "wo": f(H * HD, D), "w_in": f(D, F), "w_out": f(F, D)}


def rms(x, w):
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w


def causal_block(x, p):
    h = rms(x, p["n1"])
    q, k, v = ((h @ p[n]).reshape(B, N, H, HD) for n in ("wq", "wk", "wv"))
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(float(HD))
    s = jnp.where(jnp.tril(jnp.ones((N, N), dtype=bool)), s, NEG)
    o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)
    x = x + o.reshape(B, N, H * HD) @ p["wo"]
    return x + jax.nn.relu(rms(x, p["n2"]) @ p["w_in"]) @ p["w_out"]


def _decoder(visible_at):
    def run(x, n1, n2, wq, wk, wv, wo, w_in, w_out):
        hl = wq.shape[1] // HD

        def step(carry):
            t, ck, cv, out = carry
            xt = lax.dynamic_index_in_dim(x, t, axis=1, keepdims=False)
            h = rms(xt, n1)
            q, k, v = ((h @ w).reshape(B, hl, HD) for w in (wq, wk, wv))
            ck = lax.dynamic_update_slice(ck, k[:, None], (0, t, 0, 0))
            cv = lax.dynamic_update_slice(cv, v[:, None], (0, t, 0, 0))
            visible = visible_at(t)
            s = jnp.einsum("bhd,bkhd->bhk", q, ck) / jnp.sqrt(float(HD))
            s = jnp.where(visible[None, None, :], s, NEG)
            o = jnp.einsum("bhk,bkhd->bhd", jax.nn.softmax(s, axis=-1), cv)
            xt = xt + lax.psum(o.reshape(B, -1) @ wo, "tp")
            yt = xt + lax.psum(jax.nn.relu(rms(xt, n2) @ w_in) @ w_out, "tp")
            return t + 1, ck, cv, lax.dynamic_update_index_in_dim(out, yt, t, axis=1)

        cache = jnp.zeros((B, N, hl, HD), x.dtype)
        init = (jnp.int32(0), cache, cache, jnp.zeros_like(x))
        return lax.while_loop(lambda c: c[0] < N, step, init)[3]

    return run


def _decode_tp(x, p, mesh, visible_at):
    col, row = P(None, "tp"), P("tp", None)
    fn = jax.shard_map(_decoder(visible_at), mesh=mesh,
                       in_specs=(P(), P(), P(), col, col, col, row, col, row), out_specs=P(),
                       check_vma=False)
    return fn(x, p["n1"], p["n2"], p["wq"], p["wk"], p["wv"], p["wo"], p["w_in"], p["w_out"])


def decode_loop_tp(x, p, mesh):
    return _decode_tp(x, p, mesh, lambda t: jnp.arange(N) <= t)


def decode_loop_tp_v2(x, p, mesh):
    return _decode_tp(x, p, mesh, lambda t: jnp.arange(N) < t)
