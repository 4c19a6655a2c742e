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
    v = value.item() if value.ndim == 0 else None
    if v is None:
        return False
    return {
        "add": v == 0,
        "multiply": v == 1,
        "maximum": v == float("-inf") or (isinstance(v, int) and v <= -(2**31)),
        "minimum": v == float("inf") or (isinstance(v, int) and v >= 2**31 - 1),
        "and": v is True or v == 1,
        "or": v is False or v == 0,
    }[reducer]
