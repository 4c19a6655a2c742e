"""bf16 pre-norm decoder block (LayerNorm in f32, softmax in f32, matmuls accumulate in f32)
sharded by jit alone on a {seq, model} mesh: the residual stream is sequence-sharded between the
sublayers and gathered for attention; heads and MLP columns follow 'model'."""
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

B, S, D, H, FF = 2, 8, 16, 4, 32
HD = D // H
bf16, f32 = jnp.bfloat16, jnp.float32


def ln(x, g):
    xf = x.astype(f32)
    xf = (xf - xf.mean(-1, keepdims=True)) * jax.lax.rsqrt(xf.var(-1, keepdims=True) + 1e-5)
    return (xf * g.astype(f32)).astype(bf16)


def mm(eq, a, b):
    return jnp.einsum(eq, a, b, preferred_element_type=f32).astype(bf16)


def attention(h, w):
    q = mm("bsd,dhk->bshk", h, w["q"])
    k = mm("bsd,dhk->bshk", h, w["k"])
    v = mm("bsd,dhk->bshk", h, w["v"])
    logits = jnp.einsum("bqhk,bshk->bhqs", q, k, preferred_element_type=f32) / HD**0.5
    causal = jnp.tril(jnp.ones((S, S), bool))
    probs = jax.nn.softmax(jnp.where(causal, logits, -jnp.inf), axis=-1).astype(bf16)
    return mm("bqhs,hsk->bqk", mm("bhqs,bshk->bqhk", probs, v), w["o"])


def mlp(h, w):
    return mm("bsf,fd->bsd", jax.nn.gelu(mm("bsd,df->bsf", h, w["up"])), w["down"])


def block(w, x):
    x = x + attention(ln(x, w["ln1"]), w)
    return x + mlp(ln(x, w["ln2"]), w)


def _block_jit(w, x, mesh, skip_ln2=False):
    seq_sharded = NamedSharding(mesh, P(None, "seq", None))
    by_head = NamedSharding(mesh, P(None, "model", None))
    w = dict(w, q=jax.lax.with_sharding_constraint(w["q"], by_head),
             k=jax.lax.with_sharding_constraint(w["k"], by_head),
             v=jax.lax.with_sharding_constraint(w["v"], by_head),
             up=jax.lax.with_sharding_constraint(w["up"], NamedSharding(mesh, P(None, "model"))))
    x = jax.lax.with_sharding_constraint(x, seq_sharded)
    x = x + attention(ln(x, w["ln1"]), w)
    x = jax.lax.with_sharding_constraint(x, seq_sharded)
    if skip_ln2:
        y = x + mlp(x, w)
    else:
        y = x + mlp(ln(x, w["ln2"]), w)
    return jax.lax.with_sharding_constraint(y, NamedSharding(mesh, P()))


def block_jit(w, x, mesh):
    return _block_jit(w, x, mesh)


def block_jit_no_ln2(w, x, mesh):
    return _block_jit(w, x, mesh, skip_ln2=True)


def inputs():
    s = jax.ShapeDtypeStruct
    w = {"ln1": s((D,), bf16), "ln2": s((D,), bf16), "q": s((D, H, HD), bf16),
         "k": s((D, H, HD), bf16), "v": s((D, H, HD), bf16), "o": s((H, HD, D), bf16),
         "up": s((D, FF), bf16), "down": s((FF, D), bf16)}
    return w, s((B, S, D), bf16)
