"""Where a device's part is chosen: an index, an offset or a table window set on one line and used on
another. Each buggy function has ONE defect on the line marked with a BUG comment
(configs/localize.yaml, bench/localization.py); the finding must lead there, not where the part is
used."""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

T, D, NQ, NKV, HD, E, S = 6, 8, 4, 2, 4, 8, 8
TABLE = np.sin(np.arange(32)[:, None] * np.arange(1, D + 1)[None, :] / 7.0).astype(np.float32)


def grouped_inputs():
    return (
        jax.ShapeDtypeStruct((T, D), jnp.float32),
        jax.ShapeDtypeStruct((D, NQ, HD), jnp.float32),
        jax.ShapeDtypeStruct((D, NKV, HD), jnp.float32),
    )


def grouped_scores(x, wq, wk):
    q = jnp.einsum("td,dhe->the", x, wq)
    k = jnp.repeat(jnp.einsum("td,dge->tge", x, wk), NQ // NKV, axis=1)
    return jnp.einsum("the,she->hts", q, k)


def grouped_scores_round_robin(x, wq, wk):
    def body(x, wq, wk):
        grp = lax.axis_index("tp") % NKV  # BUG: query head h reads KV group h // (NQ // NKV)
        q = jnp.einsum("td,dhe->the", x, wq)
        k = x @ lax.dynamic_index_in_dim(wk, grp, 1, keepdims=False)
        return jnp.einsum("the,se->hts", q, k)

    return jax.shard_map(body, in_specs=(P(), P(None, "tp"), P()), out_specs=P("tp"))(x, wq, wk)


def mix_inputs():
    return (
        jax.ShapeDtypeStruct((T, E), jnp.float32),
        jax.ShapeDtypeStruct((T, D), jnp.float32),
        jax.ShapeDtypeStruct((E, D, D), jnp.float32),
    )


def gated_mix(gates, x, w):
    return jnp.einsum("te,td,edf->tf", gates, x, w)


def gated_mix_ep_first_expert(gates, x, w):
    def body(gates, x, w):
        local = w.shape[0]
        e0 = lax.axis_index("ep")  # BUG: the device's first expert is axis_index * local
        g = lax.dynamic_slice_in_dim(gates, e0, local, axis=1)
        return lax.psum(jnp.einsum("te,td,edf->tf", g, x, w), "ep")

    return jax.shard_map(body, in_specs=(P(), P(), P("ep")), out_specs=P())(gates, x, w)


def table_inputs():
    return (jax.ShapeDtypeStruct((S, D), jnp.float32),)


def add_table(x):
    return jnp.tanh(x + jnp.asarray(TABLE[: x.shape[0]]))


def add_table_sp_first_rows(x):
    def body(xb):
        tab = jnp.asarray(TABLE[: xb.shape[0]])  # BUG: every shard takes the table's first rows
        return jnp.tanh(xb + tab)

    return jax.shard_map(body, in_specs=P("sp"), out_specs=P("sp"))(x)


def packed_inputs():
    return jax.ShapeDtypeStruct((D * D + D,), jnp.float32), jax.ShapeDtypeStruct((T, D), jnp.float32)


def packed_affine(theta, x):
    w = theta[: D * D].reshape(D, D)
    b = theta[D * D : D * D + D]
    return x @ w + b


def packed_affine_dp_offset(theta, x, mesh):
    theta = lax.with_sharding_constraint(theta, NamedSharding(mesh, P("dp")))
    w = theta[: D * D].reshape(D, D)
    start = D * D - D  # BUG: the bias starts right after the D * D weight
    b = theta[start : start + D]
    return x @ w + b


def band_inputs():
    return (jax.ShapeDtypeStruct((S, D), jnp.float32),)


def banded_scores(x):
    i = lax.broadcasted_iota(jnp.int32, (S, S), 0)
    j = lax.broadcasted_iota(jnp.int32, (S, S), 1)
    return jnp.where(jnp.abs(i - j) <= 2, x @ x.T, 0.0)


def banded_scores_sp_rows(x):
    def body(xb, x):
        blk = xb.shape[0]
        rows = lax.axis_index("sp") + lax.broadcasted_iota(jnp.int32, (blk, S), 0)  # BUG: offset is axis_index * blk
        cols = lax.broadcasted_iota(jnp.int32, (blk, S), 1)
        return jnp.where(jnp.abs(rows - cols) <= 2, xb @ x.T, 0.0)

    return jax.shard_map(body, in_specs=(P("sp"), P()), out_specs=P("sp"))(x, x)
