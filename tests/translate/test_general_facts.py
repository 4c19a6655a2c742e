"""General facts the evaluator and the rules use, each on minimal pairs of real JAX programs in
several styles, with near misses that differ only where the fact's side condition matters.

- A window keeps the bounds of the whole, and a gather of a shard of the ids is that shard of the
  gather (an embedding lookup with the ids sharded over data parallelism).
- An all-gather of reshaped shards is the reshape of the gathered shards when the layouts agree
  (flat-parameter FSDP: each weight flattened, sharded, gathered and reshaped back).
- A concatenation of windows along d of the same window along another dim k is the window along k
  of the concatenation (rotate_half on a device's heads).
- A sum regroups onto a grouping the other program computes (a residual added before the bias in
  one program and after it in the other).
- Padding without interior padding is a concatenation with the padding value; a window of a
  concatenation is windows of its parts, and adjacent windows of one value are one window; a select
  by a constant mask that changes along one dim is a concatenation of windows of its branches
  (rows padded to a multiple of the devices, the padding masked off on the last shard).
"""

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

    V, D, B, T = 16, 16, 4, 6


    def embed_inputs():
        return (jax.ShapeDtypeStruct((V, D), jnp.float32), jax.ShapeDtypeStruct((B, T), jnp.int32))


    def embed(table, ids):
        return jnp.take(table, ids, axis=0)


    def embed_dp_tp(table, ids, *, mesh):
        def body(table, ids):
            lo = lax.axis_index("tp") * table.shape[0]
            mine = (ids >= lo) & (ids < lo + table.shape[0])
            rows = jnp.take(table, jnp.where(mine, ids - lo, 0), axis=0)
            return lax.psum(rows * mine[..., None].astype(rows.dtype), "tp")

        return jax.shard_map(body, mesh=mesh, in_specs=(P("tp", None), P("dp", None)),
                             out_specs=P("dp", None, None))(table, ids)


    def embed_dp_only(table, ids, *, mesh):
        return jax.shard_map(lambda t, i: t[i], mesh=mesh, in_specs=(P(), P("dp")), out_specs=P("dp"))(table, ids)


    def embed_dp_rolled(table, ids, *, mesh):
        # each device looks up the other device's ids: a shard of the ids, but not its own
        body = lambda t, i: t[lax.ppermute(i, "dp", [(0, 1), (1, 0)])]  # MARK:rolled
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P("dp")), out_specs=P("dp"))(table, ids)


    def mlp_inputs():
        return ({"w_in": jax.ShapeDtypeStruct((8, 16), jnp.float32),
                 "w_out": jax.ShapeDtypeStruct((16, 8), jnp.float32)}, jax.ShapeDtypeStruct((4, 8), jnp.float32))


    def mlp(params, x):
        return x + jnp.tanh(x @ params["w_in"]) @ params["w_out"]


    def _fsdp(params, x, mesh, unflatten):
        shapes = {k: v.shape for k, v in params.items()}
        flat = {k: v.reshape(-1) for k, v in params.items()}

        def body(flat, x):
            return mlp({k: unflatten(v, shapes[k]) for k, v in flat.items()}, x)

        return jax.shard_map(body, mesh=mesh, in_specs=(P("fsdp"), P("fsdp")), out_specs=P("fsdp"))(flat, x)


    def mlp_flat_fsdp(params, x, *, mesh):
        return _fsdp(params, x, mesh, lambda v, shape: lax.all_gather(v, "fsdp", tiled=True).reshape(shape))


    def mlp_flat_fsdp_stacked(params, x, *, mesh):
        # untiled gather: a leading device dim, then one reshape of the (devices, shard) block
        return _fsdp(params, x, mesh, lambda v, shape: lax.all_gather(v, "fsdp").reshape(shape))


    def mlp_flat_fsdp_transposed(params, x, *, mesh):
        # the gathered flat vector read column-major: the same elements in another layout
        return _fsdp(params, x, mesh,
                     lambda v, shape: lax.all_gather(v, "fsdp", tiled=True).reshape(shape[::-1]).T)  # MARK:colmajor


    def rope_inputs():
        return (jax.ShapeDtypeStruct((2, 8, 16), jnp.float32), jax.ShapeDtypeStruct((16, 4 * 16), jnp.float32))


    def _tables(seq, dim):
        inv = 1.0 / 10000.0 ** (jnp.arange(0, dim, 2) / dim)
        ang = jnp.outer(jnp.arange(seq), inv)
        ang = jnp.concatenate([ang, ang], axis=-1)
        return jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]


    def rotate_half(x):
        half = x.shape[-1] // 2
        return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


    def rope(h, wq):
        q = (h @ wq).reshape(*h.shape[:2], -1, 16)  # heads from a projection, as in a Llama port
        cos, sin = _tables(q.shape[1], q.shape[-1])
        return q * cos + rotate_half(q) * sin


    def _heads(body, h, wq, mesh):
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "tp")), out_specs=P(None, None, "tp"))(h, wq)


    def rope_heads(h, wq, *, mesh):
        return _heads(rope, h, wq, mesh)


    def rope_heads_swapped(h, wq, *, mesh):
        def body(h, wq):
            q = (h @ wq).reshape(*h.shape[:2], -1, 16)
            cos, sin = _tables(q.shape[1], q.shape[-1])
            half = q.shape[-1] // 2
            return q * cos + jnp.concatenate([q[..., half:], -q[..., :half]], axis=-1) * sin  # MARK:swapped

        return _heads(body, h, wq, mesh)


    def linear_inputs():
        return (jax.ShapeDtypeStruct((4, 8), jnp.float32), jax.ShapeDtypeStruct((8, 8), jnp.float32),
                jax.ShapeDtypeStruct((8,), jnp.float32))


    def residual_then_bias(x, w, b):
        return (x + x @ w) + b


    def _row_parallel(x, w, b, mesh, body):
        # the contraction split over tp: each device holds columns of x and rows of w
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None), P()),
                             out_specs=P())(x, x, w, b)


    def bias_then_residual_tp(x, w, b, *, mesh):
        return _row_parallel(x, w, b, mesh, lambda x, xs, ws, b: x + (lax.psum(xs @ ws, "tp") + b))


    def bias_in_psum_tp(x, w, b, *, mesh):
        return _row_parallel(x, w, b, mesh, lambda x, xs, ws, b: x + lax.psum(xs @ ws + b, "tp"))  # MARK:bias_in_psum


    def rows_inputs():
        return (jax.ShapeDtypeStruct((5, 8), jnp.float32), jax.ShapeDtypeStruct((8, 8), jnp.float32))


    def rows(x, w):
        return jnp.tanh(x @ w)


    def _padded_rows(x, w, mesh, pad, keep):
        # 5 rows padded to 8 for 4 devices; each device zeroes the rows past the last real one
        n = x.shape[0]

        def body(xs, w):
            first = lax.axis_index("dp") * xs.shape[0]
            real = (first + jnp.arange(xs.shape[0])) < keep
            return jnp.where(real[:, None], jnp.tanh(xs @ w), 0.0)

        out = jax.shard_map(body, mesh=mesh, in_specs=(P("dp"), P()), out_specs=P("dp"))(jnp.pad(x, pad), w)
        return out[:n]


    def rows_padded(x, w, *, mesh):
        return _padded_rows(x, w, mesh, ((0, 3), (0, 0)), 5)


    def rows_padded_in_front(x, w, *, mesh):
        return _padded_rows(x, w, mesh, ((3, 0), (0, 0)), 5)  # MARK:pad_front


    def rows_masked_short(x, w, *, mesh):
        return _padded_rows(x, w, mesh, ((0, 3), (0, 0)), 4)  # MARK:mask_short


    def masked_inputs():
        return (jax.ShapeDtypeStruct((8, 8), jnp.float32), jax.ShapeDtypeStruct((8, 8), jnp.float32))


    def rows_masked(x, w):
        return jnp.where((jnp.arange(8) < 5)[:, None], jnp.tanh(x @ w), 0.0)


    def _rows_masked_dp(x, w, mesh, order):
        def body(xs, w):
            real = (lax.axis_index("dp") * 2 + order(jnp.arange(2))) < 5
            return jnp.where(real[:, None], jnp.tanh(xs @ w), 0.0)

        return jax.shard_map(body, mesh=mesh, in_specs=(P("dp"), P()), out_specs=P("dp"))(x, w)


    def rows_masked_dp(x, w, *, mesh):
        return _rows_masked_dp(x, w, mesh, lambda r: r)


    def rows_masked_reversed(x, w, *, mesh):
        return _rows_masked_dp(x, w, mesh, lambda r: 1 - r)  # MARK:mask_reversed
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: embed-dp-tp, reference: m.py:embed, distributed: m.py:embed_dp_tp, inputs: m.py:embed_inputs,
         mesh: {dp: 2, tp: 2}}
      - {name: embed-dp, reference: m.py:embed, distributed: m.py:embed_dp_only, inputs: m.py:embed_inputs,
         mesh: {dp: 2}}
      - {name: embed-dp-rolled, reference: m.py:embed, distributed: m.py:embed_dp_rolled, inputs: m.py:embed_inputs,
         mesh: {dp: 2}}
      - {name: fsdp-flat, reference: m.py:mlp, distributed: m.py:mlp_flat_fsdp, inputs: m.py:mlp_inputs,
         mesh: {fsdp: 4}}
      - {name: fsdp-flat-stacked, reference: m.py:mlp, distributed: m.py:mlp_flat_fsdp_stacked,
         inputs: m.py:mlp_inputs, mesh: {fsdp: 2}}
      - {name: fsdp-flat-colmajor, reference: m.py:mlp, distributed: m.py:mlp_flat_fsdp_transposed,
         inputs: m.py:mlp_inputs, mesh: {fsdp: 4}}
      - {name: rotate-half-heads, reference: m.py:rope, distributed: m.py:rope_heads, inputs: m.py:rope_inputs,
         mesh: {tp: 2}}
      - {name: residual-regrouped, reference: m.py:residual_then_bias, distributed: m.py:bias_then_residual_tp,
         inputs: m.py:linear_inputs, mesh: {tp: 2}}
      - {name: bias-in-psum, reference: m.py:residual_then_bias, distributed: m.py:bias_in_psum_tp,
         inputs: m.py:linear_inputs, mesh: {tp: 2}}
      - {name: rows-padded, reference: m.py:rows, distributed: m.py:rows_padded, inputs: m.py:rows_inputs,
         mesh: {dp: 4}}
      - {name: rows-padded-in-front, reference: m.py:rows, distributed: m.py:rows_padded_in_front,
         inputs: m.py:rows_inputs, mesh: {dp: 4}}
      - {name: rows-masked-short, reference: m.py:rows, distributed: m.py:rows_masked_short,
         inputs: m.py:rows_inputs, mesh: {dp: 4}}
      - {name: rows-masked, reference: m.py:rows_masked, distributed: m.py:rows_masked_dp, inputs: m.py:masked_inputs,
         mesh: {dp: 4}}
      - {name: rows-masked-reversed, reference: m.py:rows_masked, distributed: m.py:rows_masked_reversed,
         inputs: m.py:masked_inputs, mesh: {dp: 4}}
      - {name: rotate-half-swapped, reference: m.py:rope, distributed: m.py:rope_heads_swapped,
         inputs: m.py:rope_inputs, mesh: {tp: 2}}
    """
)

EQUIVALENT = ["embed-dp-tp", "embed-dp", "fsdp-flat", "fsdp-flat-stacked", "rotate-half-heads", "residual-regrouped",
              "rows-padded", "rows-masked"]
NEAR_MISSES = ["embed-dp-rolled", "fsdp-flat-colmajor", "rotate-half-swapped", "bias-in-psum", "rows-padded-in-front",
               "rows-masked-short", "rows-masked-reversed"]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("facts"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", EQUIVALENT)
def test_equivalent_pairs_verify(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", NEAR_MISSES)
def test_near_misses_are_mismatches(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
