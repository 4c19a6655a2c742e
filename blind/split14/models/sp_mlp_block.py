"""GPT-style pre-LN MLP sub-layer with biases (LayerNorm -> fc_in + bias -> GELU -> fc_out + bias ->
residual), applied twice with different weights, Megatron sequence parallelism on {sp: 4}: the
activations stay sharded over the sequence (dim 1 of [B, S, D]) between sub-layers, LayerNorm runs
on the local sequence chunk, the normed chunk is all-gathered over the sequence before the
column-parallel fc_in, and the row-parallel fc_out partials are reduce-scattered back to sequence
shards.

- `mlp_sp_scatter_dim1`: `lax.psum_scatter(..., scatter_dimension=1, tiled=True)`, the fc_out bias
  added once after the scatter;
- `mlp_sp_psum_slice`: the reduce-scatter written as a full `psum` followed by the device's
  sequence window `lax.dynamic_slice_in_dim(..., axis_index * S_LOCAL, S_LOCAL, axis=1)`.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, F, N_SUB = 2, 16, 32, 64, 2
SP = 4
S_LOCAL = S // SP
LN_EPS = 1e-5


def sp_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    sub = lambda: {"ln_g": f(D), "ln_b": f(D), "w_in": f(D, F), "b_in": f(F),
                   "w_out": f(F, D), "b_out": f(D)}
    return [sub() for _ in range(N_SUB)], f(B, S, D)


def ln(x, g, b):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.var(x, axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + LN_EPS) * g + b


def mlp_stack(subs, x):
    for p in subs:
        h = ln(x, p["ln_g"], p["ln_b"])
        h = jax.nn.gelu(h @ p["w_in"] + p["b_in"])
        x = x + h @ p["w_out"] + p["b_out"]
    return x


SUB_SPECS = {"ln_g": P(), "ln_b": P(), "w_in": P(None, "sp"), "b_in": P("sp"),
             "w_out": P("sp"), "b_out": P()}


def _run(sub_fn, subs, x, mesh):
    def local(subs, x):
        for p in subs:
            x = sub_fn(p, x)
        return x
    return jax.shard_map(local, mesh=mesh, in_specs=([SUB_SPECS] * N_SUB, P(None, "sp")),
                         out_specs=P(None, "sp"))(subs, x)


def _column_parallel(p, x):
    h = lax.all_gather(ln(x, p["ln_g"], p["ln_b"]), "sp", axis=1, tiled=True)
    return jax.nn.gelu(h @ p["w_in"] + p["b_in"]) @ p["w_out"]


# ---- psum_scatter over the sequence dim ---------------------------------------------------------

def _sub_scatter(p, x):
    y = lax.psum_scatter(_column_parallel(p, x), "sp", scatter_dimension=1, tiled=True)
    return x + y + p["b_out"]


def _sub_scatter_bias_inside(p, x):
    y = lax.psum_scatter(_column_parallel(p, x) + p["b_out"], "sp", scatter_dimension=1, tiled=True)
    return x + y


def mlp_sp_scatter_dim1(subs, x, mesh):
    return _run(_sub_scatter, subs, x, mesh)


def mlp_sp_scatter_bias_inside(subs, x, mesh):
    return _run(_sub_scatter_bias_inside, subs, x, mesh)


# ---- psum then the device's sequence window -----------------------------------------------------

def _sub_psum_slice(p, x):
    y = lax.psum(_column_parallel(p, x), "sp")
    y = lax.dynamic_slice_in_dim(y, lax.axis_index("sp") * S_LOCAL, S_LOCAL, axis=1)
    return x + y + p["b_out"]


def _sub_psum_slice_normed_residual(p, x):
    h = ln(x, p["ln_g"], p["ln_b"])
    y = lax.psum(_column_parallel(p, x), "sp")
    y = lax.dynamic_slice_in_dim(y, lax.axis_index("sp") * S_LOCAL, S_LOCAL, axis=1)
    return h + y + p["b_out"]


def mlp_sp_psum_slice(subs, x, mesh):
    return _run(_sub_psum_slice, subs, x, mesh)


def mlp_sp_psum_slice_normed_residual(subs, x, mesh):
    return _run(_sub_psum_slice_normed_residual, subs, x, mesh)
