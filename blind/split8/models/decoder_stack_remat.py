"""Post-LN blocks (LayerNorm with bias) scanned over stacked layers under jax.checkpoint;
odd layers use ReLU, even layers GELU, chosen with lax.switch on the layer index."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

NL, BATCH, SEQ, D, HEADS, FF = 2, 4, 4, 8, 2, 16
HD = D // HEADS


def layer_norm(x, g, b):
    mu = x.mean(-1, keepdims=True)
    xc = x - mu
    return xc * lax.rsqrt((xc * xc).mean(-1, keepdims=True) + 1e-5) * g + b


def _act(kind, h):
    return lax.switch(kind, [jax.nn.gelu, jax.nn.relu], h)


def _attn(lp, x):
    qkv = jnp.einsum("bsd,dthe->tbshe", x, lp["qkv"])
    s = jnp.einsum("bqhe,bkhe->bhqk", qkv[0], qkv[1]) / jnp.sqrt(float(HD))
    o = jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(s, -1), qkv[2])
    return jnp.einsum("bqhe,hed->bqd", o, lp["proj"])


def _ffn(lp, x, kind):
    return _act(kind, x @ lp["fc1"] + lp["fc1_b"]) @ lp["fc2"]


def transformer(stack, x):
    @jax.checkpoint
    def block(h, inp):
        lp, i = inp
        h = layer_norm(h + _attn(lp, h), lp["ln1_g"], lp["ln1_b"])
        h = layer_norm(h + _ffn(lp, h, i % 2) + lp["fc2_b"], lp["ln2_g"], lp["ln2_b"])
        return h, None

    out, _ = lax.scan(block, x, (stack, jnp.arange(NL)))
    return out


def stack_inputs():
    f = jnp.float32

    def s(*shape):
        return jax.ShapeDtypeStruct((NL, *shape), f)

    stack = {"qkv": s(D, 3, HEADS, HD), "proj": s(HEADS, HD, D), "fc1": s(D, FF), "fc1_b": s(FF),
             "fc2": s(FF, D), "fc2_b": s(D), "ln1_g": s(D), "ln1_b": s(D), "ln2_g": s(D),
             "ln2_b": s(D)}
    return stack, jax.ShapeDtypeStruct((BATCH, SEQ, D), f)


STACK_SPECS = {"qkv": P(None, None, None, "tp"), "proj": P(None, "tp"), "fc1": P(None, None, "tp"),
               "fc1_b": P(None, "tp"), "fc2": P(None, "tp"), "fc2_b": P(), "ln1_g": P(),
               "ln1_b": P(), "ln2_g": P(), "ln2_b": P()}


def _sharded_stack(reduce_axis):
    def run(stack, x):
        @jax.checkpoint
        def block(h, inp):
            lp, i = inp
            h = layer_norm(h + lax.psum(_attn(lp, h), "tp"), lp["ln1_g"], lp["ln1_b"])
            mlp = lax.psum(_ffn(lp, h, i % 2), reduce_axis)
            h = layer_norm(h + mlp + lp["fc2_b"], lp["ln2_g"], lp["ln2_b"])
            return h, None

        out, _ = lax.scan(block, x, (stack, jnp.arange(NL)))
        return out

    return run


def transformer_sharded(stack, x):
    return jax.shard_map(_sharded_stack("tp"), in_specs=(STACK_SPECS, P("dp")),
                         out_specs=P("dp"), check_vma=False)(stack, x)


def transformer_sharded_v2(stack, x):
    return jax.shard_map(_sharded_stack("dp"), in_specs=(STACK_SPECS, P("dp")),
                         out_specs=P("dp"), check_vma=False)(stack, x)
