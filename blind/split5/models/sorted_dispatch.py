"""Top-1 MoE that sorts tokens by expert (argsort dispatch) and un-sorts the results.

The expert-parallel version replicates tokens, runs only the sorted tokens that belong to its
own experts (others masked), all-reduces, and un-sorts.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, DIM, HID, NE = 12, 8, 8, 4


def moe_args():
    return (jax.ShapeDtypeStruct((N, DIM), jnp.float32),
            jax.ShapeDtypeStruct((DIM, NE), jnp.float32),
            jax.ShapeDtypeStruct((NE, DIM, HID), jnp.float32),
            jax.ShapeDtypeStruct((NE, HID, DIM), jnp.float32))


def sorted_moe(x, router, w_in, w_out):
    logits = x @ router
    choice = jnp.argmax(logits, axis=-1)
    score = jax.nn.sigmoid(jnp.max(logits, axis=-1))
    order = jnp.argsort(choice, stable=True)
    xs, es = x[order], choice[order]
    hs = jax.nn.silu(jnp.einsum("nd,ndh->nh", xs, w_in[es]))
    ys = jnp.einsum("nh,nhd->nd", hs, w_out[es])
    y = jnp.zeros_like(x).at[order].set(ys)
    return y * score[:, None]


def sorted_moe_ep(x, router, w_in, w_out):
    def shard(x, router, w_in, w_out):
        n_local = w_in.shape[0]
        lo = lax.axis_index("ep") * n_local
        logits = x @ router
        choice = jnp.argmax(logits, axis=-1)
        score = jax.nn.sigmoid(jnp.max(logits, axis=-1))
        order = jnp.argsort(choice, stable=True)
        xs, es = x[order], choice[order]
        mine = (es >= lo) & (es < lo + n_local)
        local_e = jnp.clip(es - lo, 0, n_local - 1)
        hs = jax.nn.silu(jnp.einsum("nd,ndh->nh", xs, w_in[local_e]))
        ys = jnp.einsum("nh,nhd->nd", hs, w_out[local_e])
        ys = lax.psum(jnp.where(mine[:, None], ys, 0.0), "ep")
        inverse = jnp.argsort(order)
        return ys[inverse] * score[:, None]

    return jax.shard_map(shard, in_specs=(P(), P(), P("ep"), P("ep")), out_specs=P())(
        x, router, w_in, w_out)
