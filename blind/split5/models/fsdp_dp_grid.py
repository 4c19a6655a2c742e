"""tanh MLP on a {dp, fsdp} grid: batch split over both axes, weights split over 'fsdp' only."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, D, H = 8, 8, 16


def example_inputs():
    s = jax.ShapeDtypeStruct
    return {"w1": s((D, H), jnp.float32), "w2": s((H, D), jnp.float32)}, s((B, D), jnp.float32)


def mlp(params, x):
    return jnp.tanh(x @ params["w1"]) @ params["w2"]


_SPECS = ({"w1": P(None, "fsdp"), "w2": P("fsdp", None)}, P(("dp", "fsdp"), None))


def mlp_grid(params, x, mesh):
    def local(params, x):
        w1 = lax.all_gather(params["w1"], "fsdp", axis=1, tiled=True)
        w2 = lax.all_gather(params["w2"], "fsdp", axis=0, tiled=True)
        return jnp.tanh(x @ w1) @ w2

    return jax.shard_map(local, mesh=mesh, in_specs=_SPECS, out_specs=P(("dp", "fsdp"), None),
                         check_vma=False)(params, x)


def mlp_grid_gather_dp(params, x, mesh):
    def local(params, x):
        w1 = lax.all_gather(params["w1"], "fsdp", axis=1, tiled=True)
        w2 = lax.all_gather(params["w2"], "dp", axis=0, tiled=True)
        return jnp.tanh(x @ w1) @ w2

    return jax.shard_map(local, mesh=mesh, in_specs=_SPECS, out_specs=P(("dp", "fsdp"), None),
                         check_vma=False)(params, x)
