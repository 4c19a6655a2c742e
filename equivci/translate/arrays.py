"""The numpy meaning of HLO ops on folded constants (their dtypes: terms/semantics.NP_DTYPES).

A leaf of translate/: the builder folds constants with these, and the numeric checks of index
arithmetic (masks, routing) evaluate with them.
"""

from __future__ import annotations

from collections.abc import Callable

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


def np_unary(op: str, v: np.ndarray):
    table: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "negate": np.negative,
        "abs": np.abs,
        "exponential": np.exp,
        "log": np.log,
        "sqrt": np.sqrt,
        "tanh": np.tanh,
        "not": lambda x: ~x if x.dtype != np.bool_ else np.logical_not(x),
        "sign": np.sign,
        "floor": np.floor,
        "ceil": np.ceil,
        "cosine": np.cos,
        "sine": np.sin,
        "rsqrt": lambda x: 1 / np.sqrt(x),
        "logistic": lambda x: 1 / (1 + np.exp(-x)),
        "exponential-minus-one": np.expm1,
        "log-plus-one": np.log1p,
    }
    return table[op](v) if op in table else None


def np_binary(op: str, a, b, dtype: str):
    integer = dtype[0] in "su" or dtype == "pred"
    if op == "divide" and integer:
        return np.trunc(np.true_divide(a, b))
    if op == "remainder" and integer:
        return np.fmod(a, b)
    table = {
        "add": np.add,
        "subtract": np.subtract,
        "multiply": np.multiply,
        "divide": np.divide,
        "maximum": np.maximum,
        "minimum": np.minimum,
        "and": np.logical_and if dtype == "pred" else np.bitwise_and,
        "or": np.logical_or if dtype == "pred" else np.bitwise_or,
        "power": np.power,
        "remainder": np.fmod,
    }
    return table[op](a, b) if op in table else None


def np_compare(direction: str, a, b):
    return {
        "EQ": np.equal,
        "NE": np.not_equal,
        "LT": np.less,
        "LE": np.less_equal,
        "GT": np.greater,
        "GE": np.greater_equal,
    }[direction](a, b)
