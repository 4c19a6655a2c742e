"""bfloat16 decoder pieces: bf16 storage and matmuls, float32 accumulation, norms and softmax."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BF16, F32 = jnp.bfloat16, jnp.float32
B, S, D, F, H, HD, VOCAB, LAYERS = 2, 8, 32, 64, 4, 8, 64, 2


def rms_norm(x, weight, eps=1e-6):
    xf = x.astype(F32)
    xf = xf * lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return xf.astype(BF16) * weight


def _mlp(h, w_up, w_down):
    up = jnp.dot(h, w_up, preferred_element_type=F32)
    act = jax.nn.silu(up).astype(BF16)
    return jnp.dot(act, w_down, preferred_element_type=F32)


def mlp_block(p, x):
    y = _mlp(rms_norm(x, p["norm"]), p["w_up"], p["w_down"])
    return (x.astype(F32) + y).astype(BF16)


def mlp_block_inputs():
    return ({"norm": jax.ShapeDtypeStruct((D,), BF16),
             "w_up": jax.ShapeDtypeStruct((D, F), BF16),
             "w_down": jax.ShapeDtypeStruct((F, D), BF16)},
            jax.ShapeDtypeStruct((B, S, D), BF16))


_MLP_SPECS = {"norm": P(), "w_up": P(None, "tp"), "w_down": P("tp", None)}


def mlp_block_tp(p, x, mesh):
    @jax.shard_map(mesh=mesh, in_specs=(_MLP_SPECS, P()), out_specs=P())
    def body(p, x):
        y = lax.psum(_mlp(rms_norm(x, p["norm"]), p["w_up"], p["w_down"]), "tp")
        return (x.astype(F32) + y).astype(BF16)

    return body(p, x)


def mlp_block_hidden_sharded(p, x, mesh):
    """The residual stream stays split along the hidden dim; w_up is row-parallel."""
    specs = {"norm": P("tp"), "w_up": P("tp", None), "w_down": P(None, "tp")}

    @jax.shard_map(mesh=mesh, in_specs=(specs, P(None, None, "tp")), out_specs=P(None, None, "tp"))
    def body(p, x):
        xf = x.astype(F32)
        ms = jnp.mean(jnp.square(xf), axis=-1, keepdims=True)
        h = (xf * lax.rsqrt(ms + 1e-6)).astype(BF16) * p["norm"]
        up = lax.psum(jnp.dot(h, p["w_up"], preferred_element_type=F32), "tp")
        y = jnp.dot(jax.nn.silu(up).astype(BF16), p["w_down"], preferred_element_type=F32)
        return (xf + y).astype(BF16)

    return body(p, x)


# ---------------------------------------------------------------- attention, dot_general style
def _dims(lhs_contract, rhs_contract, lhs_batch, rhs_batch):
    return ((lhs_contract, rhs_contract), (lhs_batch, rhs_batch))


def _attention_core(x, wq, wk, wv):
    """x [b, s, d] bf16; w* [d, h, hd] bf16 -> context [b, h, s, hd] bf16."""
    q = lax.dot_general(x, wq, _dims((2,), (0,), (), ())).astype(BF16)   # b s h k
    k = lax.dot_general(x, wk, _dims((2,), (0,), (), ())).astype(BF16)
    v = lax.dot_general(x, wv, _dims((2,), (0,), (), ())).astype(BF16)
    logits = lax.dot_general(q, k, _dims((3,), (3,), (0, 2), (0, 2)),
                             preferred_element_type=F32)                 # b h q t
    probs = jax.nn.softmax(logits * (q.shape[-1] ** -0.5), axis=-1).astype(BF16)
    return lax.dot_general(probs, v, _dims((3,), (1,), (0, 1), (0, 2)),
                           preferred_element_type=F32).astype(BF16)     # b h q k


def attention(p, x):
    ctx = _attention_core(x, p["wq"], p["wk"], p["wv"])
    out = lax.dot_general(ctx, p["wo"], _dims((1, 3), (0, 1), (), ()), preferred_element_type=F32)
    return out


def attention_inputs():
    proj = jax.ShapeDtypeStruct((D, H, HD), BF16)
    return ({"wq": proj, "wk": proj, "wv": proj, "wo": jax.ShapeDtypeStruct((H, HD, D), BF16)},
            jax.ShapeDtypeStruct((B, S, D), BF16))


def attention_tp(p, x, mesh):
    def body(wq, wk, wv, wo, x):
        ctx = _attention_core(x, wq, wk, wv)
        out = lax.dot_general(ctx, wo, _dims((1, 3), (0, 1), (), ()), preferred_element_type=F32)
        return lax.psum(out, "tp")

    col = P(None, "tp", None)
    fn = jax.shard_map(body, mesh=mesh, in_specs=(col, col, col, P("tp", None, None), P()),
                       out_specs=P())
    return fn(p["wq"], p["wk"], p["wv"], p["wo"], x)


# ---------------------------------------------------------------- small decoder, vocab-parallel head
def decoder(p, x):
    def layer(h, w):
        return mlp_block(w, h), None

    h, _ = lax.scan(layer, x, p["layers"])
    h = rms_norm(h, p["final_norm"])
    return jnp.dot(h, p["head"], preferred_element_type=F32)


def decoder_inputs():
    layer, x = mlp_block_inputs()
    stacked = jax.tree.map(lambda s: jax.ShapeDtypeStruct((LAYERS, *s.shape), s.dtype), layer)
    return ({"layers": stacked, "final_norm": jax.ShapeDtypeStruct((D,), BF16),
             "head": jax.ShapeDtypeStruct((D, VOCAB), BF16)}, x)


def decoder_tp(p, x, mesh):
    specs = {"layers": {"norm": P(), "w_up": P(None, None, "tp"), "w_down": P(None, "tp", None)},
             "final_norm": P(), "head": P(None, "tp")}

    @jax.shard_map(mesh=mesh, in_specs=(specs, P()), out_specs=P(None, None, "tp"))
    def body(p, h):
        for i in range(LAYERS):
            w = jax.tree.map(lambda a, i=i: a[i], p["layers"])
            y = lax.psum(_mlp(rms_norm(h, w["norm"]), w["w_up"], w["w_down"]), "tp")
            h = (h.astype(F32) + y).astype(BF16)
        return jnp.dot(h, p["head"], preferred_element_type=F32)

    return body(p, x)
