# Llama-like decoder: lax.scan over 2 stacked layers (each under jax.checkpoint), GQA with
# half-rotation RoPE, SwiGLU MLP. Tensor parallel over KV groups with shard_map.
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N_LAYER, BSZ, SEQ, DIM, NQ, NKV, HDIM, FFN = 2, 2, 6, 16, 4, 2, 4, 32


def inputs():
    f = jnp.float32
    shapes = dict(attn_norm=(N_LAYER, DIM), wq=(N_LAYER, DIM, NQ * HDIM), wk=(N_LAYER, DIM, NKV * HDIM),
                  wv=(N_LAYER, DIM, NKV * HDIM), wo=(N_LAYER, NQ * HDIM, DIM), mlp_norm=(N_LAYER, DIM),
                  w_gate=(N_LAYER, DIM, FFN), w_up=(N_LAYER, DIM, FFN), w_down=(N_LAYER, FFN, DIM))
    return jax.ShapeDtypeStruct((BSZ, SEQ, DIM), f), {k: jax.ShapeDtypeStruct(s, f) for k, s in shapes.items()}


def rms(x, w):
    return x * lax.rsqrt(jnp.mean(jnp.square(x), -1, keepdims=True) + 1e-5) * w


def rope(x):  # x [b, s, h, d]
    half = HDIM // 2
    inv = 500000.0 ** (-jnp.arange(half) / half)
    ang = jnp.arange(x.shape[1])[:, None] * inv[None, :]
    cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def gqa_attention(h, wq, wk, wv, wo, n_q, n_kv, rope_k=True):
    b, s, _ = h.shape
    q = rope(jnp.reshape(h @ wq, (b, s, n_q, HDIM)))
    k = jnp.reshape(h @ wk, (b, s, n_kv, HDIM))
    k = rope(k) if rope_k else k
    v = jnp.reshape(h @ wv, (b, s, n_kv, HDIM))
    k, v = jnp.repeat(k, n_q // n_kv, axis=2), jnp.repeat(v, n_q // n_kv, axis=2)
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) * HDIM ** -0.5
    logits = jnp.where(jnp.tril(jnp.ones((s, s), bool)), logits, -1e9)
    o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, -1), v)
    return o.reshape(b, s, n_q * HDIM) @ wo


def decoder(x, layers):
    def layer(x, p):
        x = x + gqa_attention(rms(x, p["attn_norm"]), p["wq"], p["wk"], p["wv"], p["wo"], NQ, NKV)
        h = rms(x, p["mlp_norm"])
        return x + (jax.nn.silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"], None

    return lax.scan(jax.checkpoint(layer), x, layers)[0]


def _decoder_tp(x, layers, mesh, rope_k):
    n = mesh.shape["tp"]
    col, row = P(None, None, "tp"), P(None, "tp", None)
    specs = dict(attn_norm=P(), wq=col, wk=col, wv=col, wo=row, mlp_norm=P(), w_gate=col, w_up=col,
                 w_down=row)

    def shard(x, layers):
        def layer(x, p):
            a = gqa_attention(rms(x, p["attn_norm"]), p["wq"], p["wk"], p["wv"], p["wo"],
                              NQ // n, NKV // n, rope_k)
            x = x + lax.psum(a, "tp")
            h = rms(x, p["mlp_norm"])
            return x + lax.psum((jax.nn.silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"], "tp"), None

        return lax.scan(jax.checkpoint(layer), x, layers)[0]

    return jax.shard_map(shard, mesh=mesh, in_specs=(P(), specs), out_specs=P())(x, layers)


def decoder_tp(x, layers, mesh):
    return _decoder_tp(x, layers, mesh, rope_k=True)


def decoder_tp_qrope(x, layers, mesh):
    return _decoder_tp(x, layers, mesh, rope_k=False)
