"""Residual GELU MLP (`x + gelu(x @ w1 + b1) @ w2`) under fully-sharded data parallelism.

- `mlp_fsdp_tp`: 2-D mesh {fsdp: 4, tp: 2}; batch over fsdp; w1 stored P("fsdp", "tp") and w2
  P("tp", "fsdp"); each layer's weights are all-gathered over fsdp untiled (a new leading or
  middle device axis) and reshaped back to the tp-local matrix before the matmul; the down
  projection is psum-reduced over tp;
- `mlp_zero3_flat`: ZeRO-3 style on the same mesh viewed as one 8-way axis: all parameters
  flattened into one buffer [w1 | b1 | w2] (`ravel` + `concatenate`), sharded over
  ("fsdp", "tp"), all-gathered (tiled) inside the shard_map and unflattened by offsets.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, F = 8, 4, 32, 64
N_FSDP, N_TP = 4, 2


def mlp_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"w1": f(D, F), "b1": f(F), "w2": f(F, D)}, f(B, S, D)


def mlp(p, x):
    return x + jax.nn.gelu(x @ p["w1"] + p["b1"]) @ p["w2"]


# ---- FSDP x TP with untiled gathers -------------------------------------------------------------

def _gather_rows(w):
    """[D/4, F/2] shard -> [4, D/4, F/2] -> [D, F/2]."""
    g = lax.all_gather(w, "fsdp", axis=0)
    return g.reshape(-1, w.shape[1])


def _gather_rows_mid(w):
    g = lax.all_gather(w, "fsdp", axis=1)
    return g.reshape(-1, w.shape[1])


def _gather_cols(w):
    """[F/2, D/4] shard -> [F/2, 4, D/4] -> [F/2, D]."""
    g = lax.all_gather(w, "fsdp", axis=1)
    return g.reshape(w.shape[0], -1)


def _fsdp_local(gather_w1):
    def local(p, x):
        h = jax.nn.gelu(x @ gather_w1(p["w1"]) + p["b1"])
        return x + lax.psum(h @ _gather_cols(p["w2"]), "tp")
    return local


def _fsdp(gather_w1, p, x, mesh):
    specs = {"w1": P("fsdp", "tp"), "b1": P("tp"), "w2": P("tp", "fsdp")}
    return jax.shard_map(_fsdp_local(gather_w1), mesh=mesh, in_specs=(specs, P("fsdp")),
                         out_specs=P("fsdp"))(p, x)


def mlp_fsdp_tp(p, x, mesh):
    return _fsdp(_gather_rows, p, x, mesh)


def mlp_fsdp_tp_gather_axis(p, x, mesh):
    return _fsdp(_gather_rows_mid, p, x, mesh)


# ---- ZeRO-3 flat buffer ------------------------------------------------------------------------

ALL = ("fsdp", "tp")
SIZES = {"w1": D * F, "b1": F, "w2": F * D}


def flatten(p):
    return jnp.concatenate([p[k].ravel() for k in ("w1", "b1", "w2")])


def unflatten(flat, w2_start):
    return {"w1": flat[:D * F].reshape(D, F), "b1": flat[D * F:D * F + F],
            "w2": flat[w2_start:w2_start + F * D].reshape(F, D)}


def _zero3_local(w2_start):
    def local(flat_shard, x):
        full = unflatten(lax.all_gather(flat_shard, ALL, axis=0, tiled=True), w2_start)
        return mlp(full, x)
    return local


def _zero3(w2_start, p, x, mesh):
    fn = jax.shard_map(_zero3_local(w2_start), mesh=mesh, in_specs=(P(ALL), P(ALL)),
                       out_specs=P(ALL))
    return fn(flatten(p), x)


def mlp_zero3_flat(p, x, mesh):
    return _zero3(SIZES["w1"] + SIZES["b1"], p, x, mesh)


def mlp_zero3_flat_offset(p, x, mesh):
    return _zero3(SIZES["w1"], p, x, mesh)
