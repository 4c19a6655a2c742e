"""Style 6: a 2-D mesh, fully sharded data parallelism × tensor parallelism (fsdp=2 × tp=8).

The batch is split over `fsdp`; every weight is split over `tp` as in llama_tp and, along its
other (model) dimension, over `fsdp` too. Each layer all-gathers its weights over `fsdp` just
before use (ZeRO-3 / FSDP), then runs the Megatron TP block of llama_tp on its batch shard.
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
    decoder,
    layer_shapes,
    lm_head,
    model_inputs,
    psum_tp,
    rope_tables,
)

FSDP = "fsdp"
BATCH = 2  # one sequence per fsdp shard


def _fsdp_spec(spec: P, ndim: int) -> P:
    """The tp spec with the free dimension (the one tp does not split) also split over fsdp."""
    dims = list(spec) + [None] * (ndim - len(spec))
    free = dims.index(None)
    dims[free] = FSDP
    return P(*dims)


def _gather(w, spec: P):
    """The fsdp shards of one weight, gathered back to its tp shard."""
    return lax.all_gather(w, FSDP, axis=list(spec).index(FSDP), tiled=True)


reference = decoder  # the same single-device program as llama_tp's


def distributed(cfg: Config, x, params, *, mesh):
    layer_specs = {k: _fsdp_spec(spec, params["layers"][0][k].ndim) for k, spec in LAYER_SPECS.items()}
    final_specs = {"final_norm": P(FSDP), "lm_head": P(FSDP, TP)}
    specs = {"layers": [layer_specs] * len(params["layers"]), **final_specs}

    def body(x, params):
        cos, sin = rope_tables(x.shape[1], cfg.head_dim, cfg.rope_theta)
        for i, layer in enumerate(params["layers"]):
            with jax.named_scope(f"layers_{i}"):
                x = block(cfg, x, {k: _gather(w, layer_specs[k]) for k, w in layer.items()}, cos, sin,
                          mesh.shape[TP], psum_tp)
        with jax.named_scope("lm_head"):
            final = {k: _gather(params[k], final_specs[k]) for k in final_specs}
            return lm_head(x, final["final_norm"], final["lm_head"], cfg.eps)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(FSDP), specs), out_specs=P(FSDP, None, TP))(x, params)


def inputs(cfg: Config, dtype):
    return model_inputs(cfg, layer_shapes(cfg, dtype), dtype, batch=BATCH)


export(globals(), reference, distributed, inputs)
