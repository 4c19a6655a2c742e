"""A small pre-norm transformer-style stack (RMSNorm, SwiGLU-free MLP, residual, final norm, LM
head), its Megatron tensor-parallel version and buggy variants, each with ONE defect on the line
marked with a BUG comment. The localization benchmark (bench/localization.py, configs/localize.yaml) checks
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


def _layers(block, x, params):
    for i, p in enumerate(params["layers"]):
        with jax.named_scope(f"layers_{i}"):
            x = block(x, p)
    return x


def _block_tp(x, p):
    h = rms_norm(x, p["norm"])
    return x + lax.psum(jax.nn.silu(h @ p["w1"]) @ p["w2"], TP)


def forward_tp(x, params, *, mesh):
    def body(x, params):
        return rms_norm(_layers(_block_tp, x, params), params["final_norm"]) @ params["lm_head"]

    return _sharded(body, mesh, x, params)


def forward_tp_no_final_norm(x, params, *, mesh):
    def body(x, params):
        x = _layers(_block_tp, x, params)
        return x @ params["lm_head"]  # BUG: the final RMSNorm is missing

    return _sharded(body, mesh, x, params)


def forward_tp_unnormed_head_weight(x, params, *, mesh):
    def body(x, params):
        x = _layers(_block_tp, x, params)
        return (x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)) @ params["lm_head"]  # BUG: no weight

    return _sharded(body, mesh, x, params)


def _block_tp_no_residual(x, p):
    h = rms_norm(x, p["norm"])
    return lax.psum(jax.nn.silu(h @ p["w1"]) @ p["w2"], TP)  # BUG: the residual add is missing


def _block_tp_no_norm(x, p):
    return x + lax.psum(jax.nn.silu(x @ p["w1"]) @ p["w2"], TP)  # BUG: the block's RMSNorm is missing


def _block_tp_gelu(x, p):
    h = rms_norm(x, p["norm"])
    return x + lax.psum(jax.nn.gelu(h @ p["w1"]) @ p["w2"], TP)  # BUG: gelu where the reference has silu


def _every_layer(block):
    """A TP model whose every layer is `block`."""

    def forward(x, params, *, mesh):
        def body(x, params):
            return rms_norm(_layers(block, x, params), params["final_norm"]) @ params["lm_head"]

        return _sharded(body, mesh, x, params)

    return forward


forward_tp_no_residual = _every_layer(_block_tp_no_residual)
forward_tp_no_block_norm = _every_layer(_block_tp_no_norm)
forward_tp_gelu = _every_layer(_block_tp_gelu)


def forward_tp_last_layer_unreduced(x, params, *, mesh):
    def body(x, params):
        last = len(params["layers"]) - 1
        x = _layers(_block_tp, x, {"layers": params["layers"][:-1]})
        p = params["layers"][-1]
        with jax.named_scope(f"layers_{last}"):
            h = rms_norm(x, p["norm"])
            x = x + jax.nn.silu(h @ p["w1"]) @ p["w2"]  # BUG: the last layer's psum is missing
        return rms_norm(x, params["final_norm"]) @ params["lm_head"]

    return _sharded(body, mesh, x, params)
