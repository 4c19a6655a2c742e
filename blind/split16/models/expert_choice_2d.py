"""Expert-choice MoE layer (Zhou et al. 2022): router softmax over 8 experts per token, then each
expert picks its top-C tokens of the sequence (C = T * 2 / E) with `lax.top_k`, runs a ReLU FFN
on them and scatters gate * output back to their positions (one-hot combine).

Mesh {data: 2, expert: 4}: sequences over `data`, 2 experts per device over `expert`.

- `moe_sliced_router`: replicated router, full softmax, each device slices its experts' columns
  with `dynamic_slice_in_dim`, local dispatch/combine by einsum, psum over `expert`;
- `moe_sharded_router`: router columns sharded over `expert`, the softmax normaliser psum'd
  (pmax-stabilised), local experts run with `jax.vmap`.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, F, E = 4, 16, 16, 32, 8
CAP = T * 2 // E
EP = 4
EL = E // EP


def moe_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"router": f(D, E), "w1": f(E, D, F), "w2": f(E, F, D)}, f(B, T, D)


def _choose(probs_e):
    """probs_e [B, T, e] -> gates [B, e, C], one-hot dispatch [B, e, C, T]."""
    gates, idx = lax.top_k(probs_e.transpose(0, 2, 1), CAP)
    return gates, jax.nn.one_hot(idx, T, dtype=probs_e.dtype)


def _experts(w1, w2, x, gates, dispatch):
    xin = jnp.einsum("bect,btd->becd", dispatch, x)
    y = jnp.einsum("becf,efd->becd", jax.nn.relu(jnp.einsum("becd,edf->becf", xin, w1)), w2)
    return jnp.einsum("bect,bec,becd->btd", dispatch, gates, y)


def moe(params, x):
    probs = jax.nn.softmax(x @ params["router"], axis=-1)
    gates, dispatch = _choose(probs)
    return _experts(params["w1"], params["w2"], x, gates, dispatch)


# ---- replicated router, sliced probabilities ---------------------------------------------------------

def _sliced_local(params, x, combine):
    probs = jax.nn.softmax(x @ params["router"], axis=-1)
    mine = lax.dynamic_slice_in_dim(probs, lax.axis_index("expert") * EL, EL, axis=-1)
    gates, dispatch = _choose(mine)
    return combine(_experts(params["w1"], params["w2"], x, gates, dispatch))


def _sliced(combine, params, x, mesh):
    specs = {"router": P(), "w1": P("expert"), "w2": P("expert")}
    return jax.shard_map(lambda p, t: _sliced_local(p, t, combine), mesh=mesh,
                         in_specs=(specs, P("data")), out_specs=P("data"),
                         check_vma=False)(params, x)


def moe_sliced_router(params, x, mesh):
    return _sliced(lambda y: lax.psum(y, "expert"), params, x, mesh)


def moe_sliced_router_no_combine(params, x, mesh):
    return _sliced(lambda y: y, params, x, mesh)


# ---- sharded router, vmap over local experts ---------------------------------------------------------

def _global_softmax(logits):
    m = lax.pmax(lax.stop_gradient(logits.max(-1, keepdims=True)), "expert")
    e = jnp.exp(logits - m)
    return e / lax.psum(e.sum(-1, keepdims=True), "expert")


def _local_softmax(logits):
    m = lax.stop_gradient(logits.max(-1, keepdims=True))
    e = jnp.exp(logits - m)
    return e / e.sum(-1, keepdims=True)


def _one_expert(w1, w2, x, gates, dispatch):
    xin = jnp.einsum("bct,btd->bcd", dispatch, x)
    y = jax.nn.relu(xin @ w1) @ w2
    return jnp.einsum("bct,bc,bcd->btd", dispatch, gates, y)


def _vmapped_local(params, x, softmax):
    probs = softmax(x @ params["router"])
    gates, dispatch = _choose(probs)
    per_expert = jax.vmap(_one_expert, in_axes=(0, 0, None, 1, 1))(
        params["w1"], params["w2"], x, gates, dispatch)
    return lax.psum(per_expert.sum(0), "expert")


def _vmapped(softmax, params, x, mesh):
    specs = {"router": P(None, "expert"), "w1": P("expert"), "w2": P("expert")}
    return jax.shard_map(lambda p, t: _vmapped_local(p, t, softmax), mesh=mesh,
                         in_specs=(specs, P("data")), out_specs=P("data"),
                         check_vma=False)(params, x)


def moe_sharded_router(params, x, mesh):
    return _vmapped(_global_softmax, params, x, mesh)


def moe_sharded_router_local_softmax(params, x, mesh):
    return _vmapped(_local_softmax, params, x, mesh)
