"""Pre-LN decoder block (LayerNorm with bias, causal MHA, SwiGLU) and a Megatron-style TP version.

The tensor-parallel code follows the Megatron-LM layer classes: ColumnParallelLinear with a
``gather_output`` flag and RowParallelLinear with an ``input_is_parallel`` flag.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

BATCH, SEQ, HIDDEN, HEADS, HEAD_DIM, FFN = 2, 8, 32, 4, 8, 48
EPS = 1e-5


def make_inputs():
    sds = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {
        "ln1": {"scale": sds(HIDDEN), "bias": sds(HIDDEN)},
        "ln2": {"scale": sds(HIDDEN), "bias": sds(HIDDEN)},
        "qkv": sds(HIDDEN, 3 * HEADS * HEAD_DIM),
        "proj": sds(HEADS * HEAD_DIM, HIDDEN),
        "gate_up": sds(HIDDEN, 2 * FFN),
        "down": sds(FFN, HIDDEN),
    }
    return sds(BATCH, SEQ, HIDDEN), params


def layer_norm(x, ln):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + EPS) * ln["scale"] + ln["bias"]


def block(x, params):
    b, s, _ = x.shape
    h = layer_norm(x, params["ln1"])
    q, k, v = jnp.split(h @ params["qkv"], 3, axis=-1)
    heads = lambda t: t.reshape(b, s, HEADS, HEAD_DIM)
    attn = jax.nn.dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
    x = x + attn.reshape(b, s, HEADS * HEAD_DIM) @ params["proj"]
    h = layer_norm(x, params["ln2"])
    gate, up = jnp.split(h @ params["gate_up"], 2, axis=-1)
    return x + (jax.nn.silu(gate) * up) @ params["down"]


class ColumnParallelLinear:
    """Y = X A with A split by columns; optionally all-gather Y."""

    def __init__(self, axis, gather_output=False):
        self.axis, self.gather_output = axis, gather_output

    def __call__(self, x, w_shard):
        y = x @ w_shard
        if self.gather_output:
            y = jax.lax.all_gather(y, self.axis, axis=y.ndim - 1, tiled=True)
        return y


class RowParallelLinear:
    """Y = X A with A split by rows; X arrives split (input_is_parallel) or is split here."""

    def __init__(self, axis, input_is_parallel=True):
        self.axis, self.input_is_parallel = axis, input_is_parallel

    def __call__(self, x, w_shard):
        if not self.input_is_parallel:
            n = w_shard.shape[0]
            x = jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index(self.axis) * n, n, axis=-1)
        return jax.lax.psum(x @ w_shard, self.axis)


class TPBlock:
    def __init__(self, mesh, axis="tp"):
        self.mesh, self.axis = mesh, axis
        self.tp = mesh.shape[axis]
        self.out_proj = RowParallelLinear(axis, input_is_parallel=True)
        self.down_proj = RowParallelLinear(axis, input_is_parallel=True)

    def norm(self, x, ln):
        return layer_norm(x, ln)

    def attention(self, h, w_qkv):
        # w_qkv: [HIDDEN, 3, local_heads, HEAD_DIM]
        qkv = jnp.einsum("bsd,dthe->tbshe", h, w_qkv)
        o = jax.nn.dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        b, s, lh, e = o.shape
        return self.out_proj(o.reshape(b, s, lh * e), self.local_proj)

    def mlp(self, h, w_gate_up, w_down):
        # w_gate_up: [HIDDEN, 2, local_ffn]
        gate, up = jnp.einsum("bsd,dtf->tbsf", h, w_gate_up)
        return self.down_proj(jax.nn.silu(gate) * up, w_down)

    def local_body(self, x, p):
        self.local_proj = p["proj"]
        x = x + self.attention(self.norm(x, p["ln1"]), p["qkv"])
        return x + self.mlp(self.norm(x, p["ln2"]), p["gate_up"], p["down"])

    def layout(self, params):
        p = dict(params)
        p["qkv"] = params["qkv"].reshape(HIDDEN, 3, HEADS, HEAD_DIM)
        p["gate_up"] = params["gate_up"].reshape(HIDDEN, 2, FFN)
        specs = {"ln1": P(), "ln2": P(), "qkv": P(None, None, self.axis, None),
                 "proj": P(self.axis, None), "gate_up": P(None, None, self.axis),
                 "down": P(self.axis, None)}
        return p, specs

    def __call__(self, x, params):
        p, specs = self.layout(params)
        fn = jax.shard_map(self.local_body, mesh=self.mesh, in_specs=(P(), specs), out_specs=P())
        return fn(x, p)


class TPBlockFlatQKV(TPBlock):
    """Keeps the fused QKV weight flat and column-shards it like any other column-parallel weight."""

    def layout(self, params):
        p, specs = super().layout(params)
        p["qkv"] = params["qkv"]
        specs["qkv"] = P(None, self.axis)
        return p, specs

    def attention(self, h, w_qkv):
        q, k, v = jnp.split(ColumnParallelLinear(self.axis)(h, w_qkv), 3, axis=-1)
        b, s, _ = h.shape
        heads = lambda t: t.reshape(b, s, -1, HEAD_DIM)
        o = jax.nn.dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        return self.out_proj(o.reshape(b, s, -1), self.local_proj)


class TPBlockOwnNorm(TPBlock):
    """Uses a hand-fused LayerNorm kernel for the sharded block."""

    def norm(self, x, ln):
        mu = jnp.mean(x, axis=-1, keepdims=True)
        xc = x - mu
        inv = jax.lax.rsqrt(jnp.mean(xc * xc, axis=-1, keepdims=True) + EPS)
        return xc * inv * ln["scale"]


def tp_block(x, params, mesh):
    return TPBlock(mesh)(x, params)


def tp_block_flat_qkv(x, params, mesh):
    return TPBlockFlatQKV(mesh)(x, params)


def tp_block_own_norm(x, params, mesh):
    return TPBlockOwnNorm(mesh)(x, params)
