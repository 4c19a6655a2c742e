"""Arctic-style hybrid MoE layer: a dense residual SwiGLU MLP in parallel with a top-2 routed MoE of
8 small GELU experts (router softmax taken over the two selected logits), both added to the
residual stream. Tokens are [T, D] (flattened batch x sequence).

Expert parallel over {ep: 4}, two experts per device, every device sees every token (broadcast
dispatch with dense combine weights) and the routed partial outputs are psum-reduced; the dense
MLP is replicated.
- `arctic_ep_vmap`: dense combine weights [T, E] built from `lax.top_k` + one-hot, the device's
  two columns cut with `dynamic_slice_in_dim`, the local experts run by `jax.vmap`;
- `arctic_ep_loop`: a Python loop over the local experts, the global expert id
  `axis_index * E_LOCAL + j` compared with the top-k indices to build each expert's gate.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

T, D, E, K, FE, FD = 16, 16, 8, 2, 32, 32
EP = 4
E_LOCAL = E // EP


def arctic_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"router": f(D, E),
              "experts": {"w_in": f(E, D, FE), "w_out": f(E, FE, D)},
              "dense": {"gate": f(D, FD), "up": f(D, FD), "down": f(FD, D)}}
    return params, f(T, D)


def dense_mlp(p, x):
    return (jax.nn.silu(x @ p["gate"]) * (x @ p["up"])) @ p["down"]


def expert(w_in, w_out, x):
    return jax.nn.gelu(x @ w_in) @ w_out


def route(router, x):
    vals, idx = lax.top_k(x @ router, K)
    return jax.nn.softmax(vals, axis=-1), idx


def route_softmax_first(router, x):
    vals, idx = lax.top_k(jax.nn.softmax(x @ router, axis=-1), K)
    return vals, idx


def combine_weights(gates, idx):
    return jnp.sum(jax.nn.one_hot(idx, E, dtype=gates.dtype) * gates[..., None], axis=1)


def arctic(params, x):
    w = combine_weights(*route(params["router"], x))
    outs = jax.vmap(expert, in_axes=(0, 0, None))(params["experts"]["w_in"],
                                                   params["experts"]["w_out"], x)
    return x + dense_mlp(params["dense"], x) + jnp.einsum("te,etd->td", w, outs)


SPECS = ({"router": P(), "experts": {"w_in": P("ep"), "w_out": P("ep")},
          "dense": {"gate": P(), "up": P(), "down": P()}}, P())


# ---- vmap over local experts --------------------------------------------------------------------

def _routed_vmap(p, x):
    w = combine_weights(*route(p["router"], x))
    w = lax.dynamic_slice_in_dim(w, lax.axis_index("ep") * E_LOCAL, E_LOCAL, axis=1)
    outs = jax.vmap(expert, in_axes=(0, 0, None))(p["experts"]["w_in"], p["experts"]["w_out"], x)
    return jnp.einsum("te,etd->td", w, outs)


def _vmap_local(p, x):
    return x + dense_mlp(p["dense"], x) + lax.psum(_routed_vmap(p, x), "ep")


def _vmap_local_dense_inside(p, x):
    return x + lax.psum(dense_mlp(p["dense"], x) + _routed_vmap(p, x), "ep")


def arctic_ep_vmap(params, x, mesh):
    return jax.shard_map(_vmap_local, mesh=mesh, in_specs=SPECS, out_specs=P())(params, x)


def arctic_ep_vmap_dense_in_psum(params, x, mesh):
    return jax.shard_map(_vmap_local_dense_inside, mesh=mesh, in_specs=SPECS,
                         out_specs=P())(params, x)


# ---- loop over local experts with global ids ----------------------------------------------------

def _loop_local(router_fn):
    def local(p, x):
        gates, idx = router_fn(p["router"], x)
        routed = jnp.zeros_like(x)
        for j in range(E_LOCAL):
            eid = lax.axis_index("ep") * E_LOCAL + j
            gate = jnp.sum(jnp.where(idx == eid, gates, 0.0), axis=-1, keepdims=True)
            routed = routed + gate * expert(p["experts"]["w_in"][j], p["experts"]["w_out"][j], x)
        return x + dense_mlp(p["dense"], x) + lax.psum(routed, "ep")
    return local


def arctic_ep_loop(params, x, mesh):
    return jax.shard_map(_loop_local(route), mesh=mesh, in_specs=SPECS, out_specs=P())(params, x)


def arctic_ep_loop_softmax_first(params, x, mesh):
    return jax.shard_map(_loop_local(route_softmax_first), mesh=mesh, in_specs=SPECS,
                         out_specs=P())(params, x)
