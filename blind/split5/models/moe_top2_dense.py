"""Top-2 mixture of experts computed densely; experts are sharded over 'ep', tokens replicated."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

TOKENS, D, F, EXPERTS, TOP_K = 16, 8, 16, 8, 2


def moe_inputs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((TOKENS, D), f), jax.ShapeDtypeStruct((D, EXPERTS), f),
            jax.ShapeDtypeStruct((EXPERTS, D, F), f), jax.ShapeDtypeStruct((EXPERTS, F, D), f))


def moe(x, w_gate, w_up, w_down):
    probs = jax.nn.softmax(x @ w_gate, axis=-1)
    top_vals, top_idx = lax.top_k(probs, TOP_K)
    top_vals = top_vals / jnp.sum(top_vals, axis=-1, keepdims=True)
    combine = jnp.zeros((TOKENS, EXPERTS)).at[jnp.arange(TOKENS)[:, None], top_idx].set(top_vals)
    h = jax.nn.gelu(jnp.einsum("td,edf->etf", x, w_up))
    y = jnp.einsum("etf,efd->etd", h, w_down)
    return jnp.einsum("te,etd->td", combine, y)


def moe_ep(x, w_gate, w_up, w_down):
    def expert_shard(x, w_gate, w_up, w_down):
        n_local = w_up.shape[0]
        first = lax.axis_index("ep") * n_local
        probs = jax.nn.softmax(x @ w_gate, axis=-1)
        top_vals, top_idx = lax.top_k(probs, TOP_K)
        top_vals = top_vals / jnp.sum(top_vals, axis=-1, keepdims=True)
        weights = jnp.sum(jax.nn.one_hot(top_idx, EXPERTS) * top_vals[..., None], axis=1)
        weights = lax.dynamic_slice_in_dim(weights, first, n_local, axis=1)
        h = jax.nn.gelu(jnp.einsum("td,edf->etf", x, w_up))
        y = jnp.einsum("etf,efd->etd", h, w_down)
        return lax.psum(jnp.einsum("te,etd->td", weights, y), "ep")

    return jax.shard_map(expert_shard, in_specs=(P(), P(), P("ep"), P("ep")), out_specs=P())(
        x, w_gate, w_up, w_down)


def moe_ep_unnormalized(x, w_gate, w_up, w_down):
    def expert_shard(x, w_gate, w_up, w_down):
        n_local = w_up.shape[0]
        first = lax.axis_index("ep") * n_local
        probs = jax.nn.softmax(x @ w_gate, axis=-1)
        top_vals, top_idx = lax.top_k(probs, TOP_K)
        weights = jnp.sum(jax.nn.one_hot(top_idx, EXPERTS) * top_vals[..., None], axis=1)
        weights = lax.dynamic_slice_in_dim(weights, first, n_local, axis=1)
        h = jax.nn.gelu(jnp.einsum("td,edf->etf", x, w_up))
        y = jnp.einsum("etf,efd->etd", h, w_down)
        return lax.psum(jnp.einsum("te,etd->td", weights, y), "ep")

    return jax.shard_map(expert_shard, in_specs=(P(), P(), P("ep"), P("ep")), out_specs=P())(
        x, w_gate, w_up, w_down)
