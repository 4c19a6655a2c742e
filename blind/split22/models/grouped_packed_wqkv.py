"""GQA with an InternLM2-style packed kernel wqkv[D, KV, G + 2, HD]: for every kv group, its G query
heads, then its key head, then its value head. Causal attention, out kernel wo[KV, G, HD, D].

- `gqa_groups_tp`: shard_map on {tp: 4}; the packed kernel and wo split over kv groups, psum after wo;
- `gqa_flat_jit`: the kernel viewed as one flat [D, KV*(G+2)*HD] matrix, one matmul, the activations
  reshaped back to groups and constrained over tp under jit on {dp: 2, tp: 2}.
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

B, T, D, KV, G, HD = 2, 8, 32, 4, 2, 8


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"wqkv": f(D, KV, G + 2, HD), "wo": f(KV, G, HD, D)}, f(B, T, D)


def _attend(qkv, wo):
    q, k, v = qkv[..., :G, :], qkv[..., G, :], qkv[..., G + 1, :]
    s = jnp.einsum("btcgh,bsch->bcgts", q, k) / math.sqrt(HD)
    s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -jnp.inf)
    o = jnp.einsum("bcgts,bsch->btcgh", jax.nn.softmax(s, axis=-1), v)
    return jnp.einsum("btcgh,cghd->btd", o, wo)


def gqa(p, x):
    return _attend(jnp.einsum("btd,dcgh->btcgh", x, p["wqkv"]), p["wo"])


def _local(p, x):
    return lax.psum(gqa(p, x), "tp")


def _specs():
    return {"wqkv": P(None, "tp"), "wo": P("tp")}


def gqa_groups_tp(p, x, mesh):
    return jax.shard_map(_local, mesh=mesh, in_specs=(_specs(), P()), out_specs=P(), check_vma=False)(p, x)


def _local_query_slice_shifted(p, x):
    qkv = jnp.einsum("btd,dcgh->btcgh", x, p["wqkv"])
    q, k, v = qkv[..., 1:G + 1, :], qkv[..., G, :], qkv[..., G + 1, :]
    s = jnp.einsum("btcgh,bsch->bcgts", q, k) / math.sqrt(HD)
    s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -jnp.inf)
    o = jnp.einsum("bcgts,bsch->btcgh", jax.nn.softmax(s, axis=-1), v)
    return lax.psum(jnp.einsum("btcgh,cghd->btd", o, p["wo"]), "tp")


def gqa_groups_tp_query_slice_shifted(p, x, mesh):
    return jax.shard_map(_local_query_slice_shifted, mesh=mesh, in_specs=(_specs(), P()), out_specs=P(),
                         check_vma=False)(p, x)


def _flat(p, x, mesh, group_major):
    c = lambda a, *s: lax.with_sharding_constraint(a, NamedSharding(mesh, P(*s)))
    x = c(x, "dp")
    flat = c(x @ p["wqkv"].reshape(D, KV * (G + 2) * HD), "dp", None, "tp")
    if group_major:
        qkv = flat.reshape(B, T, KV, G + 2, HD)
    else:
        qkv = flat.reshape(B, T, G + 2, KV, HD).swapaxes(2, 3)
    qkv = c(qkv, "dp", None, "tp")
    return c(_attend(qkv, c(p["wo"], "tp")), "dp")


def gqa_flat_jit(p, x, mesh):
    return _flat(p, x, mesh, group_major=True)


def gqa_flat_jit_slot_major(p, x, mesh):
    return _flat(p, x, mesh, group_major=False)
