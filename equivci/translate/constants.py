"""The non-uniform constants of a program: found by content, and as windows of one another.

Model code often rebuilds the same tables in every layer (RoPE angles, causal masks), and a
device's table is a window of the reference's (its positions, its heads). Comparing each new
constant with every known one at every offset made translation quadratic in the number of
constants: 749 s for a 405B-shaped model whose layers compute their own tables. Here a constant
seen before is found by its content digest, and a window by the digest of its first row along the
dimension it is narrower in, looked up among the rows of every known constant; only windows whose
first rows hash alike are compared element by element (`comparisons` counts those, for the
work-count test).
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np


def _digest(value: np.ndarray) -> bytes:
    value = np.ascontiguousarray(value)
    return hashlib.blake2b(value.dtype.str.encode() + value.tobytes(), digest_size=16).digest()


@dataclasses.dataclass(frozen=True)
class Window:
    """`array[start:start + width]` along `dim` of the known constant `source` (a Term)."""

    source: object
    dim: int
    start: int
    order: int  # of the source among the known constants


@dataclasses.dataclass(frozen=True)
class _Known:
    order: int  # oldest first: a window of the oldest source wins
    term: object
    value: np.ndarray
    dtype: str


class ConstantPool:
    def __init__(self) -> None:
        self._by_content: dict[tuple, object] = {}
        # (dtype, dim, shape without dim) -> digest of a row (the sub-array at one index along dim)
        # -> (the known constant, that index), for every row of every known constant
        self._rows: dict[tuple, dict[bytes, list[tuple[_Known, int]]]] = {}
        self._known: list[_Known] = []
        self.comparisons = 0  # element-by-element comparisons made (work units, see tests)

    def extend(self, other: "ConstantPool") -> None:
        """Know every constant `other` knows (the reference's, for the distributed program)."""
        for known in other._known:
            self.add(known.term, known.value, known.dtype)

    def seen(self, value: np.ndarray, dtype: str):
        """The term already made for a constant of this exact content, if any."""
        return self._by_content.get((dtype, value.shape, _digest(value)))

    def add(self, term, value: np.ndarray, dtype: str, *, source: bool = True) -> None:
        """Remember `term` as the constant `value`; a `source` may contain later constants."""
        self._by_content.setdefault((dtype, value.shape, _digest(value)), term)
        if not source:
            return
        known = _Known(len(self._known), term, value, dtype)
        self._known.append(known)
        for k in range(value.ndim):
            rows = self._rows.setdefault(_frame(dtype, value.shape, k), {})
            for i in range(value.shape[k]):
                rows.setdefault(_digest(np.take(value, i, axis=k)), []).append((known, i))

    def windows(self, value: np.ndarray, dtype: str) -> list[Window]:
        """Every window of the oldest known constant that holds `value` as a window along one dim
        (several when it repeats along that dim)."""
        candidates = sorted(
            (known.order, k, start, known)
            for k in range(value.ndim) if value.shape[k]
            for known, start in self._rows.get(_frame(dtype, value.shape, k), {}).get(_digest(np.take(value, 0, axis=k)), ())
            if value.shape[k] < known.value.shape[k] and start + value.shape[k] <= known.value.shape[k])
        found: list[Window] = []
        for order, k, start, known in candidates:
            if found and (order, k) != (found[0].order, found[0].dim):
                break
            self.comparisons += 1
            if np.array_equal(np.take(known.value, range(start, start + value.shape[k]), axis=k), value, equal_nan=True):
                found.append(Window(known.term, k, start, order))
        return found


def _frame(dtype: str, shape: tuple[int, ...], dim: int) -> tuple:
    return (dtype, dim, shape[:dim] + shape[dim + 1:])
