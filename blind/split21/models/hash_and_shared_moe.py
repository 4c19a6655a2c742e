"""Two mixture-of-experts layers with experts sharded over an expert-parallel axis and tokens
replicated inside an ep group, each rank running its own experts on a masked dense batch:

- hash routing (Hash Layers): a token's expert is a fixed hash of its token id, no router;
  `hash_moe_dp_ep` on {dp: 2, ep: 2} (tokens over dp, two experts per ep rank);
- Qwen2-MoE style: softmax router, top-2 of 4 routed experts (weights not renormalised) plus an
  always-on shared expert gated by a sigmoid; `qwen_moe_ep` on {ep: 4}.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, F, E, K = 4, 8, 16, 32, 4, 2


def hash_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(E, D, F), f(E, F, D), f(B, T, D), jax.ShapeDtypeStruct((B, T), jnp.int32)


def qwen_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(D, E), f(E, D, F), f(E, F, D), f(D, F), f(F, D), f(D), f(B, T, D)


def _expert(x, w1, w2):
    return jax.nn.silu(x @ w1) @ w2


def _hash(ids):
    return (ids * 31 + 7) % E


def hash_moe(w1, w2, x, ids):
    every = jax.vmap(lambda a, b: _expert(x, a, b))(w1, w2)          # [E, B, T, D]
    onehot = jax.nn.one_hot(_hash(ids), E, dtype=x.dtype)             # [B, T, E]
    return x + jnp.einsum("ebtd,bte->btd", every, onehot)


def _local_ids(el):
    return lax.axis_index("ep") * el + jnp.arange(el)


def _local_ids_no_stride(el):
    return lax.axis_index("ep") + jnp.arange(el)


def _hash_local(w1, w2, x, ids, local_ids):
    mine = local_ids(w1.shape[0])
    y = jnp.zeros_like(x)
    for j in range(w1.shape[0]):
        sel = (_hash(ids) == mine[j]).astype(x.dtype)[..., None]
        y = y + sel * _expert(x, w1[j], w2[j])
    return x + lax.psum(y, "ep")


def _run_hash(w1, w2, x, ids, mesh, local_ids):
    local = lambda *a: _hash_local(*a, local_ids)
    return jax.shard_map(local, mesh=mesh, check_vma=False, in_specs=(P("ep"), P("ep"), P("dp"), P("dp")),
                         out_specs=P("dp"))(w1, w2, x, ids)


def hash_moe_dp_ep(w1, w2, x, ids, mesh):
    return _run_hash(w1, w2, x, ids, mesh, _local_ids)


def hash_moe_dp_ep_no_stride(w1, w2, x, ids, mesh):
    return _run_hash(w1, w2, x, ids, mesh, _local_ids_no_stride)


def _route(router, x):
    probs = jax.nn.softmax(x @ router, -1)
    top_p, top_i = lax.top_k(probs, K)
    return jnp.sum(jax.nn.one_hot(top_i, E, dtype=x.dtype) * top_p[..., None], -2)   # [B, T, E]


def qwen_moe(router, w1, w2, ws1, ws2, w_gate, x):
    combine = _route(router, x)
    every = jax.vmap(lambda a, b: _expert(x, a, b))(w1, w2)
    routed = jnp.einsum("ebtd,bte->btd", every, combine)
    shared = jax.nn.sigmoid(x @ w_gate)[..., None] * _expert(x, ws1, ws2)
    return routed + shared


def _qwen_local(router, w1, w2, ws1, ws2, w_gate, x):
    combine = _route(router, x)
    e = lax.axis_index("ep")
    routed = combine[..., e][..., None] * _expert(x, w1[0], w2[0])
    shared = jax.nn.sigmoid(x @ w_gate)[..., None] * _expert(x, ws1, ws2)
    return lax.psum(routed, "ep") + shared


def _qwen_local_shared_in_psum(router, w1, w2, ws1, ws2, w_gate, x):
    combine = _route(router, x)
    e = lax.axis_index("ep")
    routed = combine[..., e][..., None] * _expert(x, w1[0], w2[0])
    shared = jax.nn.sigmoid(x @ w_gate)[..., None] * _expert(x, ws1, ws2)
    return lax.psum(routed + shared, "ep")


def _run_qwen(args, mesh, local):
    specs = (P(), P("ep"), P("ep"), P(), P(), P(), P())
    return jax.shard_map(local, mesh=mesh, check_vma=False, in_specs=specs, out_specs=P())(*args)


def qwen_moe_ep(router, w1, w2, ws1, ws2, w_gate, x, mesh):
    return _run_qwen((router, w1, w2, ws1, ws2, w_gate, x), mesh, _qwen_local)


def qwen_moe_ep_shared_in_psum(router, w1, w2, ws1, ws2, w_gate, x, mesh):
    return _run_qwen((router, w1, w2, ws1, ws2, w_gate, x), mesh, _qwen_local_shared_in_psum)
