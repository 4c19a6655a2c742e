"""Style 5: a mixture-of-experts decoder (Mixtral-like: 8 SwiGLU experts, top-2 routing) with
expert parallelism on the `tp` axis and Megatron TP attention.

Activations stay replicated between blocks. Every device computes the router and the top-2
combine weights for all tokens, runs its own experts (E / tp of them) on every token, weights
their outputs by its columns of the combine weights (found with lax.axis_index) and psums:
the dense-dispatch form of expert parallelism, without capacity limits or dropped tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P
from kit import export
from llama_tp import (
    LAYER_SPECS,
    TP,
    Config,
    attention,
    decoder,
    decoder_tp,
    layer_shapes,
    model_inputs,
    rms_norm,
)

N_EXPERTS, TOP_K = 8, 2
EXPERT_SPECS = {
    **{k: LAYER_SPECS[k] for k in ("attn_norm", "mlp_norm", "wq", "wk", "wv", "wo")},
    "router": P(), "w_gate": P(TP, None, None), "w_up": P(TP, None, None), "w_down": P(TP, None, None),
}


def combine_weights(h, router):
    """(b, s, N_EXPERTS): the softmax over each token's top-2 router logits, 0 elsewhere."""
    top_logits, top_experts = lax.top_k((h @ router).astype(jnp.float32), TOP_K)
    gates = jax.nn.softmax(top_logits, axis=-1)
    return jnp.sum(jax.nn.one_hot(top_experts, N_EXPERTS) * gates[..., None], axis=-2)


def experts(h, combine, w_gate, w_up, w_down):
    """The experts present in the weights, on every token, weighted by `combine` (b, s, experts)."""
    act = jax.nn.silu(jnp.einsum("bsd,edf->bsef", h, w_gate)) * jnp.einsum("bsd,edf->bsef", h, w_up)
    out = jnp.einsum("bsef,efd->bsed", act, w_down)
    return jnp.einsum("bse,bsed->bsd", combine.astype(out.dtype), out)


def local_columns(combine, n_local):
    """This device's experts' columns of the combine weights."""
    return lax.dynamic_slice_in_dim(combine, lax.axis_index(TP) * n_local, n_local, axis=-1)


def moe_block(cfg: Config, x, layer, cos, sin, tp=1, reduce=lambda t: t, local=lambda c, n: c):
    h = rms_norm(x, layer["attn_norm"], cfg.eps)
    x = x + reduce(attention(h, layer["wq"], layer["wk"], layer["wv"], layer["wo"], cos, sin,
                             cfg.n_heads // tp, cfg.n_kv_heads // tp, cfg.head_dim))
    h = rms_norm(x, layer["mlp_norm"], cfg.eps)
    combine = local(combine_weights(h, layer["router"]), layer["w_gate"].shape[0])
    return x + reduce(experts(h, combine, layer["w_gate"], layer["w_up"], layer["w_down"]))


def reference(cfg: Config, x, params):
    return decoder(cfg, x, params, moe_block)


def distributed(cfg: Config, x, params, *, mesh):
    return decoder_tp(cfg, x, params, mesh, moe_block, EXPERT_SPECS, local=local_columns)


def inputs(cfg: Config, dtype):
    d, f = cfg.d_model, cfg.d_ff

    def s(*shape):
        return jax.ShapeDtypeStruct(shape, dtype)

    experts = {"router": s(d, N_EXPERTS), "w_gate": s(N_EXPERTS, d, f), "w_up": s(N_EXPERTS, d, f),
               "w_down": s(N_EXPERTS, f, d)}
    return model_inputs(cfg, {**layer_shapes(cfg, dtype), **experts}, dtype)


export(globals(), reference, distributed, inputs)
