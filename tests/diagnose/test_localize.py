"""Localization of failed proofs: the finding lands where the defect was made, not downstream.

Real captured programs: a few buggy zoo models whose first unrelated op is shared downstream code
(the attention scores, the RoPE rotation, the norm's division), and two small models written here.
Localization runs only after a proof failed and must never change which outputs are proved.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import model_package
import pytest

from equivci.diagnose.localize import first_defect, source_of
from equivci.hlo.collectives import axis_groups
from equivci.hlo.parser import parse_module
from equivci.manifest import load_manifest
from equivci.prove.programs import build_programs
from equivci.prove.saturate import saturate, size

REPO = Path(__file__).resolve().parents[2]

MODELS = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    H = 16
    TP = "tp"


    def inputs():
        f = jnp.float32
        return (jax.ShapeDtypeStruct((4, 8), f), jax.ShapeDtypeStruct((8, 2 * H), f), jax.ShapeDtypeStruct((H, 8), f))


    def gated(x, w, wo):
        a, b = jnp.split(x @ w, 2, axis=-1)
        return (a * b) @ wo


    def gated_tp_wrong_offset(x, w, wo, *, mesh):
        cols = H // mesh.shape[TP]

        def body(x, w, wo):
            i = lax.axis_index(TP)
            w_a = lax.dynamic_slice_in_dim(w, i * cols, cols, axis=1)
            w_b = lax.dynamic_slice_in_dim(w, (i + 1) * cols, cols, axis=1)  # MARK:offset
            return lax.psum(((x @ w_a) * (x @ w_b)) @ wo, TP)

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P(TP, None)), out_specs=P())(x, w, wo)


    def gated_tp_rotated_inline(x, w, wo, *, mesh):
        n, cols = mesh.shape[TP], H // mesh.shape[TP]

        def body(x, w, wo):
            i = lax.axis_index(TP)
            w_a = lax.dynamic_slice_in_dim(w, i * cols, cols, axis=1)
            w_b = lax.dynamic_slice_in_dim(w, H + ((i + 1) % n) * cols, cols, axis=1)  # MARK:rotated
            return lax.psum(((x @ w_a) * (x @ w_b)) @ lax.dynamic_slice_in_dim(wo, i * cols, cols, axis=0), TP)

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P()), out_specs=P())(x, w, wo)


    def gated_tp_rotated_named(x, w, wo, *, mesh):
        n, cols = mesh.shape[TP], H // mesh.shape[TP]

        def body(x, w, wo):
            i = lax.axis_index(TP)
            j = (i + 1) % n  # MARK:index
            w_a = lax.dynamic_slice_in_dim(w, i * cols, cols, axis=1)
            w_b = lax.dynamic_slice_in_dim(w, H + j * cols, cols, axis=1)
            return lax.psum(((x @ w_a) * (x @ w_b)) @ lax.dynamic_slice_in_dim(wo, i * cols, cols, axis=0), TP)

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P()), out_specs=P())(x, w, wo)


    def _pick(w, group, cols):
        return lax.dynamic_slice_in_dim(w, H + group * cols, cols, axis=1)


    def gated_tp_rotated_argument(x, w, wo, *, mesh):
        n, cols = mesh.shape[TP], H // mesh.shape[TP]

        def body(x, w, wo):
            i = lax.axis_index(TP)
            w_a = lax.dynamic_slice_in_dim(w, i * cols, cols, axis=1)
            w_b = _pick(w, (i + 1) % n, cols)  # MARK:argument
            return lax.psum(((x @ w_a) * (x @ w_b)) @ lax.dynamic_slice_in_dim(wo, i * cols, cols, axis=0), TP)

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P()), out_specs=P())(x, w, wo)


    TABLE = jnp.arange(64.0).reshape(16, 4)


    def table_inputs():
        return (jax.ShapeDtypeStruct((16, 4), jnp.float32),)


    def scaled_by_table(x):
        return x * TABLE[: x.shape[0]]


    def scaled_by_table_sp(x, *, mesh):
        def body(x):
            s = x.shape[0]
            rows = ((lax.axis_index(TP) + 1) % mesh.shape[TP]) * s + jnp.arange(s)  # MARK:rows
            return x * TABLE[rows]

        return jax.shard_map(body, mesh=mesh, in_specs=(P(TP, None),), out_specs=P(TP, None))(x)


    def norm_inputs():
        return (jax.ShapeDtypeStruct((4, 16), jnp.float32),)


    def rms(x):
        return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)


    def rms_tp_local_width(x, *, mesh):
        def body(x):
            n = x.shape[-1]  # MARK:width
            ms = lax.psum(jnp.sum(x * x, axis=-1, keepdims=True), TP) / n
            return x * lax.rsqrt(ms + 1e-6)

        return jax.shard_map(body, mesh=mesh, in_specs=(P(None, TP),), out_specs=P(None, TP))(x)


    def roll_inputs():
        return (jax.ShapeDtypeStruct((16, 8), jnp.float32),)


    def roll(x):
        return jnp.roll(x, 4, axis=0)


    def roll_ring_left(x, *, mesh):
        n = mesh.shape[TP]
        pairs = [(j, (j - 1) % n) for j in range(n)]  # MARK:pairs

        def body(x):
            return lax.ppermute(x, TP, pairs)

        return jax.shard_map(body, mesh=mesh, in_specs=(P(TP, None),), out_specs=P(TP, None))(x)


    def heads_inputs():
        return (jax.ShapeDtypeStruct((2, 8, 16), jnp.float32),)


    def head_scores(x):
        q = x.reshape(2, 8, 4, 4)
        return jnp.einsum("bqhe,bkhe->bhqk", q, q)


    def head_scores_minor_split(x, *, mesh):
        def body(x):
            q = x.reshape(2, 8, 4, 4).transpose(0, 1, 3, 2)  # MARK:minor-split
            q = lax.dynamic_slice_in_dim(q, 2 * lax.axis_index(TP), 2, axis=2)
            return jnp.einsum("bqhe,bkhe->bhqk", q, q)

        return jax.shard_map(body, mesh=mesh, in_specs=(P(),), out_specs=P(None, TP))(x)


    def head_scores_heads_first_doubled(x, *, mesh):
        def body(x):
            q = x.reshape(2, 8, 4, 4).transpose(0, 2, 1, 3)
            q = lax.dynamic_slice_in_dim(q, 2 * lax.axis_index(TP), 2, axis=1)
            return jnp.einsum("bhqe,bhke->bhqk", q, q) * 2.0  # MARK:doubled

        return jax.shard_map(body, mesh=mesh, in_specs=(P(),), out_specs=P(None, TP))(x)


    STAGES, MICRO = 4, 3


    def pipe_inputs():
        return (jax.ShapeDtypeStruct((MICRO, 2, 8), jnp.float32), jax.ShapeDtypeStruct((STAGES, 8, 8), jnp.float32))


    def pipe(xs, ws):
        for s in range(STAGES):
            xs = jnp.tanh(xs @ ws[s])
        return xs


    def _gpipe(xs, ws, mesh, pairs, layer):
        def body(xs, w):
            me = lax.axis_index(TP)

            def tick(carry, t):
                state, outs = carry
                state = jnp.where(me == 0, xs[jnp.minimum(t, MICRO - 1)], state)
                state = layer(state, w[0])
                done = t - (STAGES - 1)
                outs = jnp.where((me == STAGES - 1) & (done >= 0), outs.at[jnp.clip(done, 0, MICRO - 1)].set(state), outs)
                return (lax.ppermute(state, TP, pairs), outs), None

            (_, outs), _ = lax.scan(tick, (jnp.zeros_like(xs[0]), jnp.zeros_like(xs)), jnp.arange(MICRO + STAGES - 1))
            return lax.psum(outs, TP)

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(TP)), out_specs=P(), check_vma=False)(xs, ws)


    def pipe_backwards(xs, ws, *, mesh):
        pairs = [(j, (j - 1) % STAGES) for j in range(STAGES)]  # MARK:pipe-pairs
        return _gpipe(xs, ws, mesh, pairs, lambda h, w: jnp.tanh(h @ w))


    def pipe_transposed(xs, ws, *, mesh):
        pairs = [(j, (j + 1) % STAGES) for j in range(STAGES)]
        return _gpipe(xs, ws, mesh, pairs, lambda h, w: jnp.tanh(h @ w.T))  # MARK:pipe-weight


    def pair_inputs():
        return (jax.ShapeDtypeStruct((8, 16), jnp.float32), jax.ShapeDtypeStruct((8, 8), jnp.float32))


    def first_half(x, c):
        y = x * x
        return y[:, :8] * jnp.cos(c)


    def second_half(x, c):
        y = x * x
        return y[:, 8:] * jnp.cos(c)


    def _evens_strided(y):
        return lax.slice(y, (0, 0), y.shape, (1, 2))  # MARK:strided


    def _evens_reshaped(y):
        return y.reshape(y.shape[0], -1, 2)[:, :, 0]  # MARK:reshaped


    def _evens_gathered(y):
        return y[:, jnp.arange(0, y.shape[1], 2)]  # MARK:gathered


    def _rows_picked(pick, mesh, x, c):
        def body(x, c):
            y = x * x
            return pick(y) * jnp.cos(c)

        return jax.shard_map(body, mesh=mesh, in_specs=(P(TP, None), P(TP, None)), out_specs=P(TP, None))(x, c)


    def evens_strided(x, c, *, mesh):
        return _rows_picked(_evens_strided, mesh, x, c)


    def evens_reshaped(x, c, *, mesh):
        return _rows_picked(_evens_reshaped, mesh, x, c)


    def evens_gathered(x, c, *, mesh):
        return _rows_picked(_evens_gathered, mesh, x, c)


    def _fused(w, i, cols, flip):  # this device's [a | b] columns of w as one fused weight
        w_a = lax.dynamic_slice_in_dim(w, i * cols, cols, axis=1)
        w_b = lax.dynamic_slice_in_dim(w, H + i * cols, cols, axis=1)
        w_b = w_b[:, ::-1] if flip else w_b  # MARK:fused-flip
        return jnp.concatenate([w_a, w_b], axis=1)


    def _gated_fused(x, w, wo, mesh, flip, b_start):
        cols = H // mesh.shape[TP]

        def body(x, w, wo):
            y = x @ _fused(w, lax.axis_index(TP), cols, flip)
            a, b = y[:, :cols], y[:, b_start * cols : (b_start + 1) * cols]  # MARK:fused-read
            return lax.psum((a * b) @ wo, TP)

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P(TP, None)), out_specs=P())(x, w, wo)


    def gated_tp_fused_wrong_read(x, w, wo, *, mesh):
        return _gated_fused(x, w, wo, mesh, flip=False, b_start=0)


    def gated_tp_fused_wrong_weight(x, w, wo, *, mesh):
        return _gated_fused(x, w, wo, mesh, flip=True, b_start=1)


    def rows_inputs():
        return (jax.ShapeDtypeStruct((8, 4), jnp.float32),)


    def row_sum(x):
        return jnp.sum(x, axis=0)


    def _halves(x, sign, offset, mesh):  # each shard sums its rows in two halves, then the shards
        def body(x):
            half = x.shape[0] // 2
            a = jnp.sum(x[:half], axis=0)  # MARK:first-half
            s = a + sign * jnp.sum(x[half:], axis=0)
            return lax.psum(s, TP) + offset  # MARK:offset-sum

        return jax.shard_map(body, mesh=mesh, in_specs=(P(TP, None),), out_specs=P())(x)


    def row_sum_offset(x, *, mesh):
        return _halves(x, 1.0, 1.0, mesh)


    def row_sum_difference(x, *, mesh):
        return _halves(x, -1.0, 0.0, mesh)


    def seq_inputs():
        f = jnp.float32
        return (jax.ShapeDtypeStruct((8, 4), f), jax.ShapeDtypeStruct((4, 4), f), jax.ShapeDtypeStruct((8, 4), f))


    def causal_scores(x, w, table):
        s = (x @ w) @ x.T
        allowed = jnp.arange(8)[:, None] >= jnp.arange(8)[None, :]
        return jnp.where(allowed, s, -1e9)


    def causal_scores_strict(x, w, table, *, mesh):
        def body(xs, w, x):
            rows = lax.axis_index(TP) * xs.shape[0] + jnp.arange(xs.shape[0])
            allowed = rows[:, None] > jnp.arange(8)[None, :]  # MARK:mask
            return jnp.where(allowed, (xs @ w) @ x.T, -1e9)

        return jax.shard_map(body, mesh=mesh, in_specs=(P(TP, None), P(), P()), out_specs=P(TP, None))(x, w, x)


    def with_positions(x, w, table):
        return jnp.tanh(x + table) @ w


    def with_positions_no_offset(x, w, table, *, mesh):
        def body(xs, w, table):
            positions = jnp.arange(xs.shape[0])  # MARK:positions
            return jnp.tanh(xs + jnp.take(table, positions, axis=0)) @ w

        return jax.shard_map(body, mesh=mesh, in_specs=(P(TP, None), P(), P()), out_specs=P(TP, None))(x, w, table)


    def with_positions_offset_line(x, w, table, *, mesh):
        def body(xs, w, table):
            offset = lax.axis_index(TP) * 4  # MARK:offset-line
            rows = lax.dynamic_slice_in_dim(table, offset, xs.shape[0])
            return jnp.tanh(xs + rows) @ w

        return jax.shard_map(body, mesh=mesh, in_specs=(P(TP, None), P(), P()), out_specs=P(TP, None))(x, w, table)


    def _long_table(f=jnp.cos):  # rows for 32 positions, more than the 8 a sequence has
        return f(jnp.arange(32.0)[:, None] * jnp.arange(1.0, 5.0)[None, :])


    def _apply_rows(x, rows):  # shared by both programs, as a RoPE helper is
        return jnp.tanh(x * rows[:, None, :])[:, 0, :]


    def with_long_table(x, w, table):
        return _apply_rows(x, _long_table()[:8]) @ w


    def _long_table_rows(x, w, mesh, start, f):
        def body(xs, w):
            rows = lax.dynamic_slice_in_dim(_long_table(f), start(lax.axis_index(TP)), xs.shape[0])  # MARK:rows-cut
            return _apply_rows(xs, rows) @ w

        return jax.shard_map(body, mesh=mesh, in_specs=(P(TP, None), P()), out_specs=P(TP, None))(x, w)


    def with_long_table_global_offset(x, w, table, *, mesh):
        return _long_table_rows(x, w, mesh, lambda i: i * 8, jnp.cos)  # MARK:global-offset


    def with_long_table_other_table(x, w, table, *, mesh):
        return _long_table_rows(x, w, mesh, lambda i: i * 4, jnp.sin)


    def _rotate(x, positions):  # shared by both programs: only the positions they pass differ
        angles = positions.astype(jnp.float32)[:, None] * jnp.arange(1.0, 5.0)[None, :]
        return x * jnp.cos(angles)


    def rotated(x, w, table):
        return _rotate(x, jnp.arange(8)) @ w


    def rotated_local_positions(x, w, table, *, mesh):
        def body(xs, w):
            pos = jnp.arange(xs.shape[0])  # MARK:local-positions
            return _rotate(xs, pos) @ w

        return jax.shard_map(body, mesh=mesh, in_specs=(P(TP, None), P()), out_specs=P(TP, None))(x, w)


    def rotated_pairs(x, w, table):
        c = jnp.cos(jnp.arange(8.0)[:, None] * jnp.arange(1.0, 3.0)[None, :])
        a, b = x[:, 0::2], x[:, 1::2]
        return jnp.stack([a * c - b, b * c + a], axis=-1).reshape(8, 4) @ w


    def rotated_pairs_concatenated(x, w, table, *, mesh):
        def body(xs, w):
            pos = lax.axis_index(TP) * 4 + jnp.arange(4)
            c = jnp.cos(pos[:, None].astype(jnp.float32) * jnp.arange(1.0, 3.0)[None, :])
            a, b = xs[:, 0::2], xs[:, 1::2]
            y = jnp.concatenate([a * c - b, b * c + a], axis=-1)  # MARK:concat
            return y @ w

        return jax.shard_map(body, mesh=mesh, in_specs=(P(TP, None), P()), out_specs=P(TP, None))(x, w)


    def per_head_inputs():
        f = jnp.float32
        return (jax.ShapeDtypeStruct((4, 8), f), jax.ShapeDtypeStruct((8, 4, 6), f))


    def per_head_scores(x, w):
        t = jnp.einsum("sd,dhe->she", x, w)
        q, k = t[..., :2], t[..., 2:4]
        return jnp.einsum("qhd,khd->hqk", q, k)


    def per_head_scores_swapped(x, w, *, mesh):
        def body(x, w):
            t = jnp.einsum("sd,dhe->she", x, w)
            q, k = t[..., :2], t[..., 4:]  # MARK:swapped
            return jnp.einsum("qhd,khd->hqk", q, k)

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, TP, None)), out_specs=P(TP, None, None))(x, w)


    def router_inputs():
        f = jnp.float32
        return (jax.ShapeDtypeStruct((8, 4), f), jax.ShapeDtypeStruct((4, 4), f), jax.ShapeDtypeStruct((4,), f))


    def expert_scale(x, r, w):
        return x * w[jnp.argmax(x @ r, axis=-1)][:, None]


    def expert_scale_strided(x, r, w, *, mesh):
        def body(x, r, w):
            ids = jnp.argmax(x @ r, axis=-1)
            shard = lax.axis_index(TP)
            out = jnp.zeros_like(x)
            for e in range(w.shape[0]):
                g = e * mesh.shape[TP] + shard  # MARK:expert-id
                out = out + jnp.where(ids == g, w[e], 0.0)[:, None] * x
            return lax.psum(out, TP)

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P(TP)), out_specs=P())(x, r, w)


    def head_sum_inputs():
        return (jax.ShapeDtypeStruct((4, 8), jnp.float32), jax.ShapeDtypeStruct((8, 32), jnp.float32))


    def head_sums(x, w):
        q, v = jnp.split(x @ w, 2, axis=-1)
        return jnp.einsum("thd,thd->th", q.reshape(4, 4, 4), jnp.tanh(v.reshape(4, 4, 4)))


    def head_sums_tp(offset_of):
        def body(x, w):
            dev = lax.axis_index(TP)
            q = x @ lax.dynamic_slice_in_dim(w, dev * 8, 8, axis=1)
            v = x @ lax.dynamic_slice_in_dim(w, offset_of(dev), 8, axis=1)  # MARK:head-slice
            return jnp.einsum("thd,thd->th", q.reshape(4, 2, 4), jnp.tanh(v.reshape(4, 2, 4)))

        return body


    def head_sums_tp_offset_in_heads(x, w, *, mesh):
        body = head_sums_tp(lambda dev: 16 + dev * 2)  # MARK:head-offset
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P()), out_specs=P(None, TP))(x, w)


    def head_sums_tp_next_group(x, w, *, mesh):
        body = head_sums_tp(lambda dev: 16 + (1 - dev) * 8)
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P()), out_specs=P(None, TP))(x, w)


    def lse(x):
        top = jnp.max(x, axis=-1)
        return jnp.log(jnp.sum(jnp.exp(x - top[:, None]), axis=-1)) + top


    def lse_vocab_shift_subtracted(x, *, mesh):
        def body(x):
            top = lax.pmax(jnp.max(x, axis=-1), TP)
            z = lax.psum(jnp.sum(jnp.exp(x - top[:, None]), axis=-1), TP)
            return jnp.log(z) - top  # MARK:lse-shift

        return jax.shard_map(body, mesh=mesh, in_specs=(P(None, TP),), out_specs=P())(x)


    def lse_vocab_unsummed(x, *, mesh):
        def body(x):
            top = lax.pmax(jnp.max(x, axis=-1), TP)
            z = jnp.sum(jnp.exp(x - top[:, None]), axis=-1)  # MARK:lse-unsummed
            return jnp.log(z) + top

        return jax.shard_map(body, mesh=mesh, in_specs=(P(None, TP),), out_specs=P(), check_vma=False)(x)


    def columns_uncut(x, c, *, mesh):
        def body(x, c):
            y = x * x
            return y * jnp.cos(c)  # MARK:uncut

        return jax.shard_map(body, mesh=mesh, in_specs=(P(None, TP), P()), out_specs=P(), check_vma=False)(x, c)
    """
)

MANIFEST = textwrap.dedent(
    """
    version: 1
    models:
      - {name: gated, reference: models.py:gated, distributed: models.py:gated_tp_wrong_offset,
         inputs: models.py:inputs, mesh: {tp: 2}}
      - {name: rotated-inline, reference: models.py:gated, distributed: models.py:gated_tp_rotated_inline,
         inputs: models.py:inputs, mesh: {tp: 4}}
      - {name: rotated-named, reference: models.py:gated, distributed: models.py:gated_tp_rotated_named,
         inputs: models.py:inputs, mesh: {tp: 4}}
      - {name: rotated-argument, reference: models.py:gated, distributed: models.py:gated_tp_rotated_argument,
         inputs: models.py:inputs, mesh: {tp: 4}}
      - {name: table-rows, reference: models.py:scaled_by_table, distributed: models.py:scaled_by_table_sp,
         inputs: models.py:table_inputs, mesh: {tp: 4}}
      - {name: rms, reference: models.py:rms, distributed: models.py:rms_tp_local_width,
         inputs: models.py:norm_inputs, mesh: {tp: 2}}
      - {name: roll, reference: models.py:roll, distributed: models.py:roll_ring_left,
         inputs: models.py:roll_inputs, mesh: {tp: 4}}
      - {name: minor-split, reference: models.py:head_scores, distributed: models.py:head_scores_minor_split,
         inputs: models.py:heads_inputs, mesh: {tp: 2}}
      - {name: heads-first-doubled, reference: models.py:head_scores,
         distributed: models.py:head_scores_heads_first_doubled, inputs: models.py:heads_inputs, mesh: {tp: 2}}
      - {name: pipe-backwards, reference: models.py:pipe, distributed: models.py:pipe_backwards,
         inputs: models.py:pipe_inputs, mesh: {tp: 4}}
      - {name: pipe-transposed, reference: models.py:pipe, distributed: models.py:pipe_transposed,
         inputs: models.py:pipe_inputs, mesh: {tp: 4}}
      - {name: evens-strided, reference: models.py:first_half, distributed: models.py:evens_strided,
         inputs: models.py:pair_inputs, mesh: {tp: 2}}
      - {name: evens-reshaped, reference: models.py:first_half, distributed: models.py:evens_reshaped,
         inputs: models.py:pair_inputs, mesh: {tp: 2}}
      - {name: evens-gathered, reference: models.py:first_half, distributed: models.py:evens_gathered,
         inputs: models.py:pair_inputs, mesh: {tp: 2}}
      - {name: uncut, reference: models.py:second_half, distributed: models.py:columns_uncut,
         inputs: models.py:pair_inputs, mesh: {tp: 2}}
      - {name: halves-offset, reference: models.py:row_sum, distributed: models.py:row_sum_offset,
         inputs: models.py:rows_inputs, mesh: {tp: 2}}
      - {name: halves-difference, reference: models.py:row_sum, distributed: models.py:row_sum_difference,
         inputs: models.py:rows_inputs, mesh: {tp: 2}}
      - {name: fused-read, reference: models.py:gated, distributed: models.py:gated_tp_fused_wrong_read,
         inputs: models.py:inputs, mesh: {tp: 2}}
      - {name: fused-weight, reference: models.py:gated, distributed: models.py:gated_tp_fused_wrong_weight,
         inputs: models.py:inputs, mesh: {tp: 2}}
      - {name: mask-strict, reference: models.py:causal_scores, distributed: models.py:causal_scores_strict,
         inputs: models.py:seq_inputs, mesh: {tp: 2}}
      - {name: positions-no-offset, reference: models.py:with_positions,
         distributed: models.py:with_positions_no_offset, inputs: models.py:seq_inputs, mesh: {tp: 2}}
      - {name: positions-offset-line, reference: models.py:with_positions,
         distributed: models.py:with_positions_offset_line, inputs: models.py:seq_inputs, mesh: {tp: 4}}
      - {name: long-table-global-offset, reference: models.py:with_long_table,
         distributed: models.py:with_long_table_global_offset, inputs: models.py:seq_inputs, mesh: {tp: 2}}
      - {name: long-table-other-table, reference: models.py:with_long_table,
         distributed: models.py:with_long_table_other_table, inputs: models.py:seq_inputs, mesh: {tp: 2}}
      - {name: local-positions-shared-helper, reference: models.py:rotated,
         distributed: models.py:rotated_local_positions, inputs: models.py:seq_inputs, mesh: {tp: 2}}
      - {name: pairs-concatenated, reference: models.py:rotated_pairs,
         distributed: models.py:rotated_pairs_concatenated, inputs: models.py:seq_inputs, mesh: {tp: 2}}
      - {name: expert-id-strided, reference: models.py:expert_scale, distributed: models.py:expert_scale_strided,
         inputs: models.py:router_inputs, mesh: {tp: 2}}
      - {name: offset-in-heads, reference: models.py:head_sums, distributed: models.py:head_sums_tp_offset_in_heads,
         inputs: models.py:head_sum_inputs, mesh: {tp: 2}}
      - {name: next-group, reference: models.py:head_sums, distributed: models.py:head_sums_tp_next_group,
         inputs: models.py:head_sum_inputs, mesh: {tp: 2}}
      - {name: lse-shift, reference: models.py:lse, distributed: models.py:lse_vocab_shift_subtracted,
         inputs: models.py:norm_inputs, mesh: {tp: 2}}
      - {name: lse-unsummed, reference: models.py:lse, distributed: models.py:lse_vocab_unsummed,
         inputs: models.py:norm_inputs, mesh: {tp: 2}}
      - {name: per-head-swapped, reference: models.py:per_head_scores,
         distributed: models.py:per_head_scores_swapped, inputs: models.py:per_head_inputs, mesh: {tp: 2}}
    """
)


def line_of(mark: str) -> int:
    return model_package.line_of(MODELS, mark)


@pytest.fixture(scope="module")
def tmp_manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("localize_models"), "models.py", MODELS, MANIFEST)


@pytest.fixture(scope="module")
def zoo_manifest():
    return load_manifest(REPO / "configs/zoo.yaml")


def localize(manifest, name: str, with_reference: bool = True, room: int | None = None):
    """`room`: the rows the e-graph may still grow by after the proof (its size budget), if given."""
    captured = model_package.capture_named(manifest, name)
    programs = build_programs(parse_module(captured.reference_hlo), parse_module(captured.distributed_hlo),
                              captured.inputs, captured.outputs, captured.num_devices)
    proof = saturate(programs)
    if room is not None:
        proof.nodes = size(proof.egraph) + room
    proved = [list(row) for row in proof.proved]
    assert not proof.all_proved, name
    outputs = {id(t) for dev in programs.device_outputs for t in dev}
    defect = first_defect(programs.distributed_events, proof, programs.evaluator, axis_groups(captured.mesh), outputs,
                          reference_events=programs.reference_events if with_reference else None)
    assert proof.proved == proved  # localization never touches the verdict
    assert defect is not None, name
    path, line = source_of(defect.inst, captured.repo_root)
    return f"{path}:{line}", defect.message


def assert_says(message: str, *words: str) -> None:
    missing = [w for w in words if w not in message]
    assert not missing, (missing, message)


def test_wrong_fused_offset_points_at_the_slice_not_at_the_scores(zoo_manifest):
    where, message = localize(zoo_manifest, "fused-qkv-tp-wrong-k-offset")
    assert where == "examples/zoo/fused_qkv.py:55"
    assert_says(message, "`k`", "reference's q", "common.py:16")


def test_downstream_op_alone_without_reference_events(zoo_manifest):
    where, _ = localize(zoo_manifest, "fused-qkv-tp-wrong-k-offset", with_reference=False)
    assert where == "examples/zoo/common.py:16"


# zoo model -> (the line of the defect, words its message must say)
ZOO = {
    # the wrong head size: the Python line that computed it
    "attention-tp-global-heads": ("examples/zoo/attention.py:50", ("`head_dim`", "(2, 8, 4, 2)", "(2, 8, 4, 8)")),
    # a missing position offset: the positions
    "rope-sp-no-offset": ("examples/zoo/rope.py:39", ("same window", "common.py")),
    "layernorm-tp-local-width": ("examples/zoo/norms.py:61", ("`width`", " 8 ", "32")),
    # The residual added before the reduce-scatter: the add itself is the defect, its partial-sum
    # operand is as it should be (not traced back).
    "sp-block-residual-before-scatter": ("examples/zoo/sequence_parallel.py:47", ()),
    # Every operand of the scores is a slice of the right reference value, but shard 1's KV head
    # window comes back to KV head 0's on shard 2: the map from device to KV head is the defect.
    "gqa-tp4-kv2-round-robin": ("examples/zoo/gqa.py:86", ("`kv_head`", "moves back", "gqa.py:87")),
    # The first unrelated op is a block write; sent the other way round the ring, every output is
    # proved, so the finding is the permutation, at the caller's line that writes it.
    "ring-matmul-wrong-direction": ("examples/zoo/ring.py:49", ("collective-permute", "j-1 mod 4", "j+1 mod 4")),
    # x[..., ::2] is a window of the reference's q, but not the half the reference's multiply
    # takes: the slice, not the rotation's multiply on the next line (the first unrelated op).
    "llama-block-tp4-interleaved-rope": ("examples/zoo/llama_block.py:27", ("[0:8:2]", "common.py:46")),
    # The near miss of a value computed from no input: the shard's first id is used by several
    # computations (both ends of the range, the local id), so the comparison keeps the finding.
    "vocab-embed-tp-off-by-one": ("examples/zoo/vocab_parallel.py:45", ("`compare`",)),
}

# model of MODELS above -> (the MARK of the defect's line, words its message must say)
FRESH = {
    "gated": ("offset", ("wrong window", "`x @ w_b`", "reference's a", "uses b")),
    # the start computed in the slice call itself from the device index: the slice is the line
    "rotated-inline": ("rotated", ("moves back", "[16:20)")),
    "rotated-named": ("index", ("`j`", "moves back")),
    "rms": ("width", ("`n`", "16")),
    "roll": ("pairs", ("the other way",)),  # the ring's pairs, bound to a name
    # A pipeline's ring inside a scan: sent the other way on every tick (the loop run iteration
    # by iteration in the what-if), every output is proved, so the pairs' line leads.
    "pipe-backwards": ("pipe-pairs", ("the other way", "j-1 mod 4", "j+1 mod 4")),
    # Heads split as (head_dim, heads) and transposed: each device's q is a window of the
    # reference's q with two dims swapped, and the scores contract the heads where the reference
    # contracts head_dim. The transpose leads, not the scores (the first op the proof cannot relate).
    "minor-split": ("minor-split", ("`transpose`", "contracts other dims", "models.py:135")),
    # The near miss: a transpose whose dims the scores follow (heads first) is no defect, even
    # though the proof cannot relate that dot: the doubling on its line is the finding.
    "heads-first-doubled": ("doubled", ()),
    # The helper slices at `group * cols` for whatever group it is given: the caller's argument
    # is where the device-to-part map is written.
    "rotated-argument": ("argument", ("passed here as `group`", "moves back")),
    # The gather reads the right table at rows computed on the line before (constant rows: the
    # gather is read as the concatenation of the table's windows they take, so the rows are named).
    "table-rows": ("rows", ("computed here from no input", "differs from the positions")),
    # Every other column where the reference takes the first half, written three ways: each is a
    # window of the reference's y, just not the one its multiply takes, so the pick is the line.
    "evens-strided": ("strided", ("[0:16:2]", "y[:, :8]")),
    "evens-reshaped": ("reshaped", ("wrong window", "y[:, :8]")),
    "evens-gathered": ("gathered", ("`gather`",)),
    # The near miss: no window is cut at all, so the reference's slice is missing work.
    "uncut": ("uncut", ("without the `slice`",)),
    # A fused projection is a concatenation of windows of the reference's x @ w, no window itself;
    # every read of it is related again, so the wrong read is the finding, not the projection.
    # The first half's sum is no partial sum of the reference's, but its one use is (both halves
    # added): a step of the shard's own, so the finding is the offset added after the psum.
    "halves-offset": ("offset-sum", ("`add`",)),
    # The near miss: the halves are subtracted, so the use is unrelated too and the first half's
    # sum is not passed over: the finding stays before the psum (not at the sum after it).
    "halves-difference": ("first-half", ()),
    "fused-read": ("fused-read", ("not the window", "[0:8]", "[16:32]", "`b`")),
    # The near miss: a part of the fused weight is reversed, so a read of the projection is
    # unrelated too and the projection is no mere layout: the finding is the weight's line.
    "fused-weight": ("fused-flip", ()),
    # A value computed from no input on the line before (a mask, positions) decides what the
    # first unrelated op does with data related to the reference: that line leads.
    "mask-strict": ("mask", ("`allowed`", "from no input", "`select`")),
    "positions-no-offset": ("positions", ("`positions`", "from no input")),
    # The angles come from a helper both programs run; what differs is the positions passed in.
    "local-positions-shared-helper": ("local-positions", ("same window [0:4) of the reference's on every device", "(axis_index) is missing")),
    # The near miss: the cosines computed the line before are used rightly (each product is the
    # reference's); the halves are concatenated where the reference interleaves: the concatenation.
    "pairs-concatenated": ("concat", ("`concatenate`",)),
    # The slice of the table starts at an offset computed on the line before: the offset's line.
    "positions-offset-line": ("offset-line", ("`offset` is computed here",)),
    # Device 1 cuts rows [8:12) of a table both programs make, past the reference's [0:8): a
    # window of the same table at other rows, so the start passed in (the shard times the global
    # length) is the line, though the rows are a slice of no reference value.
    "long-table-global-offset": ("global-offset", ("wrong window", "[8:12)")),
    # Each device's k is a window of the reference's v (the fused per-head projection read at the
    # wrong place): the read, not the scores on the next line.
    "per-head-swapped": ("swapped", ("not the window", "reference's k")),
    # The first expert's global id is the device index plus 0 * n, which emits no op: the name
    # computed from the device index on the way to the comparison is the line, not axis_index.
    "expert-id-strided": ("expert-id", ("`g`", "from no input", "`compare`")),
    # Each device's row maximum is no reference value, but its one use, the pmax, is the
    # reference's maximum (the evaluator folds the local maxima into it, so only the op's operands
    # show the use): a step of the shard's own; the sign of the shift added back is the finding.
    # Device 1's columns [2:10) are a part of the projection the reference splits into heads of 4,
    # but not on a head boundary: the per-device reshape into 2 heads is no part of the reference's
    # heads. The slice leads (not the reshape's per-device shape), at the origin of its start: the
    # lambda passed to the factory that built the step (the factory's call is on no op's stack).
    "offset-in-heads": ("head-offset", ("where the slice starts does not line up", "blocks", "device 1")),
    "lse-shift": ("lse-shift", ("`subtract`",)),
    # Each device's sum of exponentials is its share of the reference's; the log takes it as the
    # whole: the psum is missing where the share is made, not at the log (a nonlinear op).
    "lse-unsummed": ("lse-unsummed", ("share of a sum over mesh axis 'tp'", "`log`", "psum")),
}


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_defect_is_found_where_it_was_made(zoo_manifest, name):
    line, words = ZOO[name]
    where, message = localize(zoo_manifest, name)
    assert where == line
    assert_says(message, *words)


@pytest.mark.parametrize("name", list(FRESH))
def test_fresh_program_defect_is_found_where_it_was_made(tmp_manifest, name):
    mark, words = FRESH[name]
    where, message = localize(tmp_manifest, name)
    assert where.endswith(f"models.py:{line_of(mark)}")
    assert_says(message, *words)


def test_a_pipeline_whose_ring_is_right_is_not_blamed_on_its_pairs(tmp_manifest):
    """The near miss of `pipe-backwards`: the ring sends forward and a stage's weight is transposed;
    no other permutation makes the outputs the reference's, so the pairs are not the finding."""
    where, message = localize(tmp_manifest, "pipe-transposed")
    assert "collective-permute" not in message
    assert not where.endswith(f"models.py:{line_of('pipe-weight') - 1}"), (where, message)


def test_the_pairs_what_if_comes_before_the_walks_hypotheses(tmp_manifest):
    """The repair's proof (every output the reference's with the pairs reversed) needs room in the
    e-graph; the walk's hypotheses, asked first, used it up on a long pipeline (split 9
    gpipe-scan-carry-reverse led at a stage's dot). With 2000 rows left after the proof, the pairs
    still lead: the what-if takes 1500-2000 of them (about 500 before stop 29's facts stated more
    equal terms per op); the walk first leaves it too few."""
    where, message = localize(tmp_manifest, "pipe-backwards", room=2000)
    assert where.endswith(f"models.py:{line_of('pipe-pairs')}"), (where, message)
    assert_says(message, "the other way")


def test_rows_of_a_table_the_reference_never_cuts_are_no_wrong_window(tmp_manifest):
    """The near miss of `long-table-global-offset`: the right rows of another table (sin where the
    reference takes cos). No reference value is a window of that table, so no window is wrong."""
    where, message = localize(tmp_manifest, "long-table-other-table")
    assert "wrong window" not in message, (where, message)


def test_whole_head_groups_of_the_wrong_device_are_no_misaligned_blocks(tmp_manifest):
    """The near miss of `offset-in-heads`: each device takes a whole group of heads, the other
    device's. Its per-device reshape is a part of the reference's heads, so no block is misaligned."""
    where, message = localize(tmp_manifest, "next-group")
    assert "where the slice starts does not line up" not in message, (where, message)
