"""Canonical form of a layer's terms: the same text for every layer that computes the same thing.

Inputs (`param` leaves: weights, and the values entering the layer) are numbered by first
occurrence, so layer 3 and layer 4 of a transformer, which differ only in which weights they
read, get the same text; constants keep their values, every other op its attributes and shape.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence

from equivci.layers.segments import program_order
from equivci.terms.ir import Term


@dataclasses.dataclass(frozen=True)
class CanonicalForm:
    digest: str


def canonical_form(
    roots: Sequence[Term], marked: Sequence[Term] = (), groups: Sequence[Sequence[Term]] = ()
) -> CanonicalForm:
    """Digest of the DAG under `roots` (in this order), of which of its terms are `marked`, and of
    the `groups` of its terms known equal. Param indices are replaced by their order of first use."""
    ids: dict[Term, int] = {}
    rows = []
    for t in program_order(roots):
        ids[t] = len(ids)
        head = "param" if t.op == "param" else f"{t.op}{t.attrs!r}"
        rows.append(f"{head}|{[ids[a] for a in t.args]}|{t.shape}|{t.dtype}")
    rows.append(f"roots {[ids[t] for t in roots]}")
    rows.append(f"marked {sorted(ids[t] for t in marked if t in ids)}")
    rows.append(f"groups {sorted(sorted(ids[t] for t in g) for g in groups if all(t in ids for t in g))}")
    return CanonicalForm(hashlib.sha256("\n".join(rows).encode()).hexdigest())
