"""Small pre-norm decoder blocks (RMSNorm, causal MHA, SwiGLU MLP, residuals) written as frozen
dataclass modules; tensor-parallel and sequence+tensor-parallel versions."""

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P


@dataclass(frozen=True)
class Dims:
    batch: int = 2
    seq: int = 8
    model: int = 16
    heads: int = 4
    head: int = 4
    ffn: int = 32
    layers: int = 2


DIMS = Dims()


def layer_shapes(d: Dims = DIMS, stacked: bool = False):
    f = jnp.float32
    pre = (d.layers,) if stacked else ()
    shape = {"ln1": (d.model,), "wq": (d.model, d.heads, d.head), "wk": (d.model, d.heads, d.head),
             "wv": (d.model, d.heads, d.head), "wo": (d.heads, d.head, d.model), "ln2": (d.model,),
             "gate": (d.model, d.ffn), "up": (d.model, d.ffn), "down": (d.ffn, d.model)}
    return {k: jax.ShapeDtypeStruct(pre + v, f) for k, v in shape.items()}


def block_inputs():
    x = jax.ShapeDtypeStruct((DIMS.batch, DIMS.seq, DIMS.model), jnp.float32)
    return [layer_shapes() for _ in range(DIMS.layers)], x


def stacked_inputs():
    x = jax.ShapeDtypeStruct((DIMS.batch, DIMS.seq, DIMS.model), jnp.float32)
    return layer_shapes(stacked=True), x


def rmsnorm(x, w):
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-5) * w


@dataclass(frozen=True)
class Attention:
    causal_offset: object = 0          # position of this device's first query

    def __call__(self, p, xq, xkv):
        q = jnp.einsum("bsd,dhk->bshk", xq, p["wq"])
        k = jnp.einsum("bsd,dhk->bshk", xkv, p["wk"])
        v = jnp.einsum("bsd,dhk->bshk", xkv, p["wv"])
        s = jnp.einsum("bqhk,bshk->bhqs", q, k) * (q.shape[-1] ** -0.5)
        qpos = self.causal_offset + jnp.arange(xq.shape[1])[:, None]
        s = jnp.where(jnp.arange(xkv.shape[1])[None, :] <= qpos, s, -1e9)
        o = jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(s, -1), v)
        return jnp.einsum("bqhk,hkd->bqd", o, p["wo"])


def swiglu(p, x):
    return (jax.nn.silu(x @ p["gate"]) * (x @ p["up"])) @ p["down"]


def decoder(layers, x):
    for p in layers:
        h = rmsnorm(x, p["ln1"])
        x = x + Attention()(p, h, h)
        x = x + swiglu(p, rmsnorm(x, p["ln2"]))
    return x


TP_SPECS = {"ln1": P(), "wq": P(None, "tp", None), "wk": P(None, "tp", None), "wv": P(None, "tp", None),
            "wo": P("tp", None, None), "ln2": P(), "gate": P(None, "tp"), "up": P(None, "tp"),
            "down": P("tp", None)}


def decoder_tp(layers, x, mesh):
    def local(layers, x):
        for p in layers:
            h = rmsnorm(x, p["ln1"])
            x = x + lax.psum(Attention()(p, h, h), "tp")
            x = x + lax.psum(swiglu(p, rmsnorm(x, p["ln2"])), "tp")
        return x

    return jax.shard_map(local, mesh=mesh, in_specs=([TP_SPECS] * DIMS.layers, P()),
                         out_specs=P())(layers, x)


def decoder_tp_dropped_residual(layers, x, mesh):
    def local(layers, x):
        for p in layers:
            h = rmsnorm(x, p["ln1"])
            x = x + lax.psum(Attention()(p, h, h), "tp")
            x = lax.psum(swiglu(p, rmsnorm(x, p["ln2"])), "tp")
        return x

    return jax.shard_map(local, mesh=mesh, in_specs=([TP_SPECS] * DIMS.layers, P()),
                         out_specs=P())(layers, x)


def decoder_scan(stack, x):
    def body(x, p):
        h = rmsnorm(x, p["ln1"])
        x = x + Attention()(p, h, h)
        return x + swiglu(p, rmsnorm(x, p["ln2"])), None

    return lax.scan(body, x, stack)[0]


STACK_SPECS = {k: P(None, *spec) for k, spec in TP_SPECS.items()}


def decoder_scan_sp(stack, x, mesh):
    """Megatron sequence parallelism: the residual stream stays split along seq over 'tp'."""

    def local(stack, x):
        def body(x, p):
            h = rmsnorm(x, p["ln1"])
            full = lax.all_gather(h, "tp", axis=1, tiled=True)
            att = Attention()(p, full, full)
            x = x + lax.psum_scatter(att, "tp", scatter_dimension=1, tiled=True)
            h = lax.all_gather(rmsnorm(x, p["ln2"]), "tp", axis=1, tiled=True)
            return x + lax.psum_scatter(swiglu(p, h), "tp", scatter_dimension=1, tiled=True), None

        return lax.scan(body, x, stack)[0]

    return jax.shard_map(local, mesh=mesh, in_specs=(STACK_SPECS, P(None, "tp")),
                         out_specs=P(None, "tp"))(stack, x)


def decoder_scan_sp_unnormed_mlp(stack, x, mesh):
    def local(stack, x):
        def body(x, p):
            h = rmsnorm(x, p["ln1"])
            full = lax.all_gather(h, "tp", axis=1, tiled=True)
            att = Attention()(p, full, full)
            x = x + lax.psum_scatter(att, "tp", scatter_dimension=1, tiled=True)
            h = lax.all_gather(x, "tp", axis=1, tiled=True)
            return x + lax.psum_scatter(swiglu(p, h), "tp", scatter_dimension=1, tiled=True), None

        return lax.scan(body, x, stack)[0]

    return jax.shard_map(local, mesh=mesh, in_specs=(STACK_SPECS, P(None, "tp")),
                         out_specs=P(None, "tp"))(stack, x)


def decoder_cp(layers, x, mesh):
    """Context parallelism: queries stay on their sequence chunk, keys/values are all-gathered."""

    def local(layers, x):
        offset = lax.axis_index("cp") * x.shape[1]
        attend = Attention(causal_offset=offset)
        for p in layers:
            h = rmsnorm(x, p["ln1"])
            x = x + attend(p, h, lax.all_gather(h, "cp", axis=1, tiled=True))
            x = x + swiglu(p, rmsnorm(x, p["ln2"]))
        return x

    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(None, "cp")),
                         out_specs=P(None, "cp"))(layers, x)
