"""bfloat16 compute with float32 islands.

1. A bf16 RMSNorm + SwiGLU block on {dp: 2, tp: 4}: params and activations in bf16, the norm
   statistics in f32, matmuls accumulate in f32 (preferred_element_type), the row-parallel partial
   sums are reduced in f32 and cast to bf16 once at the residual.
2. A data-parallel SGD step with f32 master weights, a bf16 forward/backward and static loss
   scaling: the scaled loss is differentiated, the gradients averaged over {data: 4} and unscaled
   in f32 before the update.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, D, F = 16, 32, 64
BF16, F32 = jnp.bfloat16, jnp.float32


def block_inputs():
    b = lambda *s: jax.ShapeDtypeStruct(s, BF16)
    return {"norm": b(D), "gate": b(D, F), "up": b(D, F), "down": b(F, D)}, b(N, D)


def _mm(a, w):
    return jnp.matmul(a, w, preferred_element_type=F32)


def bf16_block(params, x):
    xf = x.astype(F32)
    h = xf * lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + 1e-6) * params["norm"].astype(F32)
    h = h.astype(BF16)
    act = (jax.nn.silu(_mm(h, params["gate"])) * _mm(h, params["up"])).astype(BF16)
    return (xf + _mm(act, params["down"])).astype(BF16)


def _fused_rms(x, w):
    xf = x.astype(F32)
    inv = lax.rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + 1e-6)
    return (xf * inv).astype(BF16) * w


def _fused_rms_no_weight(x, w):
    xf = x.astype(F32)
    inv = lax.rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + 1e-6)
    return (xf * inv).astype(BF16)


def _tp_block(params, x, norm):
    h = norm(x, params["norm"])
    gate = lax.dot_general(h, params["gate"], (((1,), (0,)), ((), ())), preferred_element_type=F32)
    up = lax.dot_general(h, params["up"], (((1,), (0,)), ((), ())), preferred_element_type=F32)
    act = (jax.nn.silu(gate) * up).astype(BF16)
    partial = lax.dot_general(act, params["down"], (((1,), (0,)), ((), ())),
                              preferred_element_type=F32)
    return (x.astype(F32) + lax.psum(partial, "tp")).astype(BF16)


_BLOCK_SPECS = ({"norm": P(), "gate": P(None, "tp"), "up": P(None, "tp"), "down": P("tp")}, P("dp"))


def bf16_block_tp(params, x, mesh):
    body = lambda p, x: _tp_block(p, x, _fused_rms)
    return jax.shard_map(body, mesh=mesh, in_specs=_BLOCK_SPECS, out_specs=P("dp"))(params, x)


def bf16_block_tp_norm_unscaled(params, x, mesh):
    body = lambda p, x: _tp_block(p, x, _fused_rms_no_weight)
    return jax.shard_map(body, mesh=mesh, in_specs=_BLOCK_SPECS, out_specs=P("dp"))(params, x)


# ---- loss-scaled SGD step ------------------------------------------------------------------------

LOSS_SCALE, LR = 1024.0, 0.05


def step_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, F32)
    return {"w1": f(D, F), "w2": f(F, D)}, f(N, D), f(N, D)


def _bf16_loss(master, x, y):
    w1, w2 = master["w1"].astype(BF16), master["w2"].astype(BF16)
    h = jax.nn.gelu(_mm(x.astype(BF16), w1)).astype(BF16)
    pred = _mm(h, w2)
    return jnp.mean(jnp.square(pred - y))


def sgd_step(master, x, y):
    loss, grads = jax.value_and_grad(lambda p: _bf16_loss(p, x, y) * LOSS_SCALE)(master)
    grads = jax.tree.map(lambda g: g / LOSS_SCALE, grads)
    new = jax.tree.map(lambda p, g: p - LR * g, master, grads)
    return new, loss / LOSS_SCALE


def _dp_step(master, x, y, n_data):
    # master enters replicated, so its cotangent comes back already summed over `data`
    scaled, grads = jax.value_and_grad(lambda p: _bf16_loss(p, x, y) * LOSS_SCALE)(master)
    grads = jax.tree.map(lambda g: g / (n_data * LOSS_SCALE), grads)
    new = jax.tree.map(lambda p, g: p - LR * g, master, grads)
    return new, lax.pmean(scaled, "data") / LOSS_SCALE


def _dp_step_scaled_grads(master, x, y, n_data):
    # master enters replicated, so its cotangent comes back already summed over `data`
    scaled, grads = jax.value_and_grad(lambda p: _bf16_loss(p, x, y) * LOSS_SCALE)(master)
    grads = jax.tree.map(lambda g: g / n_data, grads)
    new = jax.tree.map(lambda p, g: p - LR * g, master, grads)
    return new, lax.pmean(scaled, "data") / LOSS_SCALE


def _run_dp(step, master, x, y, mesh):
    n = mesh.shape["data"]
    return jax.shard_map(lambda p, x, y: step(p, x, y, n), mesh=mesh,
                         in_specs=(P(), P("data"), P("data")), out_specs=(P(), P()))(master, x, y)


def sgd_step_dp(master, x, y, mesh):
    return _run_dp(_dp_step, master, x, y, mesh)


def sgd_step_dp_scaled_grads(master, x, y, mesh):
    return _run_dp(_dp_step_scaled_grads, master, x, y, mesh)
