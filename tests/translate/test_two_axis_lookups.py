"""A device's logits on a {data, vocab} mesh, its rows of h against its columns of the head, are a
window along two dims of the reference's logits; a lookup along the vocabulary reads the vocabulary
window of its rows' logits (windows along two dims commute: translate/windows.window_along), so
that the shard's masked pick at `labels - axis_index * V_local`, psummed over vocab, is its rows of
the reference's `take_along_axis(logits, labels)`. Styles: the label's window test written with
`&` and `jnp.clip`, or with `jnp.where` and the gather's own clamp; a bias on the logits. Near
misses: the shard's start taken from the data axis, the wrong window end (both refuted by the
oracle)."""

from __future__ import annotations

import textwrap

import model_package
import pytest
from model_package import verify_named as _verify

from equivci.results import Status

MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, S, D, V = 4, 4, 8, 32


    def inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)  # noqa: E731
        return f(B, S, D), f(D, V), f(V), jax.ShapeDtypeStruct((B, S), jnp.int32)


    def xent(h, w, b, labels):
        logits = jnp.tanh(h) @ w + b
        lse = jax.nn.logsumexp(logits, axis=-1)
        return lse - jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]


    def _pick_clip(logits, local, vl):
        mine = (local >= 0) & (local < vl)
        picked = jnp.take_along_axis(logits, jnp.clip(local, 0, vl - 1)[..., None], -1)[..., 0]
        return jnp.where(mine, picked, 0.0)


    def _pick_where(logits, local, vl):
        outside = (local < 0) | (local >= vl)
        picked = jnp.take_along_axis(logits, jnp.where(outside, 0, local)[..., None], -1)[..., 0]
        return jnp.where(outside, 0.0, picked)


    def _xent_vp(h, w, b, labels, mesh, pick, axis="vocab", end=0):
        def local(h, w, b, labels):
            logits = jnp.tanh(h) @ w + b
            vl = logits.shape[-1]
            m = lax.pmax(jnp.max(logits, -1), "vocab")
            lse = jnp.log(lax.psum(jnp.sum(jnp.exp(logits - m[..., None]), -1), "vocab")) + m
            target = lax.psum(pick(logits, labels - lax.axis_index(axis) * vl, vl + end), "vocab")
            return lse - target

        specs = (P("data"), P(None, "vocab"), P("vocab"), P("data"))
        return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=P("data"), check_vma=False)(
            h, w, b, labels)


    def xent_clip(h, w, b, labels, *, mesh):
        return _xent_vp(h, w, b, labels, mesh, _pick_clip)


    def xent_where(h, w, b, labels, *, mesh):
        return _xent_vp(h, w, b, labels, mesh, _pick_where)


    def xent_data_start(h, w, b, labels, *, mesh):
        return _xent_vp(h, w, b, labels, mesh, _pick_clip, axis="data")


    def xent_short_window(h, w, b, labels, *, mesh):
        return _xent_vp(h, w, b, labels, mesh, _pick_clip, end=-1)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: clip, reference: m.py:xent, distributed: m.py:xent_clip, inputs: m.py:inputs,
         mesh: {data: 2, vocab: 4}, int_range: [0, 32]}
      - {name: where, reference: m.py:xent, distributed: m.py:xent_where, inputs: m.py:inputs,
         mesh: {data: 2, vocab: 4}, int_range: [0, 32]}
      - {name: data-start, reference: m.py:xent, distributed: m.py:xent_data_start, inputs: m.py:inputs,
         mesh: {data: 2, vocab: 4}, int_range: [0, 32]}
      - {name: short-window, reference: m.py:xent, distributed: m.py:xent_short_window, inputs: m.py:inputs,
         mesh: {data: 2, vocab: 4}, int_range: [0, 32]}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("two_axis_lookups"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["clip", "where"])
def test_vocab_pick_on_data_rows_verifies(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["data-start", "short-window"])
def test_vocab_pick_near_misses_are_mismatches(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
