"""Fully-sharded data parallel, two layouts.

1. Hybrid sharding (HSDP) with a torch-FSDP-style flat parameter on {replica: 2, shard: 4}: the two
   MLP weights are raveled and concatenated into one 1-D buffer, sharded over `shard` and replicated
   over `replica`; the batch is split over both axes. Inside the differentiated loss the buffer is
   all-gathered, cut and reshaped into the weights, so the gradient comes back reduce-scattered over
   `shard`; it is then summed over `replica`. Returns (loss, grads).
2. ZeRO-3 style GLU with untiled all-gathers on {fsdp: 8}, bf16 weights and activations with f32
   matmul accumulation and an f32 output: gate/up weights sharded on their input dim (gathered as
   [n, D/n, F] and reshaped), the down weight sharded on its output dim (gathered as [n, F, D/n],
   moved and reshaped); the batch is sharded over fsdp too.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, D, F = 16, 16, 32


def hsdp_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"w_in": f(D, F), "w_out": f(F, D)}, f(N, D), f(N, D)


def _mlp(w_in, w_out, x):
    return x + jax.nn.gelu(x @ w_in) @ w_out


def _mse(params, x, y):
    return jnp.mean(jnp.square(_mlp(params["w_in"], params["w_out"], x) - y))


def mse_and_grads(params, x, y):
    return jax.value_and_grad(_mse)(params, x, y)


def _unflatten(flat):
    return flat[:D * F].reshape(D, F), flat[D * F:].reshape(F, D)


def _unflatten_transposed(flat):
    return flat[:D * F].reshape(D, F), flat[D * F:].reshape(D, F).T


def _hsdp_local(flat_shard, x, y, unflatten):
    def shard_loss(flat_shard):
        w_in, w_out = unflatten(lax.all_gather(flat_shard, "shard", tiled=True))
        return jnp.sum(jnp.square(_mlp(w_in, w_out, x) - y)) / (N * D)

    loss, grad = jax.value_and_grad(shard_loss)(flat_shard)
    return lax.psum(loss, ("replica", "shard")), lax.psum(grad, "replica")


def _hsdp(params, x, y, mesh, unflatten):
    flat = jnp.concatenate([params["w_in"].ravel(), params["w_out"].ravel()])
    batch = P(("replica", "shard"))
    fn = jax.shard_map(lambda f, x, y: _hsdp_local(f, x, y, unflatten), mesh=mesh,
                       in_specs=(P("shard"), batch, batch), out_specs=(P(), P("shard")),
                       check_vma=False)
    loss, flat_grad = fn(flat, x, y)
    return loss, {"w_in": flat_grad[:D * F].reshape(D, F), "w_out": flat_grad[D * F:].reshape(F, D)}


def mse_and_grads_hsdp(params, x, y, mesh):
    return _hsdp(params, x, y, mesh, _unflatten)


def mse_and_grads_hsdp_transposed(params, x, y, mesh):
    return _hsdp(params, x, y, mesh, _unflatten_transposed)


# ---- 2. ZeRO-3 GLU with untiled gathers -----------------------------------------------------------

def glu_inputs():
    bf = lambda *s: jax.ShapeDtypeStruct(s, jnp.bfloat16)
    return {"gate": bf(D, F), "up": bf(D, F), "down": bf(F, D)}, bf(N, D)


def _mm(a, b):
    return jnp.matmul(a, b, preferred_element_type=jnp.float32)


def _glu_math(gate, up, down, x):
    h = (jax.nn.sigmoid(_mm(x, gate)) * _mm(x, up)).astype(jnp.bfloat16)
    return _mm(h, down)


def glu(params, x):
    return _glu_math(params["gate"], params["up"], params["down"], x)


def _rows(shard):
    g = lax.all_gather(shard, "fsdp")                          # [n, rows/n, cols]
    return g.reshape(-1, g.shape[-1])


def _cols(shard):
    g = lax.all_gather(shard, "fsdp")                          # [n, rows, cols/n]
    return jnp.moveaxis(g, 0, 1).reshape(g.shape[1], -1)


def _cols_flat(shard):
    g = lax.all_gather(shard, "fsdp")                          # [n, rows, cols/n]
    return g.reshape(g.shape[1], -1)


def _glu_local(params, x, gather_cols):
    return _glu_math(_rows(params["gate"]), _rows(params["up"]), gather_cols(params["down"]), x)


def _zero3(params, x, mesh, gather_cols):
    specs = {"gate": P("fsdp", None), "up": P("fsdp", None), "down": P(None, "fsdp")}
    fn = jax.shard_map(lambda p, x: _glu_local(p, x, gather_cols), mesh=mesh,
                       in_specs=(specs, P("fsdp")), out_specs=P("fsdp"))
    return fn(params, x)


def glu_zero3(params, x, mesh):
    return _zero3(params, x, mesh, _cols)


def glu_zero3_flat_reshape(params, x, mesh):
    return _zero3(params, x, mesh, _cols_flat)
