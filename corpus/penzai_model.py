"""Penzai's Llama-like transformer as a function of plain arrays.

The model is penzai's own `llamalike_common.build_llamalike_transformer` (the code behind
penzai's Llama and Mistral variants). Its parameters are unbound once from a skeleton built
without initialisation; `forward` binds the caller's arrays into that skeleton, so the
entrypoints take a dict {parameter label: array} and never allocate weights themselves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from penzai import pz
from penzai.models.transformer.variants import llamalike_common as llamalike

BATCH, SEQ = 4, 8

DENSE = llamalike.LlamalikeTransformerConfig(
    num_kv_heads=4, query_head_multiplier=1, embedding_dim=32, projection_dim=8,
    mlp_hidden_dim=64, num_decoder_blocks=2, vocab_size=64, mlp_variant="swiglu",
    tie_embedder_and_logits=False,
)
# Grouped-query attention: 2 KV head groups, 2 query heads per group (4 query heads).
GQA = dataclasses.replace(DENSE, num_kv_heads=2, query_head_multiplier=2)

Weights = dict[str, jax.Array]
Edit = Callable[[pz.nn.Layer], pz.nn.Layer]


_SKELETONS: dict[int, tuple] = {}


def skeleton(cfg: llamalike.LlamalikeTransformerConfig):
    """The unbound model and, per parameter label, its named axes and sizes (in array order).
    Built once per config object (penzai configs are unhashable dataclasses)."""
    if id(cfg) in _SKELETONS:
        return _SKELETONS[id(cfg)]
    # Built without an RNG, penzai leaves a ParameterSlot where each parameter goes; the named
    # shapes come from an abstract (eval_shape) build with initialisers, so nothing is allocated.
    unbound = llamalike.build_llamalike_transformer(cfg, init_base_rng=None)
    shapes = jax.eval_shape(lambda: {
        p.label: p.value for p in pz.unbind_params(
            llamalike.build_llamalike_transformer(cfg, init_base_rng=jax.random.key(0)), freeze=True)[1]})
    axes = {label: dict(value.named_shape) for label, value in shapes.items()}
    _SKELETONS[id(cfg)] = unbound, axes
    return unbound, axes


def weight_specs(cfg, dtype=jnp.float32) -> dict[str, jax.ShapeDtypeStruct]:
    _, axes = skeleton(cfg)
    return {label: jax.ShapeDtypeStruct(tuple(named.values()), dtype) for label, named in axes.items()}


def token_spec(batch: int = BATCH) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((batch, SEQ), jnp.int32)


def forward(cfg, weights: Weights, tokens: jax.Array, edit: Edit | None = None) -> jax.Array:
    """Logits [batch, seq, vocabulary] of the penzai model with `weights` bound (local shapes
    inside shard_map are fine: penzai's named einsums follow the arrays' sizes)."""
    unbound, axes = skeleton(cfg)
    model = edit(unbound) if edit is not None else unbound
    values = [pz.ParameterValue(value=pz.nx.wrap(weights[label]).tag(*named), label=label)
              for label, named in axes.items()]
    bound = pz.bind_variables(model, values)
    return bound(pz.nx.wrap(tokens).tag("batch", "seq")).unwrap("batch", "seq", "vocabulary")


def axis_position(cfg, label: str, axis: str) -> int:
    return list(skeleton(cfg)[1][label]).index(axis)


@pz.pytree_dataclass
class AllReduce(pz.nn.Layer):
    """psum of every array in the layer's output over a mesh axis (a Megatron row-parallel reduce)."""

    axis: str = dataclasses.field(metadata={"pytree_node": False})

    def __call__(self, x, **_side_inputs):
        return pz.nx.nmap(lambda a: jax.lax.psum(a, self.axis))(x)


def reduce_after(suffixes: tuple[str, ...], axis: str) -> Edit:
    """A penzai model edit: put an AllReduce over `axis` after each Linear whose parameter label
    ends with one of `suffixes` (penzai's selector API, the library's own way to patch models)."""

    def edit(model):
        return (pz.select(model).at_instances_of(pz.nn.Linear)
                .where(lambda lin: lin.weights.label.endswith(suffixes))
                .apply(lambda lin: pz.nn.Sequential([lin, AllReduce(axis)])))

    return edit
