"""Vocabulary parallelism (equivci/translate/masks.py): window lookups under range masks, their psum
over windows that tile the vocabulary, pmax over windows of a reduced dim, and logsumexp's guards.

The end-to-end models are also in the zoo (vocab-embed-tp, vocab-xent-tp); here the mesh is
smaller, the collapsed collectives are checked numerically against the sums they replace, and
near misses (a gap or an overlap in the cover, a shifted local index) must not verify.
"""

from __future__ import annotations

import dataclasses
import textwrap

import model_package
import numpy as np
import pytest
from model_package import capture_named
from model_package import model_named as _model

from equivci.hlo.ir import Shape
from equivci.hlo.parser import parse_module
from equivci.prove.programs import build_programs
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.elementwise import without_guard
from equivci.translate.evaluator import Evaluator
from equivci.translate.masks import tiles
from equivci.verify.engine import verify_model

MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    V, D, T = 16, 16, 6  # D = V: the oracle draws ids in [0, smallest float dim)


    def embed_inputs():
        return (jax.ShapeDtypeStruct((V, D), jnp.float32), jax.ShapeDtypeStruct((2, T), jnp.int32))


    def embed(table, ids):
        return table[ids]


    def lookup(table, ids, mine, lo):
        return jnp.where(mine[..., None], table[jnp.where(mine, ids - lo, 0)], 0.0)


    def embed_tp(table, ids, *, mesh):
        def body(table, ids):
            lo = lax.axis_index("tp") * table.shape[0]
            mine = (ids >= lo) & (ids < lo + table.shape[0])
            return lax.psum(lookup(table, ids, mine, lo), "tp")

        return jax.shard_map(body, mesh=mesh, in_specs=(P("tp", None), P()), out_specs=P())(table, ids)


    def embed_gap(table, ids, *, mesh):
        def body(table, ids):
            lo = lax.axis_index("tp") * table.shape[0]
            mine = (ids >= lo) & (ids < lo + table.shape[0] - 1)  # MARK:gap
            return lax.psum(lookup(table, ids, mine, lo), "tp")

        return jax.shard_map(body, mesh=mesh, in_specs=(P("tp", None), P()), out_specs=P())(table, ids)


    def embed_overlap(table, ids, *, mesh):
        def body(table, ids):  # the whole table on each device; windows [0, 12) and [4, 16)
            lo = lax.axis_index("tp") * 4
            mine = (ids >= lo) & (ids < lo + 12)
            return lax.psum(lookup(lax.dynamic_slice_in_dim(table, lo, 12), ids, mine, lo), "tp")  # MARK:overlap

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P()), out_specs=P())(table, ids)


    def embed_shifted(table, ids, *, mesh):
        def body(table, ids):
            lo = lax.axis_index("tp") * table.shape[0]
            mine = (ids >= lo - 1) & (ids < lo + table.shape[0] - 1)  # MARK:shifted
            return lax.psum(lookup(table, ids, mine, lo - 1), "tp")

        return jax.shard_map(body, mesh=mesh, in_specs=(P("tp", None), P()), out_specs=P())(table, ids)


    def _clipped(table, ids, mesh, short):
        # Offset ids first, then test and clip the local index (jnp.clip: max then min).
        def body(table, ids):
            n = table.shape[0]
            local = ids - lax.axis_index("tp") * n
            rows = jnp.take(table, jnp.clip(local, 0, n - 1 - short), axis=0)
            return lax.psum(rows * ((local >= 0) & (local < n))[..., None].astype(rows.dtype), "tp")

        return jax.shard_map(body, mesh=mesh, in_specs=(P("tp", None), P()), out_specs=P())(table, ids)


    def embed_clipped(table, ids, *, mesh):
        return _clipped(table, ids, mesh, 0)


    def embed_clipped_short(table, ids, *, mesh):
        return _clipped(table, ids, mesh, 1)


    def head_inputs():
        return (jax.ShapeDtypeStruct((T, D), jnp.float32), jax.ShapeDtypeStruct((D, V), jnp.float32),
                jax.ShapeDtypeStruct((V,), jnp.float32), jax.ShapeDtypeStruct((T,), jnp.int32))


    def head_xent(h, w, bias, labels):
        logits = h @ w + bias
        return jax.nn.logsumexp(logits, axis=-1) - jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]


    def _head_xent_tp(h, w, bias, labels, mesh, bias_rows):
        # Each device makes its logits from its columns of the head (a window inside a dot) and
        # clips the local label instead of masking it.
        def body(h, w, bias, labels):
            n = w.shape[1]
            logits = h @ w + bias_rows(bias, n)
            m = lax.pmax(jnp.max(logits, axis=-1), "tp")
            lse = m + jnp.log(lax.psum(jnp.exp(logits - m[:, None]).sum(-1), "tp"))
            local = labels - lax.axis_index("tp") * n
            hit = jnp.take_along_axis(logits, jnp.clip(local, 0, n - 1)[:, None], axis=-1)[:, 0]
            return lse - lax.psum(jnp.where((local >= 0) & (local < n), hit, 0.0), "tp")

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp"), P()), out_specs=P())(h, w, bias, labels)


    def head_xent_tp(h, w, bias, labels, *, mesh):
        return _head_xent_tp(h, w, bias, labels, mesh, lambda b, n: b)


    def head_xent_wrong_bias(h, w, bias, labels, *, mesh):  # every device adds the first shard's bias
        return _head_xent_tp(h, w, bias, labels, mesh, lambda b, n: lax.all_gather(b, "tp", tiled=True)[:n])


    def row_max(logits):
        return jnp.max(logits, axis=-1)


    def max_inputs():
        return (jax.ShapeDtypeStruct((T, V), jnp.float32),)


    def row_max_tp(logits, *, mesh):
        body = lambda x: lax.pmax(jnp.max(x, axis=-1), "tp")
        return jax.shard_map(body, mesh=mesh, in_specs=(P(None, "tp"),), out_specs=P())(logits)


    def row_max_gap(logits, *, mesh):
        body = lambda x: lax.pmax(jnp.max(x[:, 1:], axis=-1), "tp")  # MARK:max_gap
        return jax.shard_map(body, mesh=mesh, in_specs=(P(None, "tp"),), out_specs=P())(logits)


    def xent_inputs():
        return (jax.ShapeDtypeStruct((T, V), jnp.float32), jax.ShapeDtypeStruct((T,), jnp.int32))


    def xent(logits, labels):
        lse = jax.nn.logsumexp(logits, axis=-1)
        return lse - jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]


    def xent_tp(logits, labels, *, mesh):
        def body(logits, labels):
            lo = lax.axis_index("tp") * logits.shape[-1]
            m = lax.pmax(jnp.max(logits, axis=-1), "tp")
            lse = m + jnp.log(lax.psum(jnp.sum(jnp.exp(logits - m[:, None]), axis=-1), "tp"))
            mine = (labels >= lo) & (labels < lo + logits.shape[-1])
            local = jnp.take_along_axis(logits, jnp.where(mine, labels - lo, 0)[:, None], axis=-1)[:, 0]
            return lse - lax.psum(jnp.where(mine, local, 0.0), "tp")

        return jax.shard_map(body, mesh=mesh, in_specs=(P(None, "tp"), P()), out_specs=P())(logits, labels)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: embed, reference: vocab.py:embed, distributed: vocab.py:embed_tp, inputs: vocab.py:embed_inputs, mesh: {tp: 2}}
      - {name: gap, reference: vocab.py:embed, distributed: vocab.py:embed_gap, inputs: vocab.py:embed_inputs, mesh: {tp: 2}}
      - {name: overlap, reference: vocab.py:embed, distributed: vocab.py:embed_overlap, inputs: vocab.py:embed_inputs, mesh: {tp: 2}}
      - {name: shifted, reference: vocab.py:embed, distributed: vocab.py:embed_shifted, inputs: vocab.py:embed_inputs, mesh: {tp: 2}}
      - {name: clipped, reference: vocab.py:embed, distributed: vocab.py:embed_clipped, inputs: vocab.py:embed_inputs, mesh: {tp: 2}}
      - {name: clipped_short, reference: vocab.py:embed, distributed: vocab.py:embed_clipped_short, inputs: vocab.py:embed_inputs, mesh: {tp: 2}}
      - {name: head_xent, reference: vocab.py:head_xent, distributed: vocab.py:head_xent_tp, inputs: vocab.py:head_inputs, mesh: {tp: 2}}
      - {name: wrong_bias, reference: vocab.py:head_xent, distributed: vocab.py:head_xent_wrong_bias, inputs: vocab.py:head_inputs, mesh: {tp: 2}}
      - {name: row_max, reference: vocab.py:row_max, distributed: vocab.py:row_max_tp, inputs: vocab.py:max_inputs, mesh: {tp: 2}}
      - {name: max_gap, reference: vocab.py:row_max, distributed: vocab.py:row_max_gap, inputs: vocab.py:max_inputs, mesh: {tp: 2}}
      - {name: xent, reference: vocab.py:xent, distributed: vocab.py:xent_tp, inputs: vocab.py:xent_inputs, mesh: {tp: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("vocab_models"), "vocab.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["embed", "clipped", "row_max", "xent", "head_xent"])
def test_vocab_parallel_programs_verify(manifest, name):
    model = _model(manifest, name)
    result = verify_model(model, manifest, capture_named(manifest, model.name))
    assert result.status is Status.VERIFIED, result.findings
    # The proof took the ids to be valid indices: the verdict says so, where the reference indexes.
    notes = [(f.severity, f.path, f.message.split(":")[0]) for f in result.findings]
    expected = {"embed": [("note", "vocab.py", "proved for input [1] in [0, 15]")],
                "clipped": [("note", "vocab.py", "proved for input [1] in [0, 15]")],
                "head_xent": [("note", "vocab.py", "proved for input [3] in [0, 15]")],
                "xent": [("note", "vocab.py", "proved for input [1] in [0, 15]")], "row_max": []}
    assert notes == expected[name]


@pytest.mark.parametrize("name", ["embed", "row_max"])
def test_a_manifest_that_refuses_index_assumptions_gets_unproven_for_a_proof_resting_on_one(manifest, name):
    """`assume_valid_indices: false`: the embedding's proof holds only for ids in [0, 15], so it is
    `unproven` with the assumption as its error; row_max assumes nothing and stays verified."""
    model = dataclasses.replace(_model(manifest, name), assume_valid_indices=False)
    result = verify_model(model, manifest, capture_named(manifest, name))
    if name == "row_max":
        assert result.status is Status.VERIFIED and result.findings == (), result.findings
        return
    assert result.status is Status.UNPROVEN, result.findings
    [finding] = result.findings
    assert finding.severity == "error" and finding.path == "vocab.py", finding
    assert finding.message.startswith("proved for input [1] in [0, 15]") and "assume_valid_indices" in finding.message


# near miss -> the windows of the lookups recognised: the gap and the overlap get past the lookup
# check and are stopped by the cover check; the shifted index is not a lookup of ids' rows at all.
NEAR_MISSES = {"gap": [(0, 7), (8, 15)], "overlap": [(0, 12), (4, 16)], "shifted": [], "max_gap": []}


@pytest.mark.parametrize("name", list(NEAR_MISSES))
def test_near_misses_are_not_verified(manifest, name):
    model = _model(manifest, name)
    captured = capture_named(manifest, model.name)
    programs = _programs(captured)
    assert [(k.window.lo, k.window.hi) for k in programs.evaluator.masked_rows.values()] == NEAR_MISSES[name]
    result = verify_model(model, manifest, captured)
    assert result.status is Status.MISMATCH, (name, result.findings)
    # The overlap's window size is written twice, in the ownership mask and in the slice it guards
    # (the line before the MARK): either is the line to change; the other near misses have one.
    marked = model_package.line_of(MODELS, name)
    assert result.findings[0].line in ({marked, marked - 1} if name == "overlap" else {marked}), result.findings


def test_index_clipped_short_is_a_lookup_only_where_the_clip_leaves_it(manifest):
    """The near miss of `clipped`: the clip keeps ids - lo only in [0, n - 2], so each shard's
    lookup is the table's rows on one id fewer than its mask admits, and the sum is not the lookup."""
    model = _model(manifest, "clipped_short")
    captured = capture_named(manifest, model.name)
    ev = _programs(captured).evaluator
    assert [(k.window.lo, k.window.hi) for k in ev.masked_rows.values()] == [(0, 7), (8, 15)]
    assert verify_model(model, manifest, captured).status is Status.MISMATCH


def test_logits_with_a_bias_of_another_window_are_not_a_window(manifest):
    """The near miss of `head_xent`: every device adds the first shard's bias, so the second
    device's logits are not a window of the reference's: only the first device's lookup is one."""
    model = _model(manifest, "wrong_bias")
    captured = capture_named(manifest, model.name)
    ev = _programs(captured).evaluator
    assert [(k.window.lo, k.window.hi) for k in ev.masked_rows.values()] == [(0, 8)]
    assert verify_model(model, manifest, captured).status is Status.MISMATCH


def _programs(captured):
    return build_programs(parse_module(captured.reference_hlo), parse_module(captured.distributed_hlo),
                          captured.inputs, captured.outputs, captured.num_devices)


@pytest.mark.parametrize("name", ["embed", "clipped", "row_max", "xent", "head_xent"])
def test_collapsed_collectives_equal_the_sums_they_replace(manifest, name):
    """On random inputs (integers as valid indices), each all-reduce's term is the elementwise
    reduction of its members, and each window lookup is the full lookup where its mask holds."""
    captured = capture_named(manifest, name)
    programs = _programs(captured)
    ev = programs.evaluator
    rng = np.random.default_rng(0)
    params = {k: rng.integers(0, 16, leaf.shape) if leaf.dtype == "int32" else rng.standard_normal(leaf.shape)
              for k, leaf in enumerate(captured.inputs)}
    value = lambda t: evaluate(t, params, ev.values)  # noqa: E731
    by_name = {e.inst.name: e for e in programs.distributed_events}
    reductions = [e for e in programs.distributed_events if e.inst.opcode == "all-reduce"]
    assert reductions
    for event in reductions:
        members = [value(t) for t in by_name[event.inst.operands[0]].values]
        combine = np.maximum if "pmax" in event.inst.name else np.add
        expected = members[0]
        for m in members[1:]:
            expected = combine(expected, m)
        np.testing.assert_allclose(value(event.values[0]), expected, rtol=1e-6, atol=1e-6)
    for rows, known in ev.masked_rows.items():
        ids = value(known.window.x).reshape(-1)[known.labels]
        holds = (ids >= known.window.lo) & (ids < known.window.hi)
        assert holds.any()
        np.testing.assert_array_equal(value(rows)[holds], value(known.full)[holds])


def test_logsumexp_guards_are_identities():
    ev = Evaluator(None, TermTable(), 1)
    x = ev.table.make("param", (0,), (), (3, 5), "f32")
    s = Shape("f32", (3, 5))
    minus_inf = ev.const(np.full((3, 5), -np.inf, np.float32), "f32")
    top = ev.normal("binary", ("maximum",), [x, minus_inf], s)
    exps = ev.normal("reduce", ("add", "2:1"), [ev.normal("unary", ("exponential",), [x], s)], Shape("f32", (3,)))
    finite = ev.normal("unary", ("is-finite",), [x], Shape("pred", (3, 5)))
    zero = ev.const(np.zeros((3, 5), np.float32), "f32")
    cases = [(top, ["maximum", [x, minus_inf]], x),
             (ev.normal("unary", ("abs",), [exps], Shape("f32", (3,))), ["abs", [exps]], exps),
             (ev.normal("ternary", ("select",), [finite, x, zero], s), ["select", [finite, x, zero]], x)]
    params = {0: np.random.default_rng(1).standard_normal((3, 5))}
    for plain, (op, args), simplified in cases:
        assert without_guard(ev, op, args) is simplified
        np.testing.assert_allclose(evaluate(plain, params, ev.values), evaluate(simplified, params, ev.values))
    assert without_guard(ev, "abs", [x]) is None  # x may be negative
    assert without_guard(ev, "maximum", [x, zero]) is None
    y = ev.table.make("param", (1,), (), (3, 5), "f32")
    other_finite = ev.normal("unary", ("is-finite",), [y], Shape("pred", (3, 5)))
    negated = ev.normal("unary", ("not",), [ev.normal("binary", ("compare-GT:f32",), [x, zero], Shape("pred", (3, 5)))],
                        Shape("pred", (3, 5)))
    assert without_guard(ev, "select", [other_finite, x, zero]) is None  # y may be inf where x is not
    assert without_guard(ev, "select", [negated, x, zero]) is None  # another predicate: zero where x > 0


def test_tiles_needs_every_value_exactly_once():
    assert tiles([(8, 16), (0, 8)], 0, 16)
    assert not tiles([(0, 8), (9, 16)], 0, 16)  # 8 is in no window
    assert not tiles([(0, 9), (8, 16)], 0, 16)  # 8 is in two
    assert tiles([(0, 9), (8, 16)], 0, 16, overlap=True)
    assert not tiles([(0, 8)], 0, 16)


def test_a_mask_narrows_only_its_own_ids_and_never_past_the_dtype():
    from equivci.translate.masks import bounds_under_mask

    ev = Evaluator(None, TermTable(), 1)
    ids = ev.table.make("param", (0,), (), (6,), "s32")
    other = ev.table.make("param", (1,), (), (6,), "s32")
    c = lambda v: ev.const(np.full((6,), v, np.int32), "s32")  # noqa: E731
    test = lambda x, lo, hi: ev.normal("binary", ("and",), [  # noqa: E731
        ev.normal("binary", ("compare-GE:s32",), [x, c(lo)], Shape("pred", (6,))),
        ev.normal("binary", ("compare-LT:s32",), [x, c(hi)], Shape("pred", (6,)))], Shape("pred", (6,)))
    shifted = ev.normal("binary", ("subtract",), [ids, c(8)], Shape("s32", (6,)))
    assert bounds_under_mask(ev, test(ids, 8, 16), shifted) == (0, 7)
    assert bounds_under_mask(ev, test(other, 8, 16), shifted) is None  # a test of other ids says nothing
    below = ev.normal("binary", ("compare-LT:s32",), [ids, c(16)], Shape("pred", (6,)))
    assert bounds_under_mask(ev, below, shifted) is None  # ids - 8 may wrap around below
    ev.bounds[ids] = (0.0, 31.0)
    assert bounds_under_mask(ev, below, shifted) == (-8, 7)


def test_bounds_pass_a_convert_only_where_the_new_dtype_holds_them():
    """ids.astype(int8) wraps at 128: bounds [0, 128] kept across it once folded `>= 0` to true and
    verified a masked lookup that drops id 128 (found by bench/mutants.py)."""
    ev = Evaluator(None, TermTable(), 1)
    ids = ev.table.make("param", (0,), (), (6,), "s32")
    ev.bounds[ids] = (0.0, 128.0)
    narrow = lambda dtype: ev.table.make("unary", (f"convert:{dtype}",), (ids,), (6,), dtype)  # noqa: E731
    for dtype, kept in (("s8", False), ("u8", True), ("s16", True), ("s64", True)):
        t = narrow(dtype)
        ev.bound(t, ids)
        assert (t in ev.bounds) is kept, dtype
    ev.bounds[ids] = (-1.0, 5.0)
    t = narrow("u32")
    ev.bound(t, ids)
    assert t not in ev.bounds  # -1 wraps to 2**32 - 1


def test_a_range_test_of_integers_with_constant_ends_is_its_window():
    """(x >= lo) & (x < hi), with GT / LE as the next integer's GE / LT, holds exactly on the
    window's values; a test against a non-constant end or of floats is no window."""
    from equivci.translate.masks import window_of

    ev = Evaluator(None, TermTable(), 1)
    ids = ev.table.make("param", (0,), (), (6,), "s32")
    ends = ev.table.make("param", (1,), (), (6,), "s32")
    c = lambda v, dtype="s32": ev.const(np.full((6,), v, {"s32": np.int32, "f32": np.float32}[dtype]), dtype)  # noqa: E731
    cmp = lambda d, x, k: ev.normal("binary", (f"compare-{d}:{x.dtype}",), [x, k], Shape("pred", (6,)))  # noqa: E731
    both = lambda p, q: ev.normal("binary", ("and",), [p, q], Shape("pred", (6,)))  # noqa: E731
    for lo_dir, hi_dir in (("GE", "LT"), ("GT", "LE"), ("GE", "LE"), ("GT", "LT")):
        w = window_of(ev, both(cmp(lo_dir, ids, c(3)), cmp(hi_dir, ids, c(7))))
        values = np.arange(-2, 12)
        held = {"GE": values >= 3, "GT": values > 3}[lo_dir] & {"LT": values < 7, "LE": values <= 7}[hi_dir]
        assert w is not None and w.x is ids
        np.testing.assert_array_equal((w.lo <= values) & (values < w.hi), held, err_msg=f"{lo_dir} {hi_dir}")
    assert window_of(ev, both(cmp("GE", ids, ends), cmp("LT", ids, c(7)))) is None
    floats = ev.table.make("param", (2,), (), (6,), "f32")
    assert window_of(ev, both(cmp("GE", floats, c(3, "f32")), cmp("LT", floats, c(7, "f32")))) is None
    assert window_of(ev, both(cmp("GE", ids, c(3)), cmp("LT", ends, c(7)))) is None  # two values tested



def test_an_offset_range_test_is_one_of_the_ids_only_where_the_offset_cannot_wrap():
    """(x >= 1) & (x < 11) with x = ids + 1 tests ids in [0, 10) only where ids + 1 cannot wrap: int8
    ids up to 126 (ids + 1 reaches 127, the largest int8, exactly), not up to 127 (ids + 1 wraps to
    -128); likewise x = ids - 1 (ids in [2, 12)) for ids from -127, not from -128. Where it may wrap,
    the window stays on x."""
    from equivci.translate.masks import window_of

    ev = Evaluator(None, TermTable(), 1)
    s8 = Shape("s8", (6,))
    c = lambda v: ev.const(np.full((6,), v, np.int8), "s8")  # noqa: E731
    cmp = lambda d, x, k: ev.normal("binary", (f"compare-{d}:s8",), [x, k], Shape("pred", (6,)))  # noqa: E731
    cases = [("add", (0, 126), (0, 10)), ("add", (0, 127), None), ("subtract", (-127, 0), (2, 12)),
             ("subtract", (-128, 0), None)]
    for k, (op, (lo, hi), window) in enumerate(cases):
        ids = ev.table.make("param", (k,), (), (6,), "s8")
        ev.bounds[ids] = (float(lo), float(hi))
        x = ev.normal("binary", (op,), [ids, c(1)], s8)
        w = window_of(ev, ev.normal("binary", ("and",), [cmp("GE", x, c(1)), cmp("LT", x, c(11))], Shape("pred", (6,))))
        assert w is not None, (op, lo, hi)
        if window is None:
            assert (w.x, w.lo, w.hi) == (x, 1, 11), (op, lo, hi)
            continue
        assert (w.x, w.lo, w.hi) == (ids, *window), (op, lo, hi)
        values = np.arange(lo, hi + 1)
        shifted = (values + 1 if op == "add" else values - 1).astype(np.int8)  # no wrap in these bounds
        np.testing.assert_array_equal((shifted >= 1) & (shifted < 11), (w.lo <= values) & (values < w.hi))

def test_a_clipped_index_is_a_window_of_the_ids_it_can_hold():
    """clip(ids - 4, 0, 9) leaves ids - 4 as it is for ids in [4, 14): for ids known to lie in [0, 7]
    that is [4, 8), a window inside a table of 8 rows (a lookup by it is then the table's rows
    4..7); for ids of unknown range it stays [4, 14)."""
    from equivci.translate.masks import index_window

    ev = Evaluator(None, TermTable(), 1)
    s = Shape("s32", (6,))
    c = lambda v: ev.const(np.full((6,), v, np.int32), "s32")  # noqa: E731
    ids = ev.table.make("param", (0,), (), (6,), "s32")
    ev.bounds[ids] = (0.0, 7.0)
    other = ev.table.make("param", (1,), (), (6,), "s32")
    for x, hi in ((ids, 8), (other, 14)):
        local = ev.normal("binary", ("subtract",), [x, c(4)], s)
        found = index_window(ev, ev.normal("ternary", ("clamp",), [c(0), local, c(9)], s), 8)
        assert found is not None
        w, shift = found
        assert (w.x, w.lo, w.hi, shift) == (x, 4, hi, 4)
        values = np.arange(-3, 20)
        kept = np.clip(values - 4, 0, 9) == values - 4
        lo, top = ev.bounds_of(x) or (-np.inf, np.inf)
        np.testing.assert_array_equal((w.lo <= values) & (values < w.hi), kept & (lo <= values) & (values <= top))



def test_a_bare_offset_index_is_a_window_of_the_ids_the_gather_does_not_clamp():
    """A gather of a shard's 4 rows at ids - 4 itself (`jnp.take(rows, ids - first, mode="clip")`:
    HLO's gather clamps the index into [0, 3]) reads row ids - 4 for ids in [4, 8) and a clamped row
    elsewhere: checked against XLA's gather for every id; ids - 0 (the first shard) is the window
    [0, 4)."""
    import jax.numpy as jnp

    from equivci.translate.masks import index_window

    ev = Evaluator(None, TermTable(), 1)
    s = Shape("s32", (6,))
    ids = ev.table.make("param", (0,), (), (6,), "s32")
    ev.bounds[ids] = (0.0, 15.0)
    table = np.arange(16 * 3, dtype=np.float32).reshape(16, 3)
    for first in (4, 0):
        local = ev.normal("binary", ("subtract",), [ids, ev.const(np.full((6,), first, np.int32), "s32")], s)
        found = index_window(ev, local, 4)
        assert found is not None
        w, shift = found
        assert (w.x, w.lo, w.hi, shift) == (ids, first, first + 4, first)
        values = np.arange(16, dtype=np.int32)
        taken = np.asarray(jnp.take(jnp.asarray(table[first : first + 4]), jnp.asarray(values - first), axis=0, mode="clip"))
        reads_own_row = np.all(taken == table[values], axis=1)
        np.testing.assert_array_equal((w.lo <= values) & (values < w.hi), reads_own_row)

def test_ids_used_by_several_lookups_are_valid_for_the_smallest_table():
    """An id input that indexes tables of 8 and of 7 rows is taken to be in [0, 6], whichever
    lookup comes first; a lookup by another input or by a float says nothing of it."""
    from equivci.translate.bounds import index_domains

    for sizes in ((8, 7), (7, 8), (7, 7)):
        ev = Evaluator(None, TermTable(), 1)
        ids = ev.table.make("param", (0,), (), (6,), "s32")
        other = ev.table.make("param", (1,), (), (6,), "s32")
        floats = ev.table.make("param", (2,), (), (6,), "f32")
        lookups = [(ids, n, (f"gather{k}",)) for k, n in enumerate(sizes)] + [(other, 3, ("g",)), (floats, 2, ("f",))]
        ev.index_uses.extend(lookups)
        domains = index_domains(ev)
        smallest = sizes.index(min(sizes))
        assert domains[ids] == ((0.0, 6.0), (f"gather{smallest}",)), sizes
        assert domains[other] == ((0.0, 2.0), ("g",)) and floats not in domains
