"""Weight-only int8 MLP (residual GELU MLP whose kernels are stored as int8 with f32 scales: per input
row for `w1` [D, F], per output column for `w2` [F, D]), dequantised as `q.astype(f32) * scale`.

FSDP / ZeRO-3 over {fsdp: 4}: the batch and the int8 kernels are sharded over fsdp, weights are
all-gathered just before their matmul.
- `qmlp_fsdp_dequant_local`: `w1` row-sharded and dequantised on its shard (the device's slice of
  the replicated row scales cut at `axis_index * D_LOCAL`) before a tiled all-gather; `w2` flattened
  to [F*D], flat-sharded, gathered as int8 and reshaped to [F, D] before dequantisation;
- `qmlp_fsdp_gather_int8`: `w1` column-sharded, both kernels gathered as int8 and dequantised
  after the gather; `w2` row-sharded and gathered untiled ([n, F/n, D]) then reshaped.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, D, F = 16, 32, 64
N = 4
D_LOCAL, F_LOCAL = D // N, F // N


def qmlp_inputs():
    q = lambda *s: jax.ShapeDtypeStruct(s, jnp.int8)
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"w1_q": q(D, F), "s1": f(D), "w2_q": q(F, D), "s2": f(D)}, f(B, D)


def dequant_rows(q, scale):
    return q.astype(jnp.float32) * scale[:, None]


def dequant_cols(q, scale):
    return q.astype(jnp.float32) * scale[None, :]


def qmlp(p, x):
    h = jax.nn.gelu(x @ dequant_rows(p["w1_q"], p["s1"]))
    return x + h @ dequant_cols(p["w2_q"], p["s2"])


# ---- dequantise the local shard, then gather ----------------------------------------------------

def _local_dequant(row_scale_offset):
    def local(w1_q, s1, w2_flat, s2, x):
        s1_local = lax.dynamic_slice_in_dim(s1, row_scale_offset(lax.axis_index("fsdp")), D_LOCAL)
        w1 = lax.all_gather(dequant_rows(w1_q, s1_local), "fsdp", axis=0, tiled=True)
        h = jax.nn.gelu(x @ w1)
        w2_q = lax.all_gather(w2_flat, "fsdp", axis=0, tiled=True).reshape(F, D)
        return x + h @ dequant_cols(w2_q, s2)
    return local


def _run_local(local, p, x, mesh):
    return jax.shard_map(local, mesh=mesh, in_specs=(P("fsdp"), P(), P("fsdp"), P(), P("fsdp")),
                         out_specs=P("fsdp"))(p["w1_q"], p["s1"], p["w2_q"].reshape(-1), p["s2"], x)


def qmlp_fsdp_dequant_local(params, x, mesh):
    return _run_local(_local_dequant(lambda i: i * D_LOCAL), params, x, mesh)


def qmlp_fsdp_dequant_local_scale_offset(params, x, mesh):
    return _run_local(_local_dequant(lambda i: i * F_LOCAL), params, x, mesh)


# ---- gather int8, dequantise after --------------------------------------------------------------

def _gather_w2_untiled(w2_q):
    return lax.all_gather(w2_q, "fsdp", axis=0).reshape(F, D)


def _gather_w2_untiled_axis1(w2_q):
    return lax.all_gather(w2_q, "fsdp", axis=1).reshape(F, D)


def _gather_int8(gather_w2):
    def local(p, x):
        w1 = dequant_rows(lax.all_gather(p["w1_q"], "fsdp", axis=1, tiled=True), p["s1"])
        h = jax.nn.gelu(x @ w1)
        return x + h @ dequant_cols(gather_w2(p["w2_q"]), p["s2"])
    return local


SPECS_INT8 = {"w1_q": P(None, "fsdp"), "s1": P(), "w2_q": P("fsdp"), "s2": P()}


def qmlp_fsdp_gather_int8(params, x, mesh):
    return jax.shard_map(_gather_int8(_gather_w2_untiled), mesh=mesh,
                         in_specs=(SPECS_INT8, P("fsdp")), out_specs=P("fsdp"))(params, x)


def qmlp_fsdp_gather_int8_wrong_axis(params, x, mesh):
    return jax.shard_map(_gather_int8(_gather_w2_untiled_axis1), mesh=mesh,
                         in_specs=(SPECS_INT8, P("fsdp")), out_specs=P("fsdp"))(params, x)
