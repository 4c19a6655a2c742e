"""FSDP forward passes: weights stored sharded, all-gathered just before use.

1. {data: 2, fsdp: 4}: batch over both axes; the input projection is stored output-major
   ([F, D], as exported from a framework with [out, in] linear weights) and sharded on F. The
   sharded forward gathers it untiled ([n, F/n, D]), folds it back to [F, D] and transposes.
2. {pod: 2, fsdp: 2, tp: 2}: 2-D weight sharding (FSDP on one dim, tensor parallel on the other);
   each layer gathers its weights over `fsdp` inside a jax.checkpoint'ed function, runs the
   column/row-parallel MLP and all-reduces over `tp`; two layers, batch over (pod, fsdp).
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, D, F = 16, 16, 32


def mlp_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"in_proj": f(F, D), "out_proj": f(F, D), "ln": f(D)}, f(N, D)


def _rms(x, w):
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w


def mlp(params, x):
    h = jax.nn.gelu(_rms(x, params["ln"]) @ params["in_proj"].T)
    return x + h @ params["out_proj"]


def _gathered_mlp(params, x, in_axis):
    f_full = params["in_proj"].shape[0] * lax.axis_size("fsdp")
    w_in = lax.all_gather(params["in_proj"], "fsdp", axis=in_axis).reshape(f_full, -1).T
    w_out = lax.all_gather(params["out_proj"], "fsdp", axis=0, tiled=True)
    h = jax.nn.gelu(_rms(x, params["ln"]) @ w_in)
    return x + h @ w_out


_MLP_SPECS = ({"in_proj": P("fsdp"), "out_proj": P("fsdp"), "ln": P()}, P(("data", "fsdp")))


def mlp_fsdp(params, x, mesh):
    body = lambda p, x: _gathered_mlp(p, x, in_axis=0)
    return jax.shard_map(body, mesh=mesh, in_specs=_MLP_SPECS, out_specs=P(("data", "fsdp")))(params, x)


def mlp_fsdp_gather_axis(params, x, mesh):
    body = lambda p, x: _gathered_mlp(p, x, in_axis=1)
    return jax.shard_map(body, mesh=mesh, in_specs=_MLP_SPECS, out_specs=P(("data", "fsdp")))(params, x)


# ---- 2-D weight sharding, two checkpointed layers ---------------------------------------------

LAYERS = 2


def stack_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return [{"up": f(D, F), "down": f(F, D)} for _ in range(LAYERS)], f(N, D)


def stack(layers, x):
    for layer in layers:
        x = x + jax.nn.silu(x @ layer["up"]) @ layer["down"]
    return x


def _layer_2d(layer, x, reduce_axis):
    up = lax.all_gather(layer["up"], "fsdp", axis=0, tiled=True)        # [D, F/tp]
    down = lax.all_gather(layer["down"], "fsdp", axis=1, tiled=True)    # [F/tp, D]
    return x + lax.psum(jax.nn.silu(x @ up) @ down, reduce_axis)


def _stack_2d(layers, x, reduce_axis):
    layer_fn = jax.checkpoint(lambda l, x: _layer_2d(l, x, reduce_axis))
    for i, layer in enumerate(layers):
        with jax.named_scope(f"layer_{i}"):
            x = layer_fn(layer, x)
    return x


_LAYER_SPEC = {"up": P("fsdp", "tp"), "down": P("tp", "fsdp")}


def _run_2d(layers, x, mesh, reduce_axis):
    fn = jax.shard_map(lambda ls, x: _stack_2d(ls, x, reduce_axis), mesh=mesh,
                       in_specs=([_LAYER_SPEC] * LAYERS, P(("pod", "fsdp"))),
                       out_specs=P(("pod", "fsdp")), check_vma=False)
    return fn(layers, x)


def stack_2d(layers, x, mesh):
    return _run_2d(layers, x, mesh, reduce_axis="tp")


def stack_2d_reduce_fsdp(layers, x, mesh):
    return _run_2d(layers, x, mesh, reduce_axis="fsdp")
