"""DeepSeek-V2-style device-limited MoE routing: softmax router over E experts in NG groups, keep the
TG groups with the largest best-expert probability, then the top-K experts among the kept groups;
the gate is the (unrenormalised) router probability times ROUTE_SCALE. Experts are ReLU MLPs.

- `moe_ep`: shard_map on {ep: 4}; tokens replicated, experts split over ep, each rank routes every
  token, cuts its own columns of the dense gate matrix at axis_index * EL and psums the outputs;
- `moe_dp_ep`: on {dp: 2, ep: 2}; tokens over dp, experts and router columns over ep, router logits
  all_gathered over ep before the softmax.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, D, F, E, NG, TG, K = 16, 16, 32, 8, 4, 2, 2
ROUTE_SCALE = 2.5


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"router": f(D, E), "w1": f(E, D, F), "w2": f(E, F, D)}, f(N, D)


def _dense_gates(probs):
    n = probs.shape[0]
    group_score = probs.reshape(n, NG, E // NG).max(-1)
    _, top_groups = lax.top_k(group_score, TG)
    group_keep = jnp.zeros((n, NG), bool).at[jnp.arange(n)[:, None], top_groups].set(True)
    masked = jnp.where(jnp.repeat(group_keep, E // NG, axis=1), probs, 0.0)
    w, idx = lax.top_k(masked, K)
    return jnp.zeros((n, E)).at[jnp.arange(n)[:, None], idx].set(w * ROUTE_SCALE)


def _experts(x, w1, w2):
    return jnp.einsum("nef,efd->ned", jax.nn.relu(jnp.einsum("nd,edf->nef", x, w1)), w2)


def moe(p, x):
    chosen, idx = lax.top_k(_dense_gates(jax.nn.softmax(x @ p["router"], axis=-1)), K)
    h = jax.nn.relu(jnp.einsum("nd,nkdf->nkf", x, p["w1"][idx]))
    y = jnp.einsum("nkf,nkfd->nkd", h, p["w2"][idx])
    return jnp.einsum("nk,nkd->nd", chosen, y)


EL4 = E // 4


def _local_ep(p, x):
    gates = _dense_gates(jax.nn.softmax(x @ p["router"], axis=-1))
    mine = lax.dynamic_slice_in_dim(gates, lax.axis_index("ep") * EL4, EL4, axis=1)
    return lax.psum(jnp.einsum("ne,ned->nd", mine, _experts(x, p["w1"], p["w2"])), "ep")


def _local_ep_offset_unscaled(p, x):
    gates = _dense_gates(jax.nn.softmax(x @ p["router"], axis=-1))
    mine = lax.dynamic_slice_in_dim(gates, lax.axis_index("ep"), EL4, axis=1)
    return lax.psum(jnp.einsum("ne,ned->nd", mine, _experts(x, p["w1"], p["w2"])), "ep")


def _ep(fn, p, x, mesh):
    specs = {"router": P(), "w1": P("ep"), "w2": P("ep")}
    return jax.shard_map(fn, mesh=mesh, in_specs=(specs, P()), out_specs=P(), check_vma=False)(p, x)


def moe_ep(p, x, mesh):
    return _ep(_local_ep, p, x, mesh)


def moe_ep_offset_unscaled(p, x, mesh):
    return _ep(_local_ep_offset_unscaled, p, x, mesh)


EL2 = E // 2


def _local_dp_ep(p, x):
    logits = lax.all_gather(x @ p["router"], "ep", axis=1, tiled=True)
    gates = _dense_gates(jax.nn.softmax(logits, axis=-1))
    mine = lax.dynamic_slice_in_dim(gates, lax.axis_index("ep") * EL2, EL2, axis=1)
    return lax.psum(jnp.einsum("ne,ned->nd", mine, _experts(x, p["w1"], p["w2"])), "ep")


def _local_dp_ep_local_softmax(p, x):
    probs = lax.all_gather(jax.nn.softmax(x @ p["router"], axis=-1), "ep", axis=1, tiled=True)
    gates = _dense_gates(probs)
    mine = lax.dynamic_slice_in_dim(gates, lax.axis_index("ep") * EL2, EL2, axis=1)
    return lax.psum(jnp.einsum("ne,ned->nd", mine, _experts(x, p["w1"], p["w2"])), "ep")


def _dp_ep(fn, p, x, mesh):
    specs = {"router": P(None, "ep"), "w1": P("ep"), "w2": P("ep")}
    return jax.shard_map(fn, mesh=mesh, in_specs=(specs, P("dp")), out_specs=P("dp"), check_vma=False)(p, x)


def moe_dp_ep(p, x, mesh):
    return _dp_ep(_local_dp_ep, p, x, mesh)


def moe_dp_ep_local_softmax(p, x, mesh):
    return _dp_ep(_local_dp_ep_local_softmax, p, x, mesh)
