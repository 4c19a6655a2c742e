"""The numpy meaning of HLO ops on folded constants (their dtypes: terms/semantics.NP_DTYPES).

A leaf of translate/: helpers on folded constants. The numpy model of each op is terms/semantics'
(UNARY, BINARY, COMPARE), which the builder folds with.
"""

from __future__ import annotations

import numpy as np


def distinct(value: np.ndarray) -> np.ndarray:
    """`value` with every dim it is broadcast along (stride 0: one element repeated) cut to length 1:
    the same elements, each held once. Constants broadcast to a weight's or the logits' shape are
    views of a few elements; checking them whole costs time and memory in proportion to that shape."""
    if not value.size or all(stride or n <= 1 for stride, n in zip(value.strides, value.shape)):
        return value
    return value[tuple(slice(0, 1) if stride == 0 else slice(None) for stride in value.strides)]


def all_equal(value: np.ndarray) -> bool:
    """All elements equal; NaN fills (a gather's out-of-range value) count as equal to each other."""
    held = distinct(value)
    return bool(value.size) and np.array_equal(held, np.full_like(held, held.flat[0]), equal_nan=True)


def is_identity(reducer: str, value: np.ndarray) -> bool:
    """`value` (a reduce's init) leaves `reducer` unchanged for every element of its dtype: the
    dtype's own lowest/highest value, not a fixed width's (int8's max starts at -128, an unsigned
    max at 0; -2**31 is not int64's lowest). `and`/`or` only over bools: the terms read them as
    logical ops, and a bitwise reduce of integers is another operation."""
    if value.ndim != 0:
        return False
    dtype = value.dtype
    v = value.item()
    if dtype == np.bool_:
        return {"and": v is True, "or": v is False}.get(reducer, False)
    if reducer in ("and", "or"):
        return False
    lowest: float
    highest: float
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        lowest, highest = int(info.min), int(info.max)
    else:
        lowest, highest = float("-inf"), float("inf")
    return {"add": v == 0, "multiply": v == 1, "maximum": v == lowest, "minimum": v == highest}[reducer]
