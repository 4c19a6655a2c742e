"""Grouped-query attention with biases (Qwen-style), einsums written with `...` ellipses. Queries
have their own [D, H, HD] kernel; keys and values share one T5X-style `kv` kernel [D, 2, KV, HD]
(k at index 0, v at index 1). 8 query heads, 2 KV heads, causal.

Tensor parallel on {heads: 8} (one query head per device, four devices per KV head):
- `gqa_tp_pick_group`: query kernel sharded by in_specs; the kv kernel enters replicated and every
  device picks its KV head with `lax.dynamic_index_in_dim` at its group index;
- `gqa_tp_expanded_kv`: the kv kernel and bias are expanded outside the shard_map to one KV head
  per device (`jnp.repeat` along the head axis) and sharded by in_specs.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H, KV, HD = 2, 8, 32, 8, 2, 8
AXIS = "heads"
N_DEV = 8


def gqa_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"q": {"kernel": f(D, H, HD), "bias": f(H, HD)},
              "kv": {"kernel": f(D, 2, KV, HD), "bias": f(2, KV, HD)},
              "o": {"kernel": f(H, HD, D)}}
    return params, f(B, S, D)


def _project_q(x, p):
    return jnp.einsum("...sd,dhk->...shk", x, p["kernel"]) + p["bias"]


def _project_kv(x, p):
    kv = jnp.einsum("...sd,dcgk->c...sgk", x, p["kernel"]) + p["bias"][:, None, None]
    return kv[0], kv[1]


def _attend(q, k, v):
    """q [..., S, Hq, HD]; k, v [..., S, Hk, HD] with Hq a multiple of Hk."""
    rep = q.shape[-2] // k.shape[-2]
    k = jnp.repeat(k, rep, axis=-2)
    v = jnp.repeat(v, rep, axis=-2)
    logits = jnp.einsum("...qhd,...khd->...hqk", q, k) * (HD ** -0.5)
    logits = jnp.where(jnp.tril(jnp.ones((S, S), bool)), logits, -1e30)
    return jnp.einsum("...hqk,...khd->...qhd", jax.nn.softmax(logits, axis=-1), v)


def _out(o, kernel):
    return jnp.einsum("...shk,hkd->...sd", o, kernel)


def gqa(params, x):
    q = _project_q(x, params["q"])
    k, v = _project_kv(x, params["kv"])
    return _out(_attend(q, k, v), params["o"]["kernel"])


# ---- replicated kv kernel, each device picks its group ------------------------------------------

Q_SPECS = {"kernel": P(None, AXIS), "bias": P(AXIS)}


def _local_pick(group_of):
    def local(params, x):
        g = group_of(lax.axis_index(AXIS))
        kv_p = {"kernel": lax.dynamic_index_in_dim(params["kv"]["kernel"], g, axis=2),
                "bias": lax.dynamic_index_in_dim(params["kv"]["bias"], g, axis=1)}
        q = _project_q(x, params["q"])
        k, v = _project_kv(x, kv_p)
        return lax.psum(_out(_attend(q, k, v), params["o"]["kernel"]), AXIS)
    return local


def _pick(group_of, params, x, mesh):
    specs = {"q": Q_SPECS, "kv": {"kernel": P(), "bias": P()}, "o": {"kernel": P(AXIS)}}
    return jax.shard_map(_local_pick(group_of), mesh=mesh, in_specs=(specs, P()),
                         out_specs=P())(params, x)


def gqa_tp_pick_group(params, x, mesh):
    return _pick(lambda i: i // (N_DEV // KV), params, x, mesh)


def gqa_tp_pick_group_count(params, x, mesh):
    return _pick(lambda i: i // KV, params, x, mesh)


# ---- kv kernel expanded to one KV head per device -----------------------------------------------

def _expand_kv(p, expand):
    return {"kernel": expand(p["kernel"], axis=2), "bias": expand(p["bias"], axis=1)}


def _local_expanded(params, x):
    q = _project_q(x, params["q"])
    k, v = _project_kv(x, params["kv"])
    return lax.psum(_out(_attend(q, k, v), params["o"]["kernel"]), AXIS)


def _expanded(expand, params, x, mesh):
    params = dict(params, kv=_expand_kv(params["kv"], expand))
    specs = {"q": Q_SPECS, "kv": {"kernel": P(None, None, AXIS), "bias": P(None, AXIS)},
             "o": {"kernel": P(AXIS)}}
    return jax.shard_map(_local_expanded, mesh=mesh, in_specs=(specs, P()),
                         out_specs=P())(params, x)


def gqa_tp_expanded_kv(params, x, mesh):
    return _expanded(lambda a, axis: jnp.repeat(a, N_DEV // KV, axis=axis), params, x, mesh)


def gqa_tp_expanded_kv_tiled(params, x, mesh):
    return _expanded(lambda a, axis: jnp.concatenate([a] * (N_DEV // KV), axis=axis), params, x, mesh)
