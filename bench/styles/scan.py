"""Style 3: the layers' weights stacked on a leading axis and the stack run with lax.scan.

One traced layer whatever the depth (compile time flat in the number of layers), as in
MaxText-like code. Megatron TP inside one shard_map around the whole scan: the stacked weights
keep the layer axis whole and split as llama_tp splits one layer's.
"""

from __future__ import annotations

import jax
from jax import lax
from jax.sharding import PartitionSpec as P
from kit import export
from llama_tp import (
    LAYER_SPECS,
    TP,
    Config,
    block,
    layer_shapes,
    lm_head,
    n_layers,
    psum_tp,
    rope_tables,
)
from llama_tp import model_inputs as unstacked_inputs

STACKED_SPECS = {name: P(None, *spec) for name, spec in LAYER_SPECS.items()}


def _stack(cfg: Config, x, stacked, tp=1, reduce=lambda t: t):
    cos, sin = rope_tables(x.shape[1], cfg.head_dim, cfg.rope_theta)

    def step(x, layer):
        return block(cfg, x, layer, cos, sin, tp, reduce), None

    with jax.named_scope("layers"):
        x, _ = lax.scan(step, x, stacked)
    return x


def reference(cfg: Config, x, params):
    x = _stack(cfg, x, params["layers"])
    with jax.named_scope("lm_head"):
        return lm_head(x, params["final_norm"], params["lm_head"], cfg.eps)


def distributed(cfg: Config, x, params, *, mesh):
    specs = {"layers": STACKED_SPECS, "final_norm": P(), "lm_head": P(None, TP)}

    def body(x, params):
        x = _stack(cfg, x, params["layers"], mesh.shape[TP], psum_tp)
        with jax.named_scope("lm_head"):
            return lm_head(x, params["final_norm"], params["lm_head"], cfg.eps)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), specs), out_specs=P(None, None, TP))(x, params)


def inputs(cfg: Config, dtype):
    x, params = unstacked_inputs(cfg, {}, dtype)
    stacked = {name: jax.ShapeDtypeStruct((n_layers(cfg), *s.shape), s.dtype)
               for name, s in layer_shapes(cfg, dtype).items()}
    return x, {**params, "layers": stacked}


export(globals(), reference, distributed, inputs)
