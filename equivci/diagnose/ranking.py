"""The diff as a tie-breaker: of equally supported places for one cause, a changed line goes first.

The verifier reports ties (findings sharing a `tie` number, the first as the error, the others as
notes) without knowing the diff, so that a stored result serves any diff; once the findings on
lines changed since REF are marked, the first changed place of each tie takes the lead.
"""

from __future__ import annotations

import dataclasses

from equivci.results import Finding


def changed_first(findings: tuple[Finding, ...]) -> tuple[Finding, ...]:
    out = list(findings)
    for tie in {f.tie for f in findings if f.tie is not None}:
        slots = [k for k, f in enumerate(out) if f.tie == tie]
        group = [out[k] for k in slots]
        lead = next((f for f in group if f.changed), group[0])
        severity = group[0].severity
        ordered = [lead] + [f for f in group if f is not lead]
        for k, f in zip(slots, ordered):
            out[k] = dataclasses.replace(f, severity=severity if f is lead else "note")
    return tuple(out)
