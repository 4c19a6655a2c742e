# A stack of three pre-norm decoder layers run with lax.scan over stacked bf16 weights.
# The sharded version is jit-only: residual stream sequence-sharded over 'model' between
# sublayers (sequence parallelism), the sublayers themselves left to the compiler,
# batch over 'data'. Norms and softmax in f32.
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

NL, B, S, D, H, F = 3, 2, 8, 16, 4, 32
HD = D // H
BF = jnp.bfloat16


def stack_inputs():
    s = jax.ShapeDtypeStruct
    w = {"ln1": s((NL, D), BF), "qkv": s((NL, D, 3, H, HD), BF), "out": s((NL, H, HD, D), BF),
         "ln2": s((NL, D), BF), "fc1": s((NL, D, F), BF), "fc2": s((NL, F, D), BF)}
    return w, s((B, S, D), BF)


def _norm(x, g):
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6)
    return x32.astype(BF) * g


def _attn(h, lw):
    qkv = jnp.einsum("bsd,dthe->tbshe", h, lw["qkv"])
    q, k, v = qkv[0], qkv[1], qkv[2]
    s = jnp.einsum("bshe,bzhe->bhsz", q, k, preferred_element_type=jnp.float32) / HD ** 0.5
    s = jnp.where(jnp.tril(jnp.ones((S, S), bool)), s, -1e9)
    p = jax.nn.softmax(s, axis=-1).astype(BF)
    ctx = jnp.einsum("bhsz,bzhe->bshe", p, v)
    return jnp.einsum("bshe,hed->bsd", ctx, lw["out"])


def _mlp(h, lw):
    return jax.nn.gelu(h @ lw["fc1"]) @ lw["fc2"]


def stack(weights, x):
    def layer(x, lw):
        x = x + _attn(_norm(x, lw["ln1"]), lw)
        x = x + _mlp(_norm(x, lw["ln2"]), lw)
        return x, None

    y, _ = jax.lax.scan(layer, x, weights)
    return y


def stack_sharded(weights, x, mesh):
    seq = NamedSharding(mesh, P("data", "model", None))
    full = NamedSharding(mesh, P("data", None, None))
    wsc = jax.lax.with_sharding_constraint

    def layer(x, lw):
        h = wsc(_norm(x, lw["ln1"]), seq)
        x = wsc(x + _attn(wsc(h, full), lw), seq)
        h = wsc(_norm(x, lw["ln2"]), seq)
        x = wsc(x + _mlp(wsc(h, full), lw), seq)
        return x, None

    y, _ = jax.lax.scan(layer, wsc(x, seq), weights)
    return wsc(y, NamedSharding(mesh, P()))


def stack_sharded_no_ln2(weights, x, mesh):
    seq = NamedSharding(mesh, P("data", "model", None))
    full = NamedSharding(mesh, P("data", None, None))
    wsc = jax.lax.with_sharding_constraint

    def layer(x, lw):
        h = wsc(_norm(x, lw["ln1"]), seq)
        x = wsc(x + _attn(wsc(h, full), lw), seq)
        x = wsc(x + _mlp(wsc(x, full), lw), seq)
        return x, None

    y, _ = jax.lax.scan(layer, wsc(x, seq), weights)
    return wsc(y, NamedSharding(mesh, P()))
