"""Constant tables known as windows of one another across unit dims (equivci/translate/constants.py)."""

from __future__ import annotations

import numpy as np

from equivci.terms.ir import TermTable
from equivci.translate.constants import ConstantPool


def _pool_with(table: np.ndarray) -> tuple[ConstantPool, object]:
    pool = ConstantPool()
    term = TermTable().make("const", ("reference",), (), table.shape, "f32")
    pool.add(term, table, "f32")
    return pool, term


def test_rows_of_a_table_with_unit_dims_are_found_along_the_matching_dim():
    table = np.random.default_rng(0).standard_normal((1, 16, 1, 4)).astype(np.float32)
    pool, term = _pool_with(table)
    found = pool.windows(table[0, 8:12, 0, :].copy(), "f32")
    assert [(w.source, w.dim, w.start, w.width, w.reshaped) for w in found] == [(term, 1, 8, 4, True)]


def test_a_window_with_its_own_unit_dims_is_found_in_a_table_without_them():
    table = np.random.default_rng(1).standard_normal((16, 4)).astype(np.float32)
    pool, term = _pool_with(table)
    found = pool.windows(table[4:8].reshape(4, 1, 4), "f32")
    assert [(w.dim, w.start, w.width, w.reshaped) for w in found] == [(0, 4, 4, True)]


def test_near_miss_one_element_off_is_no_window():
    table = np.random.default_rng(2).standard_normal((1, 16, 1, 4)).astype(np.float32)
    pool, _ = _pool_with(table)
    rows = table[0, 8:12, 0, :].copy()
    rows[3, 3] += 1e-3
    assert pool.windows(rows, "f32") == []


def test_near_miss_same_elements_in_another_layout_is_no_window():
    """Unit dims may move; other dims may not: the rows transposed are not a window."""
    table = np.random.default_rng(3).standard_normal((1, 16, 1, 4)).astype(np.float32)
    pool, _ = _pool_with(table)
    assert pool.windows(table[0, 8:12, 0, :].T.copy(), "f32") == []


def test_a_window_of_an_older_table_is_preferred_to_its_own_source():
    reference = np.random.default_rng(4).standard_normal((1, 16, 1, 4)).astype(np.float32)
    longer = np.concatenate([reference[0, :, 0, :], np.ones((48, 4), np.float32)])
    pool, term = _pool_with(reference)
    own = TermTable().make("const", ("longer",), (), longer.shape, "f32")
    pool.add(own, longer, "f32")
    moved = pool.older_windows(longer[8:16], "f32", own)
    assert [(w.source, w.dim, w.start) for w in moved] == [(term, 1, 8)]
    assert pool.older_windows(longer[20:28], "f32", own) == []  # rows only the longer table holds


def test_a_window_several_tables_hold_is_found_in_each():
    """The first rows of a sliding-window mask are the causal mask's rows: both are found (oldest
    first), so a device's rows relate to whichever table the reference uses."""
    causal = np.tril(np.ones((16, 16), dtype=bool))
    band = causal & ~np.tril(np.ones((16, 16), dtype=bool), -4)
    pool = ConstantPool()
    terms = [TermTable().make("const", (name,), (), (16, 16), "pred") for name in ("causal", "band")]
    for term, table in zip(terms, (causal, band)):
        pool.add(term, table, "pred")
    assert [w.source for w in pool.windows(band[0:4], "pred")] == [terms[0]]  # one source by default
    assert [(w.source, w.start) for w in pool.windows(band[0:4], "pred", sources=4)] == [(terms[0], 0), (terms[1], 0)]
    assert [(w.source, w.start) for w in pool.windows(band[4:8], "pred", sources=4)] == [(terms[1], 4)]


def test_near_miss_rows_one_table_holds_are_no_window_of_the_other():
    """The causal mask's first five rows: the wider band's agree with them; the band's first four do,
    its fifth does not (one key fewer): no window of the band. Rows 4..8 of the band differ from a wider
    band's in one element each: no window of it."""
    causal = np.tril(np.ones((16, 16), dtype=bool))
    band = causal & ~np.tril(np.ones((16, 16), dtype=bool), -4)
    wider = causal & ~np.tril(np.ones((16, 16), dtype=bool), -5)
    pool = ConstantPool()
    terms = [TermTable().make("const", (name,), (), (16, 16), "pred") for name in ("causal", "band", "wider")]
    for term, table in zip(terms, (causal, band, wider)):
        pool.add(term, table, "pred")
    assert [(w.source, w.start) for w in pool.windows(causal[0:5], "pred", sources=4)] == [(terms[0], 0), (terms[2], 0)]
    assert [w.source for w in pool.windows(band[4:8], "pred", sources=4)] == [terms[1]]


def test_a_table_laid_out_with_other_unit_dims_is_one_source():
    """A [s, d] table and its [s, d, 1] broadcast operand hold the same windows: only the oldest is
    found (stating the other's windows equal too blew a saturation past 23 GB), while a table of
    other content holding the rows still is."""
    angles = np.cos(np.arange(8.0)[:, None] * np.arange(1.0, 3.0)[None, :]).astype(np.float32)
    doubled = np.concatenate([angles[:4], 2 * angles[4:]])
    pool = ConstantPool()
    terms = [
        TermTable().make("const", (name,), (), shape, "f32")
        for name, shape in (("angles", (8, 2)), ("unit", (8, 2, 1)), ("doubled", (8, 2)))
    ]
    for term, table in zip(terms, (angles, angles[:, :, None], doubled)):
        pool.add(term, table, "f32")
    assert [(w.source, w.start) for w in pool.windows(angles[4:], "f32", sources=4)] == [(terms[0], 4)]
    assert [(w.source, w.start) for w in pool.windows(angles[:4, :, None], "f32", sources=4)] == [
        (terms[0], 0),
        (terms[2], 0),
    ]


def test_a_table_cut_along_two_dims_is_found_at_a_shard_offset():
    """A device of a two-axis mesh holds its rows and its columns of a table: no window along one
    dim, the window along two at multiples of its size there."""
    table = np.random.default_rng(5).standard_normal((4, 6, 3)).astype(np.float32)
    pool, term = _pool_with(table)
    part = table[2:4, 3:6].copy()
    assert pool.windows(part, "f32") == []
    found = pool.two_dim_windows(part, "f32")
    assert [(w.source, w.dim, w.start, w.width, w.across) for w in found] == [(term, 1, 3, 3, (0, 2, 2))]


def test_near_misses_of_two_dim_windows_are_none():
    table = np.random.default_rng(6).standard_normal((4, 6, 3)).astype(np.float32)
    pool, _ = _pool_with(table)
    off = table[2:4, 3:6].copy()
    off[1, 2, 0] += 1e-3  # one element off
    assert pool.two_dim_windows(off, "f32") == []
    assert pool.two_dim_windows(table[2:4, 3:6].transpose(1, 0, 2).copy(), "f32") == []  # another layout
    # not at a multiple of its size: no device's shard (looked up only there)
    assert pool.two_dim_windows(table[1:3, 3:6].copy(), "f32") == []


def test_a_table_the_same_along_both_dims_is_every_shard():
    """A top-k's positions over [rows, experts, tokens] are the same for every row and expert: the
    device's table is each device's window, all found (stated equal by the builder)."""
    positions = np.broadcast_to(np.arange(8, dtype=np.int32), (4, 6, 8)).copy()
    pool = ConstantPool()
    term = TermTable().make("const", ("positions",), (), positions.shape, "s32")
    pool.add(term, positions, "s32")
    found = pool.two_dim_windows(positions[:2, :3].copy(), "s32")
    assert sorted((w.across[1], w.start) for w in found) == [(0, 0), (0, 3), (2, 0), (2, 3)]
