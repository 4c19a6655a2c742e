"""Token-choice MoE layers written with sort + segment_sum dispatch and with a load-balancing loss.

Top-2 (Mixtral-like, weights renormalised over the two picks): `top2_ep_segments`: shard_map on
{ep: 4}, tokens replicated, experts over ep; the (token, choice) pairs are sorted by expert id
(argsort), each rank runs the pairs of its own experts and scatters them back to their tokens with
jax.ops.segment_sum; psum over ep.

Top-1 Switch layer returning (y, aux) with aux = E * sum_e f_e * P_e (f_e the fraction of tokens
routed to e via bincount, P_e the mean router probability): `switch_aux_dp`: shard_map on {dp: 4},
tokens over dp, experts replicated, f and P pmean'd before their product.
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, D, F, E, K = 32, 16, 32, 8, 2
NE = 4
EL = E // NE


def top2_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"wr": f(D, E), "w1": f(E, D, F), "w2": f(E, F, D)}, f(N, D)


def _expert(w1, w2, x):
    return jax.nn.silu(x @ w1 / math.sqrt(D)) @ w2 / math.sqrt(F)


def _route(p, x):
    probs = jax.nn.softmax(x @ p["wr"] / math.sqrt(D), -1)
    vals, idx = lax.top_k(probs, K)
    return vals / jnp.sum(vals, -1, keepdims=True), idx


def top2(p, x):
    vals, idx = _route(p, x)
    ys = jnp.stack([_expert(p["w1"][e], p["w2"][e], x) for e in range(E)], 1)
    picked = jnp.take_along_axis(ys, idx[..., None], 1)
    return jnp.sum(vals[..., None] * picked, 1)


def _top2_local(p, x, sort_weights):
    vals, idx = _route(p, x)
    expert, weight = idx.reshape(-1), vals.reshape(-1)
    token = jnp.repeat(jnp.arange(N), K)
    order = jnp.argsort(expert)
    expert, token = expert[order], token[order]
    weight = weight[order] if sort_weights else weight
    local = expert - lax.axis_index("ep") * EL
    mine = (local >= 0) & (local < EL)
    li = jnp.clip(local, 0, EL - 1)
    h = jax.nn.silu(jnp.einsum("nd,ndf->nf", x[token], p["w1"][li]) / math.sqrt(D))
    y = jnp.einsum("nf,nfd->nd", h, p["w2"][li]) / math.sqrt(F)
    y = jnp.where(mine[:, None], weight[:, None] * y, 0.0)
    return lax.psum(jax.ops.segment_sum(y, token, num_segments=N), "ep")


def _top2_run(sort_weights, p, x, mesh):
    specs = {"wr": P(), "w1": P("ep"), "w2": P("ep")}
    return jax.shard_map(lambda p, x: _top2_local(p, x, sort_weights), mesh=mesh, in_specs=(specs, P()),
                         out_specs=P(), check_vma=False)(p, x)


def top2_ep_segments(p, x, mesh):
    return _top2_run(True, p, x, mesh)


def top2_ep_segments_weights_unsorted(p, x, mesh):
    return _top2_run(False, p, x, mesh)


def switch_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"wr": f(D, E), "w1": f(E, D, F), "w2": f(E, F, D)}, f(N, D)


def _switch_parts(p, x):
    probs = jax.nn.softmax(x @ p["wr"] / math.sqrt(D), -1)
    idx = jnp.argmax(probs, -1)
    ys = jnp.stack([_expert(p["w1"][e], p["w2"][e], x) for e in range(E)], 1)
    y = jnp.take_along_axis(probs, idx[:, None], 1) * jnp.take_along_axis(ys, idx[:, None, None], 1)[:, 0]
    frac = jnp.bincount(idx, length=E) / x.shape[0]
    return y, frac, jnp.mean(probs, 0)


def switch(p, x):
    y, frac, mean_p = _switch_parts(p, x)
    return y, E * jnp.sum(frac * mean_p)


def _switch_local(p, x):
    y, frac, mean_p = _switch_parts(p, x)
    return y, E * jnp.sum(lax.pmean(frac, "dp") * lax.pmean(mean_p, "dp"))


def _switch_local_product_averaged(p, x):
    y, frac, mean_p = _switch_parts(p, x)
    return y, lax.pmean(E * jnp.sum(frac * mean_p), "dp")


def _switch_run(fn, p, x, mesh):
    return jax.shard_map(fn, mesh=mesh, in_specs=(P(), P("dp")), out_specs=(P("dp"), P()),
                         check_vma=False)(p, x)


def switch_aux_dp(p, x, mesh):
    return _switch_run(_switch_local, p, x, mesh)


def switch_aux_dp_product_averaged(p, x, mesh):
    return _switch_run(_switch_local_product_averaged, p, x, mesh)
