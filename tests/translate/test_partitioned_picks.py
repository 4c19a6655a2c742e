"""take_along_axis on logits sharded over the vocabulary by jit alone: XLA's partitioner gathers on
each device at `ids[..., None, None] - lo` (an index vector's unit dim added), masks the pick by the
complement of [lo, lo + n) tested on those ids, and all-reduces (equivci/translate/masks.py). The
lookup's window is read on the ids it reshapes, as the mask's is (`masked_lookup`), and a constant
factor the builder keeps in front of the squeezed pick is read inside it (`known_rows`: soft-capped
logits `cap * tanh(l / cap)`). Plain and soft-capped picks, on {vocab: 4} and {data: 2, vocab: 2},
verify; a pick at the next token does not."""

from __future__ import annotations

import textwrap

import model_package
import pytest

from equivci.results import Status

MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    B, T, V = 2, 8, 64


    def inputs():
        return jax.ShapeDtypeStruct((B, T, V), jnp.float32), jax.ShapeDtypeStruct((B, T), jnp.int32)


    def _capped(x):
        return 5.0 * jnp.tanh(x / 5.0)


    def pick(x, tokens):
        return jnp.take_along_axis(x, tokens[..., None], axis=-1)[..., 0]


    def capped_pick(x, tokens):
        return pick(_capped(x), tokens)


    def _on(mesh, x, spec):
        return lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


    def pick_vocab(x, tokens, *, mesh):
        return pick(_on(mesh, x, P(None, None, "vocab")), tokens)


    def capped_pick_data_vocab(x, tokens, *, mesh):
        return pick(_capped(_on(mesh, x, P("data", None, "vocab"))), tokens)


    def next_token_pick(x, tokens, *, mesh):
        return pick(_on(mesh, x, P(None, None, "vocab")), jnp.minimum(tokens + 1, V - 1))  # MARK:next
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: plain, reference: model.py:pick, distributed: model.py:pick_vocab, inputs: model.py:inputs,
         mesh: {vocab: 4}, int_range: [0, 64]}
      - {name: capped, reference: model.py:capped_pick, distributed: model.py:capped_pick_data_vocab,
         inputs: model.py:inputs, mesh: {data: 2, vocab: 2}, int_range: [0, 64]}
      - {name: next, reference: model.py:pick, distributed: model.py:next_token_pick, inputs: model.py:inputs,
         mesh: {vocab: 4}, int_range: [0, 64]}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("partitioned_picks"), "model.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["plain", "capped"])
def test_a_pick_partitioned_over_the_vocabulary_verifies(manifest, name):
    result = model_package.verify_named(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


def test_a_pick_at_the_next_token_is_a_mismatch(manifest):
    assert model_package.verify_named(manifest, "next").status is Status.MISMATCH
