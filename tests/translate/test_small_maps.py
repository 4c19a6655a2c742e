"""A dot applying a small constant matrix along one dim as the sums of products it computes
(equivci.translate.small_maps): `einsum("tpij,bthpj->bthpi", r, x)` is, at each i,
Σ_j r[t, p, i, j] · x[b, t, h, p, j] (exact over the reals), so RoPE written as 2x2 rotation
matrices meets the cos/sin formula `x0 c - x1 s`, `x0 s + x1 c`.

Checked on the term the builder makes (evaluated against JAX) for three layouts, on dots it leaves
alone (a matrix larger than SIZE), and on models in two styles: the rotation on the einsum's left
with heads over tp, and the inverse rotation on its right on batch shards. A device applying the
transposed rotation is a mismatch.
"""

from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import model_package
import numpy as np
import pytest

from equivci.hlo.parser import parse_module
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.evaluator import Evaluator

RNG = np.random.default_rng(3)
X = RNG.standard_normal((2, 6, 3, 4, 2)).astype(np.float32)
ANGLES = RNG.uniform(-3, 3, (6, 4)).astype(np.float32)
ROT = np.stack([np.stack([np.cos(ANGLES), -np.sin(ANGLES)], -1), np.stack([np.sin(ANGLES), np.cos(ANGLES)], -1)], -2)


def _built(fn, x):
    module = parse_module(jax.jit(fn).lower(x).as_text(dialect="hlo"))
    ev = Evaluator(module, TermTable(), 1)
    (out,) = ev.run(module.entry, [[ev.table.make("param", (0,), (), x.shape, "f32")]])
    return ev, out


def _pairs(x):
    return jnp.einsum("tpij,bthpj->bthpi", ROT, x)


def _pairs_swapped(x):  # the constant as the dot's rhs
    return jnp.einsum("bthpj,tpij->tpbhi", x, ROT)


def _halves(x):  # a [2, n] split rotated along its leading 2
    return jnp.einsum("tpij,bthjp->bthip", ROT, x)


@pytest.mark.parametrize("fn, x", [(_pairs, X), (_pairs_swapped, X), (_halves, np.swapaxes(X, -1, -2).copy())])
def test_a_small_constant_map_is_built_as_its_sums_of_products(fn, x):
    ev, out = _built(fn, x)
    assert not any(t.op == "dot" for t in _subterms(out))
    np.testing.assert_allclose(evaluate(out, {0: x}, ev.values), np.asarray(jax.jit(fn)(x)), rtol=1e-5, atol=1e-6)


def _subterms(t):
    seen, stack = set(), [t]
    while stack:
        u = stack.pop()
        if id(u) not in seen:
            seen.add(id(u))
            yield u
            stack.extend(u.args)


def _five(x):  # a 5x5 map: a matrix product, left a dot
    return jnp.einsum("ij,btj->bti", np.eye(5, dtype=np.float32)[::-1], x)


def test_a_larger_map_stays_a_dot():
    _, out = _built(_five, RNG.standard_normal((2, 3, 5)).astype(np.float32))
    assert any(t.op == "dot" for t in _subterms(out))


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    B, T, H, HD = 2, 8, 4, 8


    def inputs():
        return (jax.ShapeDtypeStruct((B, T, H, HD), jnp.float32),)


    def _cos_sin():
        ang = jnp.arange(T, dtype=jnp.float32)[:, None] * 10000.0 ** (-jnp.arange(0, HD, 2) / HD)
        return jnp.cos(ang), jnp.sin(ang)


    def _rot(transposed=False):
        c, s = _cos_sin()
        r = jnp.stack([jnp.stack([c, -s], -1), jnp.stack([s, c], -1)], -2)
        return jnp.swapaxes(r, -1, -2) if transposed else r


    def interleaved(x):
        c, s = _cos_sin()
        c, s = c[:, None], s[:, None]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return jnp.stack([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1).reshape(x.shape)


    def _rotmat(x, transposed=False):
        b, t, h, _ = x.shape
        return jnp.einsum("tpij,bthpj->bthpi", _rot(transposed), x.reshape(b, t, h, HD // 2, 2)).reshape(x.shape)


    def _heads(fn, x, mesh):
        spec = P(None, None, "tp")
        return jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)(x)


    def rotmat_tp(x, *, mesh):
        return _heads(_rotmat, x, mesh)


    def rotmat_transposed(x, *, mesh):
        return _heads(lambda x: _rotmat(x, transposed=True), x, mesh)  # MARK:transposed


    def pairs(x):  # the inverse rotation
        c, s = _cos_sin()
        c, s = c[:, None], s[:, None]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return jnp.stack([x1 * c + x2 * s, x2 * c - x1 * s], axis=-1).reshape(x.shape)


    def _pairs_local(x):
        c, s = _cos_sin()
        r = jnp.stack([jnp.stack([c, s], -1), jnp.stack([-s, c], -1)], -2)
        y = x.reshape(x.shape[0], T, H, HD // 2, 2)
        return jnp.einsum("bthpj,tpij->bthpi", y, r).reshape(x.shape)


    def pairs_dp(x, *, mesh):
        spec = P("dp")
        return jax.shard_map(_pairs_local, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)(x)
    """
)

CASES = [
    ("rotmat", "interleaved", "rotmat_tp", "{tp: 4}"),
    ("rotmat_transposed", "interleaved", "rotmat_transposed", "{tp: 4}"),
    ("pairs", "pairs", "pairs_dp", "{dp: 2}"),
]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    text = model_package.manifest_text(CASES)
    return model_package.write_package(tmp_path_factory.mktemp("small_maps"), "model.py", MODELS, text)


@pytest.mark.parametrize("name", ["rotmat", "pairs"])
def test_rope_as_rotation_matrices_verifies(manifest, name):
    result = model_package.verify_named(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


def test_the_transposed_rotation_is_a_mismatch(manifest):
    result = model_package.verify_named(manifest, "rotmat_transposed")
    assert result.status is Status.MISMATCH, result.findings
