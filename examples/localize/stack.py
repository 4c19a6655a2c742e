"""A small pre-norm transformer-style stack (RMSNorm, SwiGLU-free MLP, residual, final norm, LM
head), its Megatron tensor-parallel version and buggy variants, each with ONE defect on the line
marked `# BUG:`. The localization benchmark (bench/localization.py, configs/localize.yaml) checks
that the first finding lands there."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

L, T, D, F, V = 4, 8, 32, 64, 48
TP = "tp"


def rms_norm(x, w):
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w


def block(x, p):
    h = rms_norm(x, p["norm"])
    return x + jax.nn.silu(h @ p["w1"]) @ p["w2"]


def forward(x, params):
    for i, p in enumerate(params["layers"]):
        with jax.named_scope(f"layers_{i}"):
            x = block(x, p)
    return rms_norm(x, params["final_norm"]) @ params["lm_head"]


def inputs():
    s = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)  # noqa: E731
    layer = {"norm": s(D), "w1": s(D, F), "w2": s(F, D)}
    return (s(T, D), {"layers": [dict(layer) for _ in range(L)], "final_norm": s(D), "lm_head": s(D, V)})


def _specs():
    layer = {"norm": P(), "w1": P(None, TP), "w2": P(TP, None)}
    return {"layers": [layer] * L, "final_norm": P(), "lm_head": P(None, TP)}


def _sharded(body, mesh, x, params):
    return jax.shard_map(body, mesh=mesh, in_specs=(P(), _specs()), out_specs=P(None, TP))(x, params)


def _block_tp(x, p):
    h = rms_norm(x, p["norm"])
    return x + lax.psum(jax.nn.silu(h @ p["w1"]) @ p["w2"], TP)


def forward_tp(x, params, *, mesh):
    def body(x, params):
        for i, p in enumerate(params["layers"]):
            with jax.named_scope(f"layers_{i}"):
                x = _block_tp(x, p)
        return rms_norm(x, params["final_norm"]) @ params["lm_head"]

    return _sharded(body, mesh, x, params)


def forward_tp_no_final_norm(x, params, *, mesh):
    def body(x, params):
        for i, p in enumerate(params["layers"]):
            with jax.named_scope(f"layers_{i}"):
                x = _block_tp(x, p)
        return x @ params["lm_head"]  # BUG: the final RMSNorm is missing

    return _sharded(body, mesh, x, params)


def _block_tp_no_residual(x, p):
    h = rms_norm(x, p["norm"])
    return lax.psum(jax.nn.silu(h @ p["w1"]) @ p["w2"], TP)  # BUG: the residual add is missing


def forward_tp_no_residual(x, params, *, mesh):
    def body(x, params):
        for i, p in enumerate(params["layers"]):
            with jax.named_scope(f"layers_{i}"):
                x = _block_tp_no_residual(x, p)
        return rms_norm(x, params["final_norm"]) @ params["lm_head"]

    return _sharded(body, mesh, x, params)


def _block_tp_no_norm(x, p):
    return x + lax.psum(jax.nn.silu(x @ p["w1"]) @ p["w2"], TP)  # BUG: the block's RMSNorm is missing


def forward_tp_no_block_norm(x, params, *, mesh):
    def body(x, params):
        for i, p in enumerate(params["layers"]):
            with jax.named_scope(f"layers_{i}"):
                x = _block_tp_no_norm(x, p)
        return rms_norm(x, params["final_norm"]) @ params["lm_head"]

    return _sharded(body, mesh, x, params)


def _block_tp_gelu(x, p):
    h = rms_norm(x, p["norm"])
    return x + lax.psum(jax.nn.gelu(h @ p["w1"]) @ p["w2"], TP)  # BUG: gelu where the reference has silu


def forward_tp_gelu(x, params, *, mesh):
    def body(x, params):
        for i, p in enumerate(params["layers"]):
            with jax.named_scope(f"layers_{i}"):
                x = _block_tp_gelu(x, p)
        return rms_norm(x, params["final_norm"]) @ params["lm_head"]

    return _sharded(body, mesh, x, params)


def forward_tp_last_layer_unreduced(x, params, *, mesh):
    def body(x, params):
        for i, p in enumerate(params["layers"][:-1]):
            with jax.named_scope(f"layers_{i}"):
                x = _block_tp(x, p)
        p = params["layers"][-1]
        with jax.named_scope(f"layers_{L - 1}"):
            h = rms_norm(x, p["norm"])
            x = x + jax.nn.silu(h @ p["w1"]) @ p["w2"]  # BUG: the last layer's psum is missing
        return rms_norm(x, params["final_norm"]) @ params["lm_head"]

    return _sharded(body, mesh, x, params)


def forward_tp_unnormed_head_weight(x, params, *, mesh):
    def body(x, params):
        for i, p in enumerate(params["layers"]):
            with jax.named_scope(f"layers_{i}"):
                x = _block_tp(x, p)
        return (x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)) @ params["lm_head"]  # BUG: norm weight dropped

    return _sharded(body, mesh, x, params)
