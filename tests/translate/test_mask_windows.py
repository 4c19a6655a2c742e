"""A device's rows of a constant mask that several reference tables hold (the first rows of a
sliding-window band are the causal mask's rows) relate to the table the reference selects by:
every known table holding them is found and the windows stated equal (translate/constants.py).
Style: the reference builds the band from `tril` of ones, the devices compare positions
`axis_index * n + arange(n)` against key positions under `where(band, s, -inf)`. Near misses: a band
one key wider, positions without the shard offset (both refuted by the oracle)."""

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

    T, C, W = 16, 8, 4


    def inputs():
        s = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)  # noqa: E731
        return s(T, C), s(C, C)


    def _band(rows, first, width):
        q = first + jnp.arange(rows)[:, None]
        k = jnp.arange(T)[None, :]
        return (k <= q) & (k > q - width)


    def local_scores(x, w):
        causal = jnp.tril(jnp.ones((T, T), dtype=bool))
        band = causal & ~jnp.tril(jnp.ones((T, T), dtype=bool), -W)
        s = (x @ w) @ x.T
        return jax.nn.softmax(jnp.where(band, s, -jnp.inf), axis=-1) @ x


    def _local_sp(x, w, mesh, first, width=W):
        def body(xs, w):
            n = xs.shape[0]
            x_all = lax.all_gather(xs, "sp", axis=0, tiled=True)
            s = jnp.where(_band(n, first(lax.axis_index("sp"), n), width), (xs @ w) @ x_all.T, -jnp.inf)
            return jax.nn.softmax(s, axis=-1) @ x_all

        return jax.shard_map(body, mesh=mesh, in_specs=(P("sp"), P()), out_specs=P("sp"))(x, w)


    def local_sp(x, w, *, mesh):
        return _local_sp(x, w, mesh, lambda i, n: i * n)


    def local_sp_wide(x, w, *, mesh):
        return _local_sp(x, w, mesh, lambda i, n: i * n, width=W + 1)


    def local_sp_local_positions(x, w, *, mesh):
        return _local_sp(x, w, mesh, lambda i, n: 0)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: band, reference: m.py:local_scores, distributed: m.py:local_sp, inputs: m.py:inputs, mesh: {sp: 4}}
      - {name: band-wide, reference: m.py:local_scores, distributed: m.py:local_sp_wide, inputs: m.py:inputs,
         mesh: {sp: 4}}
      - {name: band-local, reference: m.py:local_scores, distributed: m.py:local_sp_local_positions,
         inputs: m.py:inputs, mesh: {sp: 4}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("mask_windows"), "m.py", MODELS, MANIFEST)


def test_band_rows_of_each_device_verify(manifest):
    result = _verify(manifest, "band")
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["band-wide", "band-local"])
def test_band_near_misses_are_mismatches(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
