"""Mixture-of-experts layers in an einsum-heavy style, with expert parallelism over `ep`.

Experts are bias-free GELU MLPs stacked on a leading expert axis. Tokens arrive sharded over `ep`
as well (the data-parallel layout of the surrounding model).
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

TOKENS, D, F, E, TOP_K, CAPACITY = 16, 8, 16, 4, 2, 3
E_RAGGED = 8


class Experts(NamedTuple):
    router: jax.Array  # [d, e]
    w_in: jax.Array    # [e, d, f]
    w_out: jax.Array   # [e, f, d]


EXPERT_SPECS = Experts(router=P(), w_in=P("ep", None, None), w_out=P("ep", None, None))


def _experts_inputs(n_experts):
    f32 = jnp.float32
    return (Experts(jax.ShapeDtypeStruct((D, n_experts), f32),
                    jax.ShapeDtypeStruct((n_experts, D, F), f32),
                    jax.ShapeDtypeStruct((n_experts, F, D), f32)),
            jax.ShapeDtypeStruct((TOKENS, D), f32))


def _all_experts(p, x):
    """Every expert on every token: [tokens, experts, d]."""
    return jnp.einsum("tef,efd->ted", jax.nn.gelu(jnp.einsum("td,edf->tef", x, p.w_in)), p.w_out)


def topk_moe(p: Experts, x):
    probs = jax.nn.softmax(jnp.einsum("td,de->te", x, p.router), axis=-1)
    top_p, top_i = lax.top_k(probs, TOP_K)
    top_p = top_p / top_p.sum(-1, keepdims=True)
    combine = jnp.einsum("tk,tke->te", top_p, jax.nn.one_hot(top_i, E))
    return jnp.einsum("te,ted->td", combine, _all_experts(p, x))


def topk_moe_inputs():
    return _experts_inputs(E)


def _combine_weights(router, x):
    probs = jax.nn.softmax(x @ router, axis=-1)
    top_p, top_i = lax.top_k(probs, TOP_K)
    top_p = top_p / top_p.sum(-1, keepdims=True)
    return jnp.einsum("tk,tke->te", top_p, jax.nn.one_hot(top_i, router.shape[1]))


def topk_moe_ep(p: Experts, x, mesh):
    """Every rank sees every token (all-gather), runs only its own experts, reduce-scatters back."""

    def local(p, x_shard):
        tokens = lax.all_gather(x_shard, "ep", axis=0, tiled=True)
        n_local = p.w_in.shape[0]
        combine = _combine_weights(p.router, tokens)
        mine = lax.dynamic_slice_in_dim(combine, lax.axis_index("ep") * n_local, n_local, axis=1)
        partial = jnp.einsum("te,ted->td", mine, _all_experts(p, tokens))
        return lax.psum_scatter(partial, "ep", scatter_dimension=0, tiled=True)

    return jax.shard_map(local, mesh=mesh, in_specs=(EXPERT_SPECS, P("ep", None)),
                         out_specs=P("ep", None))(p, x)


def switch_capacity(p: Experts, x):
    """Top-1 routing; each expert takes at most CAPACITY tokens, first come (token order) first
    served; dropped tokens only keep the residual."""
    probs = jax.nn.softmax(x @ p.router, axis=-1)
    expert, gate = jnp.argmax(probs, -1), jnp.max(probs, -1)
    onehot = jax.nn.one_hot(expert, E, dtype=jnp.int32)
    position = jnp.sum(jnp.cumsum(onehot, axis=0) * onehot, axis=-1) - 1
    y = jnp.take_along_axis(_all_experts(p, x), expert[:, None, None], axis=1)[:, 0]
    return x + jnp.where((position < CAPACITY)[:, None], gate[:, None] * y, 0.0)


def switch_capacity_inputs():
    return _experts_inputs(E)


def _rank_within_expert(expert):
    """Position of each token among this shard's tokens routed to the same expert (argsort-based)."""
    order = jnp.argsort(expert, stable=True)
    counts = jnp.bincount(expert, length=E)
    starts = jnp.cumsum(counts) - counts
    sorted_rank = jnp.arange(expert.shape[0]) - starts[expert[order]]
    return jnp.zeros_like(expert).at[order].set(sorted_rank), counts


def _expert_ffn_a2a(p: Experts, x, expert, slot):
    """all_to_all dispatch into [expert, slot] buffers, local experts, all_to_all back, combine."""
    n_local, n_tok = p.w_in.shape[0], x.shape[0]
    send = jnp.zeros((E, n_tok, D), x.dtype).at[expert, slot].set(x)
    recv = lax.all_to_all(send, "ep", split_axis=0, concat_axis=0, tiled=True)
    recv = recv.reshape(-1, n_local, n_tok, D)
    h = jax.nn.gelu(jnp.einsum("setd,edf->setf", recv, p.w_in))
    out = jnp.einsum("setf,efd->setd", h, p.w_out).reshape(-1, n_tok, D)
    back = lax.all_to_all(out, "ep", split_axis=0, concat_axis=0, tiled=True)
    return back[expert, slot]


def switch_capacity_ep(p: Experts, x, mesh):
    def local(p, x_shard):
        probs = jax.nn.softmax(x_shard @ p.router, axis=-1)
        expert, gate = jnp.argmax(probs, -1), jnp.max(probs, -1)
        slot, counts = _rank_within_expert(expert)
        every_rank = lax.all_gather(counts, "ep")
        earlier = jnp.arange(every_rank.shape[0])[:, None] < lax.axis_index("ep")
        position = slot + jnp.where(earlier, every_rank, 0).sum(0)[expert]
        y = _expert_ffn_a2a(p, x_shard, expert, slot)
        return x_shard + jnp.where((position < CAPACITY)[:, None], gate[:, None] * y, 0.0)

    return jax.shard_map(local, mesh=mesh, in_specs=(EXPERT_SPECS, P("ep", None)),
                         out_specs=P("ep", None))(p, x)


def switch_capacity_ep_v2(p: Experts, x, mesh):
    def local(p, x_shard):
        probs = jax.nn.softmax(x_shard @ p.router, axis=-1)
        expert, gate = jnp.argmax(probs, -1), jnp.max(probs, -1)
        slot, counts = _rank_within_expert(expert)
        position = slot
        y = _expert_ffn_a2a(p, x_shard, expert, slot)
        return x_shard + jnp.where((position < CAPACITY)[:, None], gate[:, None] * y, 0.0)

    return jax.shard_map(local, mesh=mesh, in_specs=(EXPERT_SPECS, P("ep", None)),
                         out_specs=P("ep", None))(p, x)


def switch_dropless(p: Experts, x):
    probs = jax.nn.softmax(x @ p.router, axis=-1)
    expert, gate = jnp.argmax(probs, -1), jnp.max(probs, -1)
    y = jnp.take_along_axis(_all_experts(p, x), expert[:, None, None], axis=1)[:, 0]
    return x + gate[:, None] * y


def switch_dropless_inputs():
    return _experts_inputs(E_RAGGED)


def switch_dropless_ragged(p: Experts, x, mesh):
    """Tokens sorted by expert; each rank runs lax.ragged_dot over the contiguous groups of its
    own experts (rolled to the front), then un-sorts and reduce-scatters."""

    def local(p, x_shard):
        tokens = lax.all_gather(x_shard, "ep", axis=0, tiled=True)
        probs = jax.nn.softmax(tokens @ p.router, axis=-1)
        expert, gate = jnp.argmax(probs, -1), jnp.max(probs, -1)
        order = jnp.argsort(expert, stable=True)
        sizes = jnp.bincount(expert, length=E_RAGGED).astype(jnp.int32)
        n_local = p.w_in.shape[0]
        first = lax.axis_index("ep") * n_local
        start = (jnp.cumsum(sizes) - sizes)[first]
        my_sizes = lax.dynamic_slice_in_dim(sizes, first, n_local)
        rows = jnp.roll(tokens[order], -start, axis=0)
        h = jax.nn.gelu(lax.ragged_dot(rows, p.w_in, my_sizes))
        out = jnp.roll(lax.ragged_dot(h, p.w_out, my_sizes), start, axis=0)
        y = jnp.zeros_like(out).at[order].set(out)
        partial = gate[:, None] * y
        return x_shard + lax.psum_scatter(partial, "ep", scatter_dimension=0, tiled=True)

    return jax.shard_map(local, mesh=mesh, in_specs=(EXPERT_SPECS, P("ep", None)),
                         out_specs=P("ep", None))(p, x)
