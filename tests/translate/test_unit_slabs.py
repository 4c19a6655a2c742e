"""A pipeline of one-row microbatches: a stage's slab of a stacked bias, `b1[i]` on a device that
holds `b1[s * 2:(s + 1) * 2]`, is a [1, f] window of the input that XLA adds to the [1, f] row
without the broadcast the reference's [b, f] rows have. The loader states such a read window as the
broadcast of its squeeze along its size-1 dims (equivci.terms.ir.read_unit_bcast), so that the row's
window lifts past it onto the reference's sum over every row (tests/terms/test_unit_bcast.py holds
the fact on numbers).

Two styles: GPipe with a fori_loop over each stage's two layers (indexing the stacked slab at the
counter), and stages whose [1, f] slabs are used as they come (`h @ w1[0] + b1`). Near misses: a
layer reading the next layer's bias slab, and the finished microbatch stored one slot late."""

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

    D, F, PP, M, PER = 8, 16, 2, 2, 2


    def inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
        return {"w1": f(PP * PER, D, F), "b1": f(PP * PER, F), "w2": f(PP * PER, F, D)}, f(M, D)


    def _layer(w1, b1, w2, h):
        return h + jnp.tanh(h @ w1 + b1) @ w2


    def stack(p, x):
        for i in range(PP * PER):
            x = _layer(p["w1"][i], p["b1"][i], p["w2"][i], x)
        return x


    def _fori_stage(bias_of):
        def stage(p, h):
            return lax.fori_loop(0, PER, lambda i, h: _layer(p["w1"][i], p["b1"][bias_of(i)], p["w2"][i], h), h)
        return stage


    def _slab_stage(p, h):
        for i in range(PER):
            h = h + jnp.tanh(h @ p["w1"][i] + p["b1"][i:i + 1]) @ p["w2"][i]
        return h


    def _gpipe(stage, slot_of):
        def local(p, x):
            rank = lax.axis_index("pp")
            micro = x.reshape(M, 1, D)
            h, outs = jnp.zeros_like(micro[0]), jnp.zeros_like(micro)
            for t in range(M + PP):
                if t < M:
                    h = jnp.where(rank == 0, micro[t], h)
                h = stage(p, h)
                slot = slot_of(t)
                if 0 <= slot < M:
                    outs = outs.at[slot].set(jnp.where(rank == PP - 1, h, outs[slot]))
                h = lax.ppermute(h, "pp", [(i, (i + 1) % PP) for i in range(PP)])
            return lax.psum(jnp.where(rank == PP - 1, outs, 0.0), "pp").reshape(x.shape)

        def run(p, x, mesh):
            return jax.shard_map(local, mesh=mesh, in_specs=(P("pp"), P()), out_specs=P(), check_vma=False)(p, x)
        return run


    gpipe = _gpipe(_fori_stage(lambda i: i), lambda t: t - (PP - 1))
    gpipe_slabs = _gpipe(_slab_stage, lambda t: t - (PP - 1))
    gpipe_next_bias = _gpipe(_fori_stage(lambda i: (i + 1) % PER), lambda t: t - (PP - 1))
    gpipe_late_slot = _gpipe(_fori_stage(lambda i: i), lambda t: t - PP)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: gpipe, reference: m.py:stack, distributed: m.py:gpipe, inputs: m.py:inputs, mesh: {pp: 2}}
      - {name: gpipe-slabs, reference: m.py:stack, distributed: m.py:gpipe_slabs, inputs: m.py:inputs, mesh: {pp: 2}}
      - {name: gpipe-next-bias, reference: m.py:stack, distributed: m.py:gpipe_next_bias, inputs: m.py:inputs, mesh: {pp: 2}}
      - {name: gpipe-late-slot, reference: m.py:stack, distributed: m.py:gpipe_late_slot, inputs: m.py:inputs, mesh: {pp: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("unit_slabs"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["gpipe", "gpipe-slabs"])
def test_one_row_microbatches_through_stacked_slabs_verify(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["gpipe-next-bias", "gpipe-late-slot"])
def test_a_wrong_slab_or_a_late_slot_is_a_mismatch(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, result.findings
