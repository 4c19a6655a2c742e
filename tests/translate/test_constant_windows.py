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
