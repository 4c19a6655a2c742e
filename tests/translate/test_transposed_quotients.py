"""Attention over key shards whose context is transposed before its psum (einsum "bhqk,bkhd->bqhd"):
the psum of values transposed alike is the transpose of their psum (equivci/translate/collectives.py),
and transpose(x) op bcast(y) is the transpose of x op the broadcast laid out as x, a broadcast of a
transpose read as one broadcast (equivci/translate/elementwise.py: transposed_with_broadcast). The
psum-ed numerator, transposed, divided by the psum-ed denominator swapped to [b, q, h] then meets
the reference's softmax before its dot. Near misses (a local denominator, a local max, the
denominator broadcast without its swap) are mismatch; the stated facts hold numerically.
"""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest
from model_package import capture_named, programs_of
from model_package import model_named as _model

from equivci.results import Status
from equivci.terms.semantics import evaluate
from equivci.verify.engine import verify_model

MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, S, H, D = 2, 8, 8, 4  # H = S: a denominator left [b, h, q] is still well shaped against [b, q, h]
    NEG = -1e30


    def inputs():
        return tuple(jax.ShapeDtypeStruct((B, S, H, D), jnp.float32) for _ in range(3))


    def _scores(q, k):
        return jnp.einsum("bqhd,bkhd->bhqk", q, k) * D ** -0.5


    def attention(q, k, v):
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(_scores(q, k), -1), v)


    def attention_hqbd(q, k, v):  # a layout whose permutation is no swap: [h, q, b, d]
        return jnp.einsum("bhqk,bkhd->hqbd", jax.nn.softmax(_scores(q, k), -1), v)


    def causal(q, k, v):
        s = _scores(q, k)
        pos = jnp.arange(S)
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(jnp.where(pos[:, None] >= pos, s, NEG), -1), v)


    def _parts(q, k, v, local_max=False):
        s = _scores(q, k)
        m = s.max(-1, keepdims=True)
        p = jnp.exp(s - (m if local_max else lax.pmax(m, "kv")))
        return p, lax.psum(jnp.einsum("bhqk,bkhd->bqhd", p, v), "kv")


    def _flash(q, k, v):
        p, num = _parts(q, k, v)
        return num / jnp.swapaxes(lax.psum(p.sum(-1), "kv"), 1, 2)[..., None]


    def _flash_hqbd(q, k, v):
        s = _scores(q, k)
        p = jnp.exp(s - lax.pmax(s.max(-1, keepdims=True), "kv"))
        num = lax.psum(jnp.einsum("bhqk,bkhd->hqbd", p, v), "kv")
        return num / jnp.transpose(lax.psum(p.sum(-1), "kv"), (1, 2, 0))[..., None]


    def _flash_rows(q, k, v):  # queries all-gathered, a causal mask at the keys' global positions
        me = lax.axis_index("kv")
        q = lax.all_gather(q, "kv", axis=1, tiled=True)
        s = _scores(q, k)
        k_pos = me * (S // 2) + jnp.arange(S // 2)
        s = jnp.where(jnp.arange(S)[:, None] >= k_pos, s, NEG)
        p = jnp.exp(s - lax.pmax(s.max(-1, keepdims=True), "kv"))
        num = lax.psum(jnp.einsum("bhqk,bkhd->bqhd", p, v), "kv")
        den = lax.psum(p.sum(-1), "kv")
        return lax.dynamic_slice_in_dim(num / jnp.swapaxes(den, 1, 2)[..., None], me * (S // 2), S // 2, axis=1)


    def _flash_local_den(q, k, v):
        p, num = _parts(q, k, v)
        return num / jnp.swapaxes(p.sum(-1), 1, 2)[..., None]


    def _flash_local_max(q, k, v):
        p, num = _parts(q, k, v, local_max=True)
        return num / jnp.swapaxes(lax.psum(p.sum(-1), "kv"), 1, 2)[..., None]


    def _flash_unswapped(q, k, v):
        p, num = _parts(q, k, v)
        return num / lax.psum(p.sum(-1), "kv")[..., None]


    def _sharded(body, rows=False):
        def run(q, k, v):
            kv = P(None, "kv")
            return jax.shard_map(body, in_specs=(kv if rows else P(), kv, kv), out_specs=kv if rows else P(),
                                 check_vma=False)(q, k, v)
        return run


    flash = _sharded(_flash)
    flash_hqbd = _sharded(_flash_hqbd)
    flash_rows = _sharded(_flash_rows, rows=True)
    flash_local_den = _sharded(_flash_local_den)
    flash_local_max = _sharded(_flash_local_max)
    flash_unswapped = _sharded(_flash_unswapped)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: bqhd, reference: m.py:attention, distributed: m.py:flash, inputs: m.py:inputs, mesh: {kv: 2}}
      - {name: hqbd, reference: m.py:attention_hqbd, distributed: m.py:flash_hqbd, inputs: m.py:inputs, mesh: {kv: 2}}
      - {name: rows, reference: m.py:causal, distributed: m.py:flash_rows, inputs: m.py:inputs, mesh: {kv: 2}}
      - {name: local-den, reference: m.py:attention, distributed: m.py:flash_local_den, inputs: m.py:inputs, mesh: {kv: 2}}
      - {name: local-max, reference: m.py:attention, distributed: m.py:flash_local_max, inputs: m.py:inputs, mesh: {kv: 2}}
      - {name: unswapped, reference: m.py:attention, distributed: m.py:flash_unswapped, inputs: m.py:inputs, mesh: {kv: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("transposed_quotients"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["bqhd", "hqbd", "rows"])
def test_context_transposed_before_its_psum_verifies(manifest, name):
    """The context laid out [b, q, h, d] (a swap of the dot's [b, h, d, q]) or [h, q, b, d] (no
    swap: the composed permutations must be inverted, not reused), and the queries all-gathered
    with each device keeping its rows under a causal mask."""
    result = verify_model(_model(manifest, name), manifest, capture_named(manifest, name))
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["local-den", "local-max", "unswapped"])
def test_near_misses_are_mismatch(manifest, name):
    """A denominator without its psum, exponentials shifted by each shard's own max, and the
    denominator broadcast in its [b, h, q] layout against the [b, q, h] context."""
    result = verify_model(_model(manifest, name), manifest, capture_named(manifest, name))
    assert result.status is Status.MISMATCH, result.findings


def _stated_transposes(programs) -> list[list]:
    """The groups transposed_with_broadcast stated: a binary op beside a transpose of one."""
    return [
        group
        for group in programs.evaluator.equal_terms
        if len(group) == 2
        and group[0].op == "binary"
        and group[1].op == "transpose"
        and group[1].args[0].op == "binary"
        and group[1].args[0].attrs == group[0].attrs
    ]


@pytest.mark.parametrize("name", ["bqhd", "hqbd", "unswapped"])
def test_stated_transposes_hold_numerically(manifest, name):
    captured = capture_named(manifest, name)
    programs = programs_of(captured)
    facts = _stated_transposes(programs)
    assert facts, name
    rng = np.random.default_rng(0)
    consts = dict(programs.evaluator.values)
    for _ in range(3):
        params = {k: rng.standard_normal(leaf.shape) for k, leaf in enumerate(captured.inputs)}
        for written, moved in facts:
            lhs, rhs = evaluate(written, params, consts), evaluate(moved, params, consts)
            assert lhs.shape == rhs.shape and np.allclose(lhs, rhs, rtol=1e-6, atol=1e-7), (name, written, moved)
