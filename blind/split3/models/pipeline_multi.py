"""Pipeline with two residual layers per stage (layers stacked and split contiguously over 'pp'),
driven by lax.fori_loop; the batch is cut into microbatches inside the function."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

LAYERS, BATCH, FEAT, MICROBATCHES = 4, 8, 8, 4


def residual_layer(h, layer):
    return h + jax.nn.gelu(h @ layer["w"]) * layer["g"]


def apply_layers(h, stacked):
    n = stacked["w"].shape[0]
    for i in range(n):
        h = residual_layer(h, {"w": stacked["w"][i], "g": stacked["g"][i]})
    return h


def model(params, batch):
    return apply_layers(batch, params)


def model_inputs():
    f32 = jnp.float32
    params = {"w": jax.ShapeDtypeStruct((LAYERS, FEAT, FEAT), f32), "g": jax.ShapeDtypeStruct((LAYERS, FEAT), f32)}
    return params, jax.ShapeDtypeStruct((BATCH, FEAT), f32)


def _pipelined(params, batch, mesh, first_output_tick):
    stages = mesh.shape["pp"]
    mb = BATCH // MICROBATCHES

    def per_stage(local_params, x):
        stage = lax.axis_index("pp")
        micro = x.reshape(MICROBATCHES, mb, FEAT)
        ring = [(s, (s + 1) % stages) for s in range(stages)]

        def body(t, carry):
            buf, out = carry
            feed = lax.dynamic_index_in_dim(micro, jnp.minimum(t, MICROBATCHES - 1), keepdims=False)
            buf = jnp.where(stage == 0, feed, buf)
            buf = apply_layers(buf, local_params)
            k = t - first_output_tick
            emit = (stage == stages - 1) & (k >= 0) & (k < MICROBATCHES)
            cur = lax.dynamic_index_in_dim(out, jnp.clip(k, 0, MICROBATCHES - 1), keepdims=False)
            out = lax.dynamic_update_index_in_dim(out, jnp.where(emit, buf, cur), jnp.clip(k, 0, MICROBATCHES - 1), 0)
            return lax.ppermute(buf, "pp", ring), out

        init = lax.pcast((jnp.zeros((mb, FEAT), x.dtype), jnp.zeros_like(micro)), "pp", to="varying")
        _, out = lax.fori_loop(0, MICROBATCHES + stages - 1, body, init)
        out = jnp.where(stage == stages - 1, out, 0.0)
        return lax.psum(out, "pp").reshape(BATCH, FEAT)

    specs = ({"w": P("pp"), "g": P("pp")}, P())
    return jax.shard_map(per_stage, mesh=mesh, in_specs=specs, out_specs=P())(params, batch)


def model_pp(params, batch, mesh):
    return _pipelined(params, batch, mesh, first_output_tick=mesh.shape["pp"] - 1)


def model_pp_late(params, batch, mesh):
    return _pipelined(params, batch, mesh, first_output_tick=mesh.shape["pp"])
