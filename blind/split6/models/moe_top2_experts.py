"""Top-2 mixture of experts computed densely; expert parallel version keeps all tokens on every
device (broadcast), runs its local experts and sums the gated outputs across devices."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

TOKENS, DIM, HIDDEN, EXPERTS, TOP_K, EP = 10, 8, 12, 8, 2, 4


def combine_weights(x, router):
    logits = x @ router                                     # [T, E]
    top_vals, top_idx = lax.top_k(logits, TOP_K)
    top_w = jax.nn.softmax(top_vals, axis=-1)               # renormalised over the chosen two
    return jnp.einsum("tk,tke->te", top_w, jax.nn.one_hot(top_idx, EXPERTS, dtype=x.dtype))


def experts_ffn(x, w_up, w_down):
    """x [T,D]; w_up [E,D,H]; w_down [E,H,D] -> per-expert outputs [E,T,D]."""
    return jnp.einsum("eth,ehd->etd", jax.nn.gelu(jnp.einsum("td,edh->eth", x, w_up)), w_down)


def moe(x, router, w_up, w_down):
    gates = combine_weights(x, router)
    return jnp.einsum("te,etd->td", gates, experts_ffn(x, w_up, w_down))


def moe_ep(x, router, w_up, w_down):
    local_e = EXPERTS // EP

    def local(x, router, w_up_l, w_down_l):
        gates = combine_weights(x, router)
        start = lax.axis_index("expert") * local_e
        mine = lax.dynamic_slice_in_dim(gates, start, local_e, axis=1)
        y = jnp.einsum("te,etd->td", mine, experts_ffn(x, w_up_l, w_down_l))
        return lax.psum(y, "expert")

    return jax.shard_map(local, in_specs=(P(), P(), P("expert"), P("expert")), out_specs=P(),
                         check_vma=False)(x, router, w_up, w_down)


def moe_ep_gate_columns(x, router, w_up, w_down):
    local_e = EXPERTS // EP

    def local(x, router, w_up_l, w_down_l):
        gates = combine_weights(x, router)
        start = lax.axis_index("expert")
        mine = lax.dynamic_slice_in_dim(gates, start, local_e, axis=1)
        y = jnp.einsum("te,etd->td", mine, experts_ffn(x, w_up_l, w_down_l))
        return lax.psum(y, "expert")

    return jax.shard_map(local, in_specs=(P(), P(), P("expert"), P("expert")), out_specs=P(),
                         check_vma=False)(x, router, w_up, w_down)


def shapes():
    s, f = jax.ShapeDtypeStruct, jnp.float32
    return (s((TOKENS, DIM), f), s((DIM, EXPERTS), f), s((EXPERTS, DIM, HIDDEN), f),
            s((EXPERTS, HIDDEN, DIM), f))
