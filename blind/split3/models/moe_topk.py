"""Top-2 mixture of experts. The expert-parallel version keeps every token on every device and
shards the experts: a device runs its own experts on the tokens routed to them and the partial
outputs are summed across devices."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

TOKENS, DIM, HIDDEN, EXPERTS, TOP_K = 16, 8, 16, 8, 2


def _route(x, router):
    probs = jax.nn.softmax(x @ router, axis=-1)
    gate, expert = lax.top_k(probs, TOP_K)
    return gate / jnp.sum(gate, axis=-1, keepdims=True), expert


def _expert_ffn(x, w_in, w_out):
    return jax.nn.silu(x @ w_in) @ w_out


def moe(x, router, w_in, w_out):
    gate, expert = _route(x, router)
    out = jnp.zeros_like(x)
    for slot in range(TOP_K):
        w1 = w_in[expert[:, slot]]  # [tokens, dim, hidden]
        w2 = w_out[expert[:, slot]]
        y = jnp.einsum("th,thd->td", jax.nn.silu(jnp.einsum("td,tdh->th", x, w1)), w2)
        out = out + gate[:, slot : slot + 1] * y
    return out


def moe_inputs():
    f32 = jnp.float32
    return (
        jax.ShapeDtypeStruct((TOKENS, DIM), f32),
        jax.ShapeDtypeStruct((DIM, EXPERTS), f32),
        jax.ShapeDtypeStruct((EXPERTS, DIM, HIDDEN), f32),
        jax.ShapeDtypeStruct((EXPERTS, HIDDEN, DIM), f32),
    )


def moe_ep(x, router, w_in, w_out, mesh):
    n_shards = mesh.shape["expert"]
    local_experts = EXPERTS // n_shards

    def shard_fn(xs, r, w1, w2):
        gate, expert = _route(xs, r)
        shard = lax.axis_index("expert")
        out = jnp.zeros_like(xs)
        for e in range(local_experts):
            e_global = shard * local_experts + e
            weight = jnp.sum(jnp.where(expert == e_global, gate, 0.0), axis=-1, keepdims=True)
            out = out + weight * _expert_ffn(xs, w1[e], w2[e])
        return lax.psum(out, "expert")

    specs = (P(), P(), P("expert"), P("expert"))
    return jax.shard_map(shard_fn, mesh=mesh, in_specs=specs, out_specs=P())(x, router, w_in, w_out)


def moe_ep_strided_ids(x, router, w_in, w_out, mesh):
    n_shards = mesh.shape["expert"]
    local_experts = EXPERTS // n_shards

    def shard_fn(xs, r, w1, w2):
        gate, expert = _route(xs, r)
        shard = lax.axis_index("expert")
        out = jnp.zeros_like(xs)
        for e in range(local_experts):
            e_global = e * n_shards + shard
            weight = jnp.sum(jnp.where(expert == e_global, gate, 0.0), axis=-1, keepdims=True)
            out = out + weight * _expert_ffn(xs, w1[e], w2[e])
        return lax.psum(out, "expert")

    specs = (P(), P(), P("expert"), P("expert"))
    return jax.shard_map(shard_fn, mesh=mesh, in_specs=specs, out_specs=P())(x, router, w_in, w_out)
