"""Partition both programs' terms into layers (segments) by the user's named scopes.

A term belongs to the layer of the op that produced it (`layers_3`, `layer.3`, `Model/h.3`,
`lm_head` in the op's name). Ops outside any scope inherit the latest layer of their operands, so
the bookkeeping ops XLA and JAX put between a layer's ops stay in it; terms that depend on the
inputs only (weight reshapes, RoPE tables, masks) are *global*: every layer that uses them
carries their definition along, which keeps identical layers identical. So are constants that
XLA computes once for all layers (a mask broadcast hoisted into the first layer that uses it).

A segment's outputs are its terms used by a later segment, and the model outputs it produces.

A training step runs every layer twice, forward then backward, under the same scopes (JAX names
the reference's backward ops `transpose(jvp(layers_3))`, the shard_map body's not at all), so its
layers use each other both ways. Such a program is split into *passes* instead: a pass runs the
layers in one direction (the first in their order of first appearance, the next one back), and an
op that reads a value made in a layer the pass has already left starts the next pass. A segment is
one layer's ops of one pass (`layers_3` forward, `layers_3 (pass 2)` backward), so that the
backward segment of a layer reads its forward segment's values and the next layer's gradient as
values entering it: the segments of a training step form a chain, as the forward layers do.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
from collections.abc import Iterable, Iterator

from equivci.terms.ir import Term

# Transformation wrappers JAX puts around scopes in op names; they are not layers.
_WRAPPERS = ("jit(", "pjit(", "shard_map", "jvp(", "transpose(", "vmap(", "checkpoint", "remat", "custom_")
# Autodiff's wrappers around the first scope under the differentiated function: `transpose(jvp(layers_1))`
# is scope layers_1's backward op (read so only when splitting into passes).
_AUTODIFF = re.compile(r"^(?:(?:jvp|transpose)\()+([^()]*)\)+$")
_CONTROL_FLOW = {"while", "body", "cond"}  # lax.scan / fori_loop / cond scopes
_SCOPE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_NUMBERED = re.compile(r"\d+$")


@functools.lru_cache(maxsize=1 << 16)  # asked for every op's value of both programs: names repeat
def layer_of(op_name: str, autodiff: bool = False) -> str | None:
    """The layer an op belongs to: the user's scope path down to the first numbered scope
    (`jit(f)/Model/layers_3/mlp/dot_general` -> `Model/layers_3`), else the outermost scope
    (`lm_head/add` -> `lm_head`); None outside any named scope. `autodiff`: a scope inside
    autodiff's wrappers is the scope (`jvp(layers_3)`, `transpose(jvp(layers_3))`)."""
    parts = op_name.split("/")[:-1]
    if autodiff:
        parts = [m.group(1) if (m := _AUTODIFF.match(p)) and m.group(1) else p for p in parts]
    parts = [p for p in parts if not p.startswith(_WRAPPERS) and p not in _CONTROL_FLOW]
    scopes = list(itertools.takewhile(_SCOPE.match, parts))
    for k, part in enumerate(scopes):
        if _NUMBERED.search(part):
            return "/".join(scopes[: k + 1])
    return scopes[0] if scopes else None


@dataclasses.dataclass
class Segment:
    name: str | None  # the layer; None: obligations on terms outside every layer
    reference_outputs: list[Term]  # reference terms of this layer used after it, in program order
    distributed_outputs: list[Term]  # distributed-only terms of this layer used after it (all devices)
    obligations: list[tuple[int, int]]  # (device, output leaf) whose proof belongs to this layer


@dataclasses.dataclass
class Layering:
    segments: list[Segment]  # dependency order
    label: dict[Term, str | None]
    reference_terms: set[Term]  # terms of the reference program


def leaves(value) -> Iterator[Term]:
    if isinstance(value, tuple):
        for item in value:
            yield from leaves(item)
    else:
        yield value


def postorder(roots: Iterable[Term], done) -> Iterator[Term]:
    """Terms under `roots` not yet `done`, arguments first (iterative: layer stacks are deep)."""
    stack = list(roots)
    while stack:
        t = stack[-1]
        if done(t):
            stack.pop()
            continue
        pending = [a for a in t.args if not done(a)]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        yield t


def label_terms(
    events_per_side: list[list], roots: Iterable[Term], passes: bool = False
) -> tuple[dict[Term, str | None], dict[str, int]]:
    """Each term's segment (None: global) and the segments' order: by first appearance of their
    layers, and with `passes` by pass, then by that order (reversed in the passes that run back).

    A value that several layers compute from the inputs alone (a RoPE table every layer rebuilds
    is one hash-consed term) is global, not the first layer's: the others would otherwise read it
    from that layer instead of carrying its definition."""
    rank: dict[str, int] = {}
    producers: dict[Term, set[str]] = {}
    for events in events_per_side:
        for event in events:
            scope = layer_of(event.inst.op_name, passes)
            if scope is not None:
                rank.setdefault(scope, len(rank))
                for device_value in event.values:
                    for v in leaves(device_value):
                        producers.setdefault(v, set()).add(scope)
    unit: dict[Term, tuple[int, str] | None] = {}  # (pass, layer)
    closed: dict[Term, bool] = {}  # no input below: a constant, whichever layer computes it

    def order(u: tuple[int, str]) -> tuple[int, int]:
        return u[0], -rank[u[1]] if u[0] % 2 else rank[u[1]]

    def latest(terms) -> tuple[int, str] | None:
        units = [u for a in terms if (u := unit[a]) is not None]
        return max(units, key=order) if units else None

    def entered(scope: str, terms) -> tuple[int, str]:
        """The unit of an op of `scope` over `terms`: its operands' latest pass, or the next one when
        that pass has already left `scope` (without `passes`, the one pass whatever the order)."""
        ran = [u for a in terms if (u := unit[a]) is not None]
        return max((u[0] + (passes and order(u) > order((u[0], scope))) for u in ran), default=0), scope

    def settle(value: Term, scope: str | None) -> None:
        for t in postorder([value], unit.__contains__):
            inherited = latest(t.args)
            closed[t] = t.op != "param" and all(closed[a] for a in t.args)
            if scope is None or closed[t] or (inherited is None and (t is not value or len(producers.get(t, ())) > 1)):
                unit[t] = inherited
            else:  # the op's value and the intermediate terms its evaluation built (an all-gather's partial concats)
                unit[t] = entered(scope, t.args)

    for events in events_per_side:
        for event in events:
            scope = layer_of(event.inst.op_name, passes)
            for device_value in event.values:
                for v in leaves(device_value):
                    settle(v, scope)
    for r in roots:
        settle(r, None)
    units = sorted({u for u in unit.values() if u is not None} | {(0, s) for s in rank}, key=order)
    return {t: u and _name(u) for t, u in unit.items()}, {_name(u): n for n, u in enumerate(units)}


def _name(unit: tuple[int, str]) -> str:
    return unit[1] if unit[0] == 0 else f"{unit[1]} (pass {unit[0] + 1})"


def split(
    reference_events: list,
    distributed_events: list,
    reference_outputs: list[Term],
    device_outputs: list[list[Term]],
    targets: list[list[Term]],
) -> Layering | None:
    """The model's layers in dependency order, or None when it has fewer than two. Layers that
    depend on each other both ways (a backward pass under the forward pass's scopes) are split
    into passes."""
    return _split(reference_events, distributed_events, reference_outputs, device_outputs, targets) or _split(
        reference_events, distributed_events, reference_outputs, device_outputs, targets, passes=True
    )


def _split(
    reference_events: list,
    distributed_events: list,
    reference_outputs: list[Term],
    device_outputs: list[list[Term]],
    targets: list[list[Term]],
    passes: bool = False,
) -> Layering | None:
    roots = list(reference_outputs) + [t for row in device_outputs + targets for t in row]
    label, rank = label_terms([reference_events, distributed_events], roots, passes)
    if len(rank) < 2:
        return None
    reference_terms = set(program_order(reference_outputs))
    outputs: dict[str, dict[Term, None]] = {name: {} for name in rank}  # ordered sets
    depends: dict[str, set[str]] = {name: set() for name in rank}
    for t in program_order(roots):
        mine = label[t]
        for a in t.args:
            theirs = label[a]
            if theirs is not None and theirs != mine and mine is not None:
                outputs[theirs][a] = None
                depends[mine].add(theirs)
    obligations: dict[str | None, list[tuple[int, int]]] = {}
    for d, (row, target_row) in enumerate(zip(device_outputs, targets)):
        for k, (o, target) in enumerate(zip(row, target_row)):
            home = max((label[o], label[target]), key=lambda n: -1 if n is None else rank[n])
            obligations.setdefault(home, []).append((d, k))
            for t in (o, target):
                if (theirs := label[t]) is not None and theirs != home:
                    outputs[theirs][t] = None
                    if home is not None:
                        depends[home].add(theirs)
    order = _topological(depends, rank)
    if order is None:
        return None
    segments = [
        Segment(
            name,
            [t for t in outputs[name] if t in reference_terms],
            [t for t in outputs[name] if t not in reference_terms],
            obligations.get(name, []),
        )
        for name in order
    ]
    if None in obligations:
        segments.append(Segment(None, [], [], obligations[None]))
    return Layering(segments, label, reference_terms)


def program_order(roots: Iterable[Term]) -> list[Term]:
    """Every term under `roots` once, arguments first."""
    seen: set[Term] = set()
    out = []
    for t in postorder(roots, seen.__contains__):
        seen.add(t)
        out.append(t)
    return out


def _topological(depends: dict[str, set[str]], rank: dict[str, int]) -> list[str] | None:
    """Layers so that each comes after the layers it uses (ties by first appearance); None on a cycle."""
    order: list[str] = []
    placed: set[str] = set()
    remaining = sorted(depends, key=rank.__getitem__)
    while remaining:
        ready = [n for n in remaining if depends[n] <= placed]
        if not ready:
            return None
        order.append(ready[0])
        placed.add(ready[0])
        remaining.remove(ready[0])
    return order
