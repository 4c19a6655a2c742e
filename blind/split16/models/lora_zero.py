"""A 2-layer GELU MLP whose frozen base kernels carry LoRA adapters (W + alpha/r * A @ B, r = 4),
evaluated ZeRO-3 style on {zero: 8}: the batch and every base kernel are sharded over all 8
devices, and kernels are all-gathered just before their matmul.

- `lora_flat_shards`: base kernels flattened to 1-D and sharded (a flat ZeRO buffer per kernel),
  gathered tiled and reshaped to [in, out]; adapters replicated and applied as a side path
  x @ A @ B;
- `lora_merged_shards`: each device merges its own column (w1) / row (w2) block of the base
  kernel with its slice of B (or A) and the merged blocks are all-gathered along that dim.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, D, F, R = 16, 32, 64, 4
ALPHA = 8.0
SCALE = ALPHA / R


def lora_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"w1": f(D, F), "a1": f(D, R), "b1": f(R, F),
              "w2": f(F, D), "a2": f(F, R), "b2": f(R, D)}
    return params, f(N, D)


def lora_linear(x, w, a, b):
    return x @ w + SCALE * (x @ a) @ b


def lora_mlp(params, x):
    h = jax.nn.gelu(lora_linear(x, params["w1"], params["a1"], params["b1"]))
    return lora_linear(h, params["w2"], params["a2"], params["b2"])


# ---- flat base shards --------------------------------------------------------------------------------

def unflatten(flat, rows, cols):
    return flat.reshape(rows, cols)


def unflatten_transposed(flat, rows, cols):
    return flat.reshape(cols, rows).T


def _flat_local(p, x, unflat):
    w1 = unflat(lax.all_gather(p["w1"], "zero", tiled=True), D, F)
    h = jax.nn.gelu(lora_linear(x, w1, p["a1"], p["b1"]))
    w2 = unflat(lax.all_gather(p["w2"], "zero", tiled=True), F, D)
    return lora_linear(h, w2, p["a2"], p["b2"])


def _flat(unflat, params, x, mesh):
    flat = dict(params, w1=params["w1"].reshape(-1), w2=params["w2"].reshape(-1))
    specs = {k: (P("zero") if k in ("w1", "w2") else P()) for k in flat}
    return jax.shard_map(lambda p, t: _flat_local(p, t, unflat), mesh=mesh,
                         in_specs=(specs, P("zero")), out_specs=P("zero"))(flat, x)


def lora_flat_shards(params, x, mesh):
    return _flat(unflatten, params, x, mesh)


def lora_flat_shards_transposed(params, x, mesh):
    return _flat(unflatten_transposed, params, x, mesh)


# ---- merged blocks -----------------------------------------------------------------------------------

def merge(w, a, b):
    return w + SCALE * a @ b


def merge_unscaled(w, a, b):
    return w + a @ b


def _merged_local(p, x, merge_fn):
    w1 = lax.all_gather(merge_fn(p["w1"], p["a1"], p["b1"]), "zero", axis=1, tiled=True)
    w2 = lax.all_gather(merge_fn(p["w2"], p["a2"], p["b2"]), "zero", axis=0, tiled=True)
    return jax.nn.gelu(x @ w1) @ w2


MERGED_SPECS = {"w1": P(None, "zero"), "a1": P(), "b1": P(None, "zero"),
                "w2": P("zero", None), "a2": P("zero", None), "b2": P()}


def _merged(merge_fn, params, x, mesh):
    return jax.shard_map(lambda p, t: _merged_local(p, t, merge_fn), mesh=mesh,
                         in_specs=(MERGED_SPECS, P("zero")), out_specs=P("zero"))(params, x)


def lora_merged_shards(params, x, mesh):
    return _merged(merge, params, x, mesh)


def lora_merged_shards_unscaled(params, x, mesh):
    return _merged(merge_unscaled, params, x, mesh)
