"""Single-device reference MLP blocks and their (abstract) inputs.

These are the functions a team keeps as the source of truth; the sharded versions in
mlp_tp.py must compute exactly the same outputs from the same global-shaped arguments.
"""

import jax
import jax.numpy as jnp

BATCH, SEQ, D_MODEL, D_FF = 2, 8, 16, 32
F32 = jnp.float32


def mlp(x, w1, w2):
    """Two-layer MLP: tanh(x @ w1) @ w2."""
    return jnp.tanh(x @ w1) @ w2


def mlp_bias(x, w1, b1, w2, b2):
    """Two-layer MLP with biases and a GELU."""
    h = jax.nn.gelu(x @ w1 + b1)
    return h @ w2 + b2


def swiglu(x, w_gate, w_up, w_down):
    """The Llama feed-forward: silu(x @ w_gate) * (x @ w_up) @ w_down."""
    return (jax.nn.silu(x @ w_gate) * (x @ w_up)) @ w_down


def projection(x, w):
    """A GELU projection of a (batch, seq, d_model) activation to (batch, seq, d_ff)."""
    return jax.nn.gelu(x @ w)


def _s(*shape):
    return jax.ShapeDtypeStruct(shape, F32)


def mlp_inputs():
    return (_s(8, D_MODEL), _s(D_MODEL, D_FF), _s(D_FF, D_MODEL))


def mlp_bias_inputs():
    return (_s(8, D_MODEL), _s(D_MODEL, D_FF), _s(D_FF), _s(D_FF, D_MODEL), _s(D_MODEL))


def swiglu_inputs():
    return (_s(8, D_MODEL), _s(D_MODEL, D_FF), _s(D_MODEL, D_FF), _s(D_FF, D_MODEL))


def projection_inputs():
    return (_s(BATCH, SEQ, D_MODEL), _s(D_MODEL, D_FF))
