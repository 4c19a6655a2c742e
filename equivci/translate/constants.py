"""The non-uniform constants of a program: found by content, and as windows of one another.

Model code often rebuilds the same tables in every layer (RoPE angles, causal masks), and a
device's table is a window of the reference's (its positions, its heads). Comparing each new
constant with every known one at every offset made translation quadratic in the number of
constants: 749 s for a 405B-shaped model whose layers compute their own tables. Here a constant
seen before is found by its content digest, and a window by the digest of its first row along the
dimension it is narrower in, looked up among the rows of every known constant; only windows whose
first rows hash alike are compared element by element (`comparisons` counts those, for the
work-count test).

Unit dims do not change which elements a table holds, and programs insert them at different
places (the reference's table folded to [1, s, 1, d] for its broadcast, a device's [s/n, d] cut
from a longer table): a constant is also known with its unit dims squeezed, and a window found
there is the window along the matching dim of the constant itself.

A device of a two-axis mesh cuts a table along two dims at once (a top-k's positions over its
batch rows and its experts): where no known constant holds it along one dim, it is looked up as a
window along two dims, at offsets that are multiples of its size along each (a device's shard there),
among the known constants of its shape elsewhere (found by that shape: no scan of every constant).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools

import numpy as np

from equivci.terms.ir import Term


def _digest(value: np.ndarray) -> bytes:
    value = np.ascontiguousarray(value)
    return hashlib.blake2b(value.dtype.str.encode() + value.tobytes(), digest_size=16).digest()


@dataclasses.dataclass(frozen=True)
class Window:
    """`array[start:start + width]` along `dim` of the known constant `source` (a Term); the value
    sought is that window with its unit dims laid out differently when `reshaped`."""

    source: Term
    dim: int
    start: int
    width: int
    order: int  # of the source among the known constants (-1: a symbolic iota, known by its formula)
    reshaped: bool = False
    # the window of that window along a second dim, (dim, start, width): a device's two-axis shard
    across: tuple[int, int, int] | None = None


@dataclasses.dataclass(frozen=True)
class _Known:
    order: int  # oldest first: a window of the oldest source wins
    term: Term
    value: np.ndarray
    dtype: str
    content: tuple  # the value with its unit dims squeezed, by digest: alike for one table laid out two ways


class ConstantPool:
    def __init__(self) -> None:
        self._by_content: dict[tuple, object] = {}
        # (dtype, dim, shape without dim) -> digest of a row (the sub-array at one index along dim)
        # -> (the known constant, that index, its own dim), for every row of every known constant,
        # and of every known constant with its unit dims squeezed
        self._rows: dict[tuple, dict[bytes, list[tuple[_Known, int, int]]]] = {}
        self._known: list[_Known] = []
        # (dtype, two dims, the shape without them) -> the known constants of that shape elsewhere
        self._by_frame2: dict[tuple, list[_Known]] = {}
        self._order: dict[object, int] = {}  # source term -> its order
        # iotas too large to fold (a vocabulary's 128,256 class ids): their windows are known by formula
        self._iotas: list[Term] = []
        self.comparisons = 0  # element-by-element comparisons made (work units, see tests)

    def extend(self, other: "ConstantPool") -> None:
        """Know every constant `other` knows (the reference's, for the distributed program)."""
        for known in other._known:
            self.add(known.term, known.value, known.dtype)
        for iota in other._iotas:
            self.add_iota(iota)

    def add_iota(self, term: Term) -> None:
        """Remember `term`, an iota kept symbolic (too large to fold), as a source of windows."""
        if term not in self._iotas:
            self._iotas.append(term)

    def seen(self, value: np.ndarray, dtype: str):
        """The term already made for a constant of this exact content, if any."""
        return self._by_content.get((dtype, value.shape, _digest(value)))

    def relaid(self, value: np.ndarray, dtype: str) -> Term | None:
        """The oldest known constant that holds `value`'s elements in its order with other unit dims
        (a reference's [1, 1, d] frequencies, squeezed for a vmapped body, and a device's own [d]):
        `value` is that constant reshaped."""
        squeezed = value.reshape([value.shape[k] for k in _kept(value.shape)])
        content = (dtype, squeezed.shape, _digest(squeezed))
        return next((known.term for known in self._known if known.content == content), None)

    def add(self, term: Term, value: np.ndarray, dtype: str, *, source: bool = True) -> None:
        """Remember `term` as the constant `value`; a `source` may contain later constants."""
        self._by_content.setdefault((dtype, value.shape, _digest(value)), term)
        if not source:
            return
        kept = _kept(value.shape)
        squeezed = value.reshape([value.shape[k] for k in kept])
        known = _Known(len(self._known), term, value, dtype, (dtype, squeezed.shape, _digest(squeezed)))
        self._known.append(known)
        self._order.setdefault(term, known.order)
        for d, d2 in itertools.combinations(range(value.ndim), 2):
            self._by_frame2.setdefault(_frame2(dtype, value.shape, d, d2), []).append(known)
        views = [(value, list(range(value.ndim)))]
        if len(kept) < value.ndim:
            views.append((squeezed, kept))
        for view, dims in views:
            for k in range(view.ndim):
                rows = self._rows.setdefault(_frame(dtype, view.shape, k), {})
                for i in range(view.shape[k]):
                    rows.setdefault(_digest(np.take(view, i, axis=k)), []).append((known, i, dims[k]))

    def windows(self, value: np.ndarray, dtype: str, sources: int = 1) -> list[Window]:
        """Every window of the oldest known constant that holds `value` as a window along one dim
        (several when it repeats along that dim), as it is or with unit dims squeezed on either side;
        then those of the next such constants (or dims), oldest first, up to `sources` of them in
        all, trying at most `sources` further candidates past the first window found. Equal values
        built differently (the first rows of a sliding-window mask are the causal mask's rows) are
        all found, so a device's rows relate to the table the reference uses. A table that only lays out
        a held one's elements with other unit dims is skipped: its windows are the same windows, and
        stating them equal again (a [s, d] table and its [s, d, 1] broadcast operand) only gives the
        saturation reshapes of slices to rewrite into one another."""
        kept = _kept(value.shape)
        views = [value] + ([value.reshape([value.shape[k] for k in kept])] if len(kept) < value.ndim else [])
        candidates: dict[tuple[int, int, int], tuple[_Known, np.ndarray, int]] = {}
        for view in views:
            for k in range(view.ndim):
                if not view.shape[k]:
                    continue
                for known, start, own in self._rows.get(_frame(dtype, view.shape, k), {}).get(
                    _digest(np.take(view, 0, axis=k)), ()
                ):
                    if view.shape[k] < known.value.shape[own] and start + view.shape[k] <= known.value.shape[own]:
                        candidates.setdefault((known.order, own, start), (known, view, k))
        found: list[Window] = []
        held: list[tuple[int, int]] = []  # the (source, dim) pairs that hold a window found
        contents: dict[tuple, int] = {}  # the content of each source held -> its order
        further = 0  # candidates tried past the first window found
        for (order, own, start), (known, view, k) in sorted(candidates.items(), key=lambda item: item[0]):
            if contents.get(known.content, order) != order:
                continue
            new_source = bool(found) and (order, own) not in held
            if new_source and (len(held) >= sources or further >= sources):
                break
            further += new_source
            width = view.shape[k]
            self.comparisons += 1
            window = np.take(known.value, range(start, start + width), axis=own)
            if np.array_equal(window.reshape(view.shape), view, equal_nan=True):
                found.append(Window(known.term, own, start, width, order, reshaped=window.shape != value.shape))
                held += [] if (order, own) in held else [(order, own)]
                contents[known.content] = order
        return found

    def two_dim_windows(self, value: np.ndarray, dtype: str, sources: int = 1) -> list[Window]:
        """The windows along two dims at once, at offsets that are multiples of `value`'s size along
        each, of the oldest known constants narrower along no dim and wider along exactly those two
        that hold `value` there, up to `sources` of them (every such window of each: a table the same
        along both dims, a sort's positions, is each device's)."""
        found: list[Window] = []
        contents: set[tuple] = set()
        for d, d2 in itertools.combinations(range(value.ndim), 2):
            w, w2 = value.shape[d], value.shape[d2]
            for known in self._by_frame2.get(_frame2(dtype, value.shape, d, d2), ()):
                n, n2 = known.value.shape[d], known.value.shape[d2]
                if not 0 < w < n or not 0 < w2 < n2 or known.content in contents:
                    continue
                held = []
                for i in range(0, n - w + 1, w):
                    rows = np.take(known.value, range(i, i + w), axis=d)
                    for j in range(0, n2 - w2 + 1, w2):
                        self.comparisons += 1
                        if np.array_equal(np.take(rows, range(j, j + w2), axis=d2), value, equal_nan=True):
                            held.append(Window(known.term, d2, j, w2, known.order, across=(d, i, w)))
                if held:
                    found += held
                    contents.add(known.content)
                    if len(contents) >= sources:
                        return found
        return found

    def iota_window(self, value: np.ndarray, dtype: str) -> Window | None:
        """The window of a symbolic iota that `value` is, with unit dims laid out either way: an
        iota along dim k holds i at index i along k, so its window [lo, lo + n) along k is
        lo + arange(n) (in the iota's dtype) broadcast along its other dims. A device's class ids
        `lo + iota(n)`, folded, are the window of the reference's `iota(V)`, which is not."""
        kept = _kept(value.shape)
        squeezed = value.reshape([value.shape[k] for k in kept])
        for source in self._iotas:
            dim, own = source.attrs[0], _kept(source.shape)
            if source.dtype != dtype or dim not in own or len(own) != squeezed.ndim:
                continue
            at = own.index(dim)
            others = [source.shape[k] for k in own if k != dim]
            n, size = squeezed.shape[at], source.shape[dim]
            if n >= size or others != [m for q, m in enumerate(squeezed.shape) if q != at]:
                continue
            first = float(np.take(squeezed, 0, axis=at).flat[0])
            if not first.is_integer() or not 0 <= first <= size - n:
                continue
            lo = int(first)
            formula = (
                np.arange(lo, lo + n).astype(value.dtype).reshape([-1 if q == at else 1 for q in range(squeezed.ndim)])
            )
            self.comparisons += 1
            if np.array_equal(np.broadcast_to(formula, squeezed.shape), squeezed):
                window_shape = tuple(n if k == dim else m for k, m in enumerate(source.shape))
                return Window(source, dim, lo, n, -1, reshaped=window_shape != value.shape)
        return None

    def older_windows(self, value: np.ndarray, dtype: str, than) -> list[Window]:
        """`windows(value)` when they are windows of a constant known before the source `than`."""
        order = self._order.get(than)
        if order is None:
            return []
        found = self.windows(value, dtype)
        return found if found and found[0].order < order else []


def _frame(dtype: str, shape: tuple[int, ...], dim: int) -> tuple:
    return (dtype, dim, shape[:dim] + shape[dim + 1 :])


def _frame2(dtype: str, shape: tuple[int, ...], dim: int, dim2: int) -> tuple:
    return (dtype, dim, dim2, tuple(n for k, n in enumerate(shape) if k not in (dim, dim2)))


def _kept(shape: tuple[int, ...]) -> list[int]:
    """The dims that are not unit dims."""
    return [k for k, size in enumerate(shape) if size != 1]
