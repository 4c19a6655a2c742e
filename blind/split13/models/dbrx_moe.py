"""DBRX-style mixture of experts: softmax router over 8 experts, top-2 with the chosen weights
renormalised to sum to one, SwiGLU experts with [E, D, F] / [E, F, D] kernels. The reference
gathers each token's expert kernels (`w1[idx]`) and loops over the k choices.

Expert parallel on {ep: 4} (2 experts per device):
- `moe_ep_dense`: tokens replicated; every device routes all tokens, builds the dense [T, E]
  combine matrix, keeps its experts' columns (`lax.dynamic_slice_in_dim` at the expert offset),
  runs its experts on every token and the outputs are `psum`-reduced;
- `moe_ep_gather_scatter`: tokens sharded over ep; they are all-gathered, routed and run through
  the local experts, and the per-token sums come back with `psum_scatter(..., tiled=True)`.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

T, D, F, E, K = 16, 16, 32, 8, 2
AXIS = "ep"
N_EP = 4
E_LOCAL = E // N_EP


def moe_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"router": f(D, E), "w1": f(E, D, F), "v1": f(E, D, F), "w2": f(E, F, D)}, f(T, D)


def route(x, router, renormalize=True):
    probs = jax.nn.softmax(x @ router, axis=-1)
    weights, idx = lax.top_k(probs, K)
    if renormalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights, idx


def moe(p, x):
    weights, idx = route(x, p["router"])
    out = jnp.zeros_like(x)
    for j in range(K):
        e = idx[:, j]
        h = jax.nn.silu(jnp.einsum("td,tdf->tf", x, p["w1"][e])) * jnp.einsum("td,tdf->tf", x, p["v1"][e])
        out = out + weights[:, j:j + 1] * jnp.einsum("tf,tfd->td", h, p["w2"][e])
    return out


def _combine(weights, idx):
    return jnp.sum(jax.nn.one_hot(idx, E) * weights[..., None], axis=1)


def _local_experts(p, x, combine_local):
    h = jax.nn.silu(jnp.einsum("td,edf->etf", x, p["w1"])) * jnp.einsum("td,edf->etf", x, p["v1"])
    y = jnp.einsum("etf,efd->etd", h, p["w2"])
    return jnp.einsum("te,etd->td", combine_local, y)


EXPERT_SPECS = {"router": P(), "w1": P(AXIS), "v1": P(AXIS), "w2": P(AXIS)}


# ---- dense combine, tokens replicated ------------------------------------------------------------

def _dense_local(offset_of):
    def local(p, x):
        combine = _combine(*route(x, p["router"]))
        mine = lax.dynamic_slice_in_dim(combine, offset_of(lax.axis_index(AXIS)), E_LOCAL, axis=1)
        return lax.psum(_local_experts(p, x, mine), AXIS)
    return local


def _dense(offset_of, p, x, mesh):
    return jax.shard_map(_dense_local(offset_of), mesh=mesh, in_specs=(EXPERT_SPECS, P()),
                         out_specs=P())(p, x)


def moe_ep_dense(p, x, mesh):
    return _dense(lambda i: i * E_LOCAL, p, x, mesh)


def moe_ep_dense_offset(p, x, mesh):
    return _dense(lambda i: i, p, x, mesh)


# ---- tokens sharded: all_gather in, psum_scatter out --------------------------------------------

def _gather_scatter_local(renormalize):
    def local(p, x_local):
        x = lax.all_gather(x_local, AXIS, axis=0, tiled=True)
        combine = _combine(*route(x, p["router"], renormalize=renormalize))
        mine = lax.dynamic_slice_in_dim(combine, lax.axis_index(AXIS) * E_LOCAL, E_LOCAL, axis=1)
        return lax.psum_scatter(_local_experts(p, x, mine), AXIS, scatter_dimension=0, tiled=True)
    return local


def moe_ep_gather_scatter(p, x, mesh):
    return jax.shard_map(_gather_scatter_local(True), mesh=mesh,
                         in_specs=(EXPERT_SPECS, P(AXIS)), out_specs=P(AXIS))(p, x)


def moe_ep_gather_scatter_unnormalized(p, x, mesh):
    return jax.shard_map(_gather_scatter_local(False), mesh=mesh,
                         in_specs=(EXPERT_SPECS, P(AXIS)), out_specs=P(AXIS))(p, x)
