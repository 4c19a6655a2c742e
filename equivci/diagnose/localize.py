"""Point at the distributed op where the two programs part ways.

Each distributed value is classified per device: *related* (equal to a slice of some reference
value), *partial* (not itself, but its sum over the devices of one mesh axis is related: a value
waiting for its all-reduce) or *unrelated*. The finding is the first op, in program order, that is
unrelated although its operands are related or partial; a partial value that reaches an output is
a missing reduction. An unrelated value every use of which is related again (a fused projection
read in windows, a microbatch's share of a partial sum) is a step of the distributed program's
own and is passed over. When an unrelated op combines slices whose offsets do not follow the
device order, the op that cut the slice is where the defect was made.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from fractions import Fraction
from pathlib import Path

from egglog import String, eq, i64, relation, vars_

from equivci.diagnose.divisor import constant_division
from equivci.diagnose.frames import LAYOUT_OPS, innermost, is_user_frame
from equivci.diagnose.gradients import first_use_after_autodiff, made_by_autodiff
from equivci.diagnose.missing import PASSIVE, MissingWork, MissingWorkFinder, source_text
from equivci.diagnose.numeric import far_apart
from equivci.diagnose.precision import narrowing, rounding_message
from equivci.diagnose.reduction_axes import missing_axis, reduced_axes, wrong_axis
from equivci.diagnose.source import assigned_at, call_argument, callee, parameters, statement
from equivci.hlo.collectives import parse_pairs
from equivci.hlo.ir import TRIVIAL_OPS, Instruction, SourceLoc
from equivci.prove.saturate import Proof, add_hypotheses, add_terms, is_related, proved_equal
from equivci.terms.ir import Term
from equivci.terms.language import T
from equivci.terms.rules.registry import family, named
from equivci.translate.arrays import all_equal
from equivci.translate.attributes import dims_attr
from equivci.translate.evaluator import Event
from equivci.translate.programs import flatten
from equivci.translate.unroll import Unroller


@dataclasses.dataclass(frozen=True)
class Defect:
    inst: Instruction
    message: str
    context: Instruction | None = None
    work: MissingWork | None = None  # the reference work the distributed program lacks, when that is the defect
    frontier: Instruction | None = None  # the first unrelated op, which led to `inst`
    constants: tuple[float, float] | None = None  # (distributed, reference) when a differing constant is the defect
    alternative: tuple[Instruction, str] | None = None  # an equally supported place, and what to say there
    # The proof only found no relation here (no rule, perhaps): nothing says how the value differs.
    unexplained: bool = False
    # The op's own value is a reference value or a share of one: what the program does after it
    # (an all-reduce, a residual add) is missing, not what it was handed.
    kept: bool = False
    # The mesh axes the blamed all-reduce sums over, when they are the defect (an axis missing or wrong).
    axes: frozenset[str] = frozenset()


def _terms(event: Event) -> list[Term] | None:
    if any(isinstance(v, tuple) for v in event.values):
        return None
    return list(event.values)


def _key(terms: list[Term]) -> tuple[int, ...]:
    return tuple(id(t) for t in terms)


def _is_output(terms: list[Term], output_terms: set[int]) -> bool:
    return any(id(t) in output_terms for t in terms)


def axis_sums(evaluator, values: list[Term], groups_by_axis: dict[str, list[list[int]]]) -> dict[str, list[Term]]:
    """For each mesh axis, the sum of the value over that axis's device groups, per device."""
    out: dict[str, list[Term]] = {}
    for axis, groups in groups_by_axis.items():
        per_device: list[Term | None] = [None] * len(values)
        for group in groups:
            acc = values[group[0]]
            for dev in group[1:]:
                if values[dev].shape != acc.shape or values[dev].dtype != acc.dtype:
                    break
                acc = evaluator.binary("add", acc, values[dev])
            for dev in group:
                per_device[dev] = acc
        complete = [t for t in per_device if t is not None]
        if len(complete) == len(per_device):
            out[axis] = complete
    return out


def param_slices(term: Term, limit: int = 400) -> set[tuple[int, int, int, int]]:
    """(input leaf, dim, start, stop) of every slice of a reference input inside `term`."""
    found: set[tuple[int, int, int, int]] = set()
    stack, seen = [term], set[int]()
    while stack and len(seen) < limit:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if t.op == "slice" and t.args[0].op == "param":
            found.add((t.args[0].attrs[0], t.attrs[0], t.attrs[1], t.attrs[2]))
        stack.extend(t.args)
    return found


def input_windows(operands: list[list[Term]]) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """(input leaf, dim) -> the window of it each device's operands hold, where each holds one."""
    if not operands or any(len(op) != len(operands[0]) for op in operands):
        return {}
    per_device = [set().union(*(param_slices(op[dev]) for op in operands)) for dev in range(len(operands[0]))]
    by_key: dict[tuple[int, int], list[list[tuple[int, int]]]] = {}
    for dev, slices in enumerate(per_device):
        for leaf, dim, start, stop in slices:
            by_key.setdefault((leaf, dim), [[] for _ in per_device])[dev].append((start, stop))
    return {key: [r[0] for r in ranges] for key, ranges in by_key.items() if all(len(r) == 1 for r in ranges)}


def cutter(events: list[Event], leaf: int, dim: int, ranges: list[tuple[int, int]]) -> Event | None:
    """The op that cut these windows of input `leaf` along `dim`."""
    target = {(leaf, dim) + r for r in ranges}
    for event in events:
        terms = _terms(event)
        if terms and any(
            t.op == "slice"
            and t.args[0].op == "param"
            and (t.args[0].attrs[0], t.attrs[0], t.attrs[1], t.attrs[2]) in target
            for t in terms
        ):
            return event
    return None


def cut_as_held(event: Event, leaf: int, dim: int, ranges: list[tuple[int, int]]) -> bool:
    """The op that cut the windows gives each device the window it holds where it is used. Where it
    gave them in another order (in device order, then moved round a ring by a collective-permute),
    the cut is not what misplaced them."""
    terms = _terms(event)
    if not terms or len(terms) != len(ranges):
        return True
    cut = [
        (t.attrs[1], t.attrs[2])
        if t.op == "slice" and t.args[0].op == "param" and (t.args[0].attrs[0], t.attrs[0]) == (leaf, dim)
        else None
        for t in terms
    ]
    return None in cut or cut == list(ranges)


def _shown(ranges: list[tuple[int, int]]) -> str:
    return ", ".join(f"[{a}:{b})" for a, b in ranges)


def misplaced_slice(events: list[Event], operands: list[list[Term]]) -> tuple[Event, str] | None:
    """The op that cut a slice whose offsets across devices are out of device order."""
    cuts = [
        (f"input #{leaf}", dim, ranges, made)
        for (leaf, dim), ranges in input_windows(operands).items()
        if (made := cutter(events, leaf, dim, ranges)) is None or cut_as_held(made, leaf, dim, ranges)
    ]
    cuts += [
        (_sliced_value(event), windows[0].attrs[0], [(t.attrs[1], t.attrs[2]) for t in windows], event)
        for windows in computed_windows(operands)
        for event in [_producer_of(events, windows)]
    ]
    # A window inside an operand's product counts only where a slice op of the program cut it.
    cuts += [
        (_sliced_value(event), windows[0].attrs[0], [(t.attrs[1], t.attrs[2]) for t in windows], event)
        for windows in computed_windows(operands, WINDOW_DEPTH)
        for event in [_producer_of(events, windows)]
        if event is not None and event.inst.opcode in CUTTERS
    ]
    for what, dim, ranges, event in cuts:
        spans = list(dict.fromkeys(ranges))
        # Shards of one tensor, in the order devices first hold them, tile a contiguous range
        # (devices that differ only along another mesh axis hold the same shard), or each is
        # the same part of its own block (a microbatch of every device's shard).
        if any(prev[1] != cur[0] for prev, cur in zip(spans, spans[1:])) and not same_part_of_blocks(spans):
            if event is not None:
                return event, (
                    f"this slice of {what} along dim {dim} takes {_shown(ranges)} on devices "
                    f"0..{len(ranges) - 1}: these are not consecutive shards in device "
                    "order (overlapping, out of order or with gaps), so the devices do not hold the "
                    "parts the other operand expects"
                )
    return None


def computed_windows(operands: list[list[Term]], depth: int = 0) -> list[list[Term]]:
    """Operands that are, on every device, a window cut along one dim of the same computed value
    (not an input: those are `input_windows`), such as a slice of the routing weights at an offset;
    with `depth`, also those that take such a window as an argument, down that many levels (the
    dispatch mask's window an einsum of the tokens reads: the terms keep the cut inside the product)."""
    found = []
    for op in operands:
        for part in _argument_paths(op, depth)[1 if depth else 0 :]:
            if (
                part
                and all(
                    t.op == "slice" and t.args[0] is part[0].args[0] and t.attrs[0] == part[0].attrs[0] for t in part
                )
                and part[0].args[0].op not in ("param", "slice")
            ):
                found.append(part)
                break
    return found


WINDOW_DEPTH = 2  # argument levels of an operand's term searched for a window of a computed value


def _argument_paths(op: list[Term], depth: int) -> list[list[Term]]:
    """The devices' terms, then their arguments at the same position, level by level, where every
    device's term has the same op and arity (the same computation on each device's part)."""
    out, level = [op], [op]
    for _ in range(depth):
        nxt = []
        for part in level:
            if not part or any(t.op != part[0].op or len(t.args) != len(part[0].args) for t in part):
                continue
            nxt += [[t.args[k] for t in part] for k in range(len(part[0].args))]
        out += nxt
        level = nxt
    return out


def _common_base_windows(terms: list[Term]) -> list[tuple[list[Term], int, list[tuple[int, int]]]]:
    """(the slices, dim, each device's [start, stop)) where, under re-layouts, every device's value is
    a slice along one dim of the same computed value (not an input: those are `input_windows`)."""
    cuts = []
    for t in terms:
        while t.op in _RELAYOUTS and t.args:
            t = t.args[0]
        cuts.append(t)
    first = cuts[0]
    if (
        first.op != "slice"
        or first.args[0].op in ("param", "slice")
        or any(c.op != "slice" or c.args[0] is not first.args[0] or c.attrs[0] != first.attrs[0] for c in cuts)
    ):
        return []
    return [(cuts, first.attrs[0], [(c.attrs[1], c.attrs[2]) for c in cuts])]


_RELAYOUTS = {"reshape", "transpose", "convert"}


def _sliced_value(event: Event | None) -> str:
    """The name of what the slice call at the op's line cuts (`cw` of `dynamic_slice_in_dim(cw, ...)`)."""
    loc = _loc(event.inst) if event is not None else None
    found = statement(*loc) if loc is not None else None
    calls = [n for n in ast.walk(found[0]) if isinstance(n, ast.Call) and "slice" in callee(n)] if found else []
    if len(calls) == 1 and calls[0].args and len(text := ast.unparse(calls[0].args[0])) <= 40:
        return f"`{text}`"
    return "a computed value"


def _producer_of(events: list[Event], terms: list[Term]) -> Event | None:
    """The first op, in program order, whose value on some device is one of `terms`."""
    ids = {id(t) for t in terms}
    return next((e for e in events if (ts := _terms(e)) and any(id(t) in ids for t in ts)), None)


def same_part_of_blocks(spans: list[tuple[int, int]]) -> bool:
    """Equal windows a constant stride apart, each inside its own stride-long block: the same part
    of every device's shard, as a microbatch of a data-parallel batch is."""
    if len(spans) < 2:
        return False
    size, stride = spans[0][1] - spans[0][0], spans[1][0] - spans[0][0]
    return (
        size <= stride
        and spans[0][0] % stride + size <= stride
        and all(b - a == size and a == spans[0][0] + k * stride for k, (a, b) in enumerate(spans))
    )


def window_goes_back(ranges: list[tuple[int, int]], groups_by_axis: dict[str, list[list[int]]]):
    """(axis, device, next device) where the window moves back along a mesh axis, if it does.

    Block layouts (a shard per device, or one per run of consecutive devices) only move forward
    along every axis; a window that comes back (round-robin) pairs with other devices' parts.
    """
    for axis, groups in groups_by_axis.items():
        for group in groups:
            for a, b in zip(group, group[1:]):
                if ranges[b][0] < ranges[a][0]:
                    return axis, a, b
    return None


class _Scaling:
    """Values that are a constant multiple of a related value, such as a gradient averaged over a
    shard's own rows before a pmean: legitimate on the way, wrong where a sum keeps the factor."""

    def __init__(self, proof: Proof, evaluator, reference_events: list[Event] | None):
        self.proof, self.evaluator = proof, evaluator
        values = [v for e in reference_events or () for v in e.values if isinstance(v, Term)]
        self.factors = ({evaluator.scale_of(v)[0] for v in values} | {Fraction(1)}) - {0}

    def factor(self, terms: list[Term]) -> Fraction | None:
        """k != 1 such that every term is k times a slice of a reference value, if there is one."""
        candidates = []
        for t in terms:
            own, base = self.evaluator.scale_of(t)
            rescaled = [(own / f, self.evaluator.scaled(base, f)) for f in self.factors]
            candidates.append([(k, c) for k, c in rescaled if c is not None and c is not t])
        add_hypotheses(self.proof, [c for options in candidates for _, c in options])
        common = None
        for options in candidates:
            ks = {k for k, c in options if is_related(self.proof, c, self.evaluator.values)}
            common = ks if common is None else common & ks
        common = (common or set()) - {1}
        return min(common) if common else None


# -- a permutation that sends values the wrong way -----------------------------------------------
# Each what-if re-evaluates the program and saturates again: bounded, and tried only when the
# program has collective-permutes.
MAX_PERMUTE_TRIES = 4


def alternative_pairs(pairs: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Other ways to send along the same devices: reversed first, then the chains closed into rings,
    then the other powers of a cycle."""
    out = [sorted((t, s) for s, t in pairs)]
    step = dict(pairs)
    if len(step) == len(pairs) == len(set(step.values())):
        out.append(sorted(pairs + _closing_pairs(step)))
    if len(step) == len(pairs) and set(step) == set(step.values()):  # a permutation: its powers shift further
        mapped = dict(step)
        for _ in range(len(step)):
            mapped = {s: step[t] for s, t in mapped.items()}
            out.append(sorted(mapped.items()))
    own = sorted(pairs)
    unique = []
    for cand in out:
        if cand != own and cand not in unique and any(s != t for s, t in cand):
            unique.append(cand)
    return unique


def _closing_pairs(step: dict[int, int]) -> list[tuple[int, int]]:
    """The pair from the end of each chain of sends back to its start: a device that no pair sends
    to receives zeros, which a ring's wrap-around pair would have filled."""
    received = set(step.values())
    closing = []
    for start in (s for s in step if s not in received):
        end = start
        while end in step:
            end = step[end]
        closing.append((end, start))
    return closing


def _describe_pairs(pairs: list[tuple[int, int]], n: int) -> str:
    shown = "{" + ", ".join(f"{s}->{t}" for s, t in pairs) + "}"
    shifts = {(t - s) % n for s, t in pairs}
    if len(shifts) == 1:
        k = shifts.pop()
        k = k - n if k > n // 2 else k
        return f"{shown} (device j sends to j{k:+d} mod {n})"
    return shown


@dataclasses.dataclass(frozen=True)
class Rerouting:
    """A collective-permute (all its copies on one line) and other pairs that, sent along instead,
    make every output its part of the reference."""

    inst: Instruction
    pairs: list[tuple[int, int]]
    candidate: list[tuple[int, int]]


def rerouting(events: list[Event], proof: Proof, evaluator) -> Rerouting | None:
    """The what-if of `wrong_permutation`, asked once per localization and before the walk's
    hypotheses grow the e-graph: the variant's terms need the saturation budget, which the
    hypotheses of a long walk over a pipeline's unrolled ticks can use up before the walk ends."""
    if not proof.targets or evaluator.entry_args is None:
        return None
    groups: dict[tuple, dict[str, Instruction]] = {}
    for event in events:
        if event.inst.opcode == "collective-permute":
            key = (_loc(event.inst), event.inst.attrs.get("source_target_pairs", ""))
            groups.setdefault(key, {})[event.inst.name] = event.inst
    tries = 0
    for (_, text), insts in groups.items():
        pairs = parse_pairs(text)
        for candidate in alternative_pairs(pairs):
            if tries == MAX_PERMUTE_TRIES:
                return None
            tries += 1
            stated = len(evaluator.equal_terms)
            try:
                # Loops run iteration by iteration: a pipeline's ticks send along the pairs too.
                roots = evaluator.variant({name: candidate for name in insts}, Unroller())
                outputs = [flatten(root) for root in roots]
            except Exception:  # a what-if the evaluator cannot model is no evidence either way
                continue
            compared = [
                (o, t) for dev_out, dev_targets in zip(outputs, proof.targets) for o, t in zip(dev_out, dev_targets)
            ]
            if far_apart(compared, evaluator.values):
                # Numbers rule the repair out before its saturation, which on a pipeline's unrolled
                # ticks costs as much as the program's own proof, each what-if growing the e-graph.
                continue
            add_terms(proof, [t for dev in outputs for t in dev], evaluator.equal_terms[stated:])
            if all(proved_equal(proof.egraph, proof.loader.expr(o), proof.loader.expr(t)) for o, t in compared):
                return Rerouting(next(iter(insts.values())), pairs, candidate)
    return None


def wrong_permutation(found: Rerouting, events: list[Event], evaluator) -> Defect:
    """A collective-permute whose pairs, sent another way, make every output the reference's."""
    pairs, candidate = found.pairs, found.candidate
    added = sorted(set(candidate) - set(pairs)) if set(pairs) < set(candidate) else []
    how = (
        "as if they came the other way"
        if candidate == sorted((t, s) for s, t in pairs)
        else f"as if {_describe_pairs(added, evaluator.n)} sent too (a device that no pair sends "
        "to receives zeros): a ring lacks its wrap-around pair"
        if added
        else "as if they came from other devices"
    )
    message = (
        f"this collective-permute sends along {_describe_pairs(pairs, evaluator.n)}, but sent "
        f"along {_describe_pairs(candidate, evaluator.n)} every output would equal its part of "
        f"the reference: the received values are used {how}"
    )
    return Defect(_at_pairs_origin(found.inst, events), message)


def _at_pairs_origin(inst: Instruction, events: list[Event]) -> Instruction:
    """`inst` with the line that writes its permutation in front of its stack, when it can be found."""
    loc = _loc(inst)
    found = statement(*loc) if loc else None
    expr = _perm_expr(found[0]) if found else None
    origin = _expr_origin(loc[0], loc[1], expr, events) if loc is not None and expr is not None else None
    if origin is None:
        return inst
    return dataclasses.replace(inst, stack=(SourceLoc(*origin),) + tuple(inst.stack))


def first_defect(
    events: list[Event],
    proof: Proof,
    evaluator,
    groups_by_axis: dict[str, list[list[int]]],
    output_terms: set[int],
    reference_events: list[Event] | None = None,
    routed: AbstractSet[int] = frozenset(),
) -> Defect | None:
    """`routed`: ids of dispatch masks and routed values (equivci/translate/routing.py), which are
    related to the reference only through the combine that undoes the dispatch."""
    routed = set(routed)
    rerouted = rerouting(events, proof, evaluator)
    if rerouted is not None:
        # A repair proved: with these pairs every output is the reference's, so every other op is
        # right as it stands. The walk below would only look for the first value the wrong sends
        # spoil, and its hypotheses cost more than the repair's proof.
        return wrong_permutation(rerouted, events, evaluator)
    # Keyed by every device's term: two ops can agree on device 0 and differ elsewhere.
    status: dict[tuple[int, ...], str] = {}  # related | partial | scaled | unrelated
    factors: dict[tuple[int, ...], Fraction] = {}  # scaled values -> their factor
    partial_axis: dict[tuple[int, ...], str] = {}
    constants = evaluator.values
    loader = proof.loader
    scaling = _Scaling(proof, evaluator, reference_events)

    def classify(values: list[Term]) -> str:
        key = _key(values)
        if key in status:
            return status[key]
        if all(id(t) in routed or is_related(proof, t, constants) for t in values):
            result = "related"
        else:
            result = "unrelated"
        status[key] = result
        return result

    defined: dict[tuple[int, ...], Event] = {}
    by_name = {event.inst.name: event for event in events}
    shared_lines = {innermost(e.inst) for e in reference_events or ()} - {None}

    def explain(event: Event, terms: list[Term]) -> Defect:
        return dataclasses.replace(explain_at(event, terms), frontier=event.inst)

    def explain_at(event: Event, terms: list[Term]) -> Defect:
        """Why `event`, unrelated although its operands are related or partial, is the defect."""
        operand_events = [by_name.get(name) for name in event.inst.operands]
        if (
            event.inst.opcode == "all-reduce"
            and operand_events
            and operand_events[0] is not None
            and (first := _terms(operand_events[0])) is not None
            and status.get(_key(first)) == "related"
        ):
            return Defect(
                event.inst,
                "this all-reduce sums a value that is already the full reference value on every "
                "device, which multiplies it by the group size: the value was reduced before; "
                "remove one of the two reductions",
            )
        slip = misplaced_slice(events, [list(e.values) for e in operand_events if e and _terms(e)])
        if slip is not None:
            lines = {(loc.file, loc.line) for e in events for loc in e.inst.stack[:1]}
            origin = at_index_origin(slip[0], slip[1], events, lines)
            if origin is None and _loc(slip[0].inst) == _loc(event.inst):
                # Cut on the op's own line (a mask's rows): what chose the window, positions offset
                # by the device's index, was computed on another line.
                moved = _input_free_origin(
                    event, by_name, constants, slip[1], shared_lines, lambda ts: classify(ts) == "related"
                )
                if moved is not None:
                    return moved
            return (
                dataclasses.replace(origin, context=event.inst)
                if origin
                else Defect(slip[0].inst, slip[1], context=event.inst)
            )
        partials = [
            (k, e)
            for k, e in enumerate(operand_events)
            if e is not None and (ts := _terms(e)) and status.get(_key(ts)) == "partial"
        ]
        partial_operand = bool(partials)
        # An add of a share and a whole value adds the whole once per device: where the share comes
        # from an all-reduce that leaves out its axis, the reduction is where it was left unfinished.
        affine = event.inst.opcode in ("add", "subtract") and len(partials) < len(operand_events)
        unsummed = next(
            (e for k, e in partials if _nonlinear_in(event.inst.opcode, k, terms) or (affine and short_axes(e))), None
        )
        if unsummed is not None and (ts := _terms(unsummed)) is not None:
            # f(a + b) is no f(a) + f(b) for a nonlinear f: the share each device holds had to be
            # summed before this op, where it is made.
            axis = partial_axis[_key(ts)]
            reduced = short_axes(unsummed)
            why = (
                missing_axis(reduced, axis, event.inst, _at(event.inst))
                if reduced is not None
                else f"this value is each device's share of a sum over mesh axis '{axis}' (their sum is the "
                f"reference's value), but the `{event.inst.opcode}` at {_at(event.inst)} uses it as the whole sum, "
                f"and a `{event.inst.opcode}` of a sum is not the sum of the `{event.inst.opcode}`s: a psum "
                "(all-reduce) over that axis is missing here"
            )
            return Defect(
                unsummed.inst,
                why,
                axes=frozenset(reduced or ()),
                alternative=(
                    event.inst,
                    f"`{event.inst.opcode}` here gives a value that is not a slice, a partial sum or a copy of any "
                    f"reference value: it takes a share of a sum over '{axis}' made at {_at(unsummed.inst)}.",
                ),
            )
        if any(e is not None and (ts := _terms(e)) and all(id(t) in routed for t in ts) for e in operand_events):
            return Defect(
                event.inst,
                f"this `{event.inst.opcode}` uses rows routed to the experts, but on some device "
                "they are not that device's own tokens, each in its dispatch slot with its "
                "expert's output: the rows must be sent back to their tokens' devices (the "
                "return all_to_all) before they are combined",
            )
        rounded = narrowing(event.inst, operand_events[0].inst if operand_events and operand_events[0] else None)
        if rounded is not None:
            return Defect(event.inst, rounding_message(*rounded, partial=partial_operand), unexplained=True)
        plain = (
            f"`{event.inst.opcode}` here gives a value that is not a slice, a partial sum or a copy of any "
            "reference value, although its operands are"
        )
        if reference_events and not partial_operand:
            devices = [dev for dev, t in enumerate(terms) if not is_related(proof, t, constants)]
            try:
                tracer = _Tracer(events, reference_events, proof, evaluator, groups_by_axis)
                traced = tracer.explain(event, devices) or tracer.relaid(event, devices, plain)
            except Exception:  # a heuristic: never let it cost the finding the plain rule gives
                traced = None
            if traced is not None:
                return traced
        return (
            _index_origin(event, by_name, plain)
            or _input_free_origin(event, by_name, constants, plain, shared_lines, lambda ts: classify(ts) == "related")
            or _bounds_origin(event, plain, {(loc.file, loc.line) for e in events for loc in e.inst.stack[:1]})
            or Defect(event.inst, plain, unexplained=True)
        )

    def short_axes(event: Event) -> set[str] | None:
        """The axes of an all-reduce whose value is still a share over another axis it leaves out."""
        terms = _terms(event)
        if event.inst.opcode != "all-reduce" or terms is None or status.get(_key(terms)) != "partial":
            return None
        reduced = reduced_axes(event.inst, groups_by_axis, len(terms))
        return reduced if reduced is not None and partial_axis[_key(terms)] not in reduced else None

    def scaled_sum(event: Event) -> Defect | None:
        """The reduction that completed a sum into a multiple of the reference value which reaches `event`."""
        stack, seen = [event], set[str]()
        while stack:
            e = stack.pop()
            if e.inst.name in seen:
                continue
            seen.add(e.inst.name)
            for op in (by_name.get(name) for name in e.inst.operands):
                op_terms = _terms(op) if op is not None else None
                if op is None or not op_terms:  # no status
                    continue
                key = _key(op_terms)
                e_terms = _terms(e)
                if (
                    status.get(key) == "partial"
                    and e.inst.opcode in REDUCTIONS
                    and e_terms is not None
                    and _key(e_terms) in factors
                ):
                    return _scaled_reduction(e, factors[_key(e_terms)], partial_axis[key], events, constants)
                if status.get(key) == "scaled":
                    stack.append(op)
        return None

    def scaled_reduction_after(event: Event) -> Defect | None:
        """A later reduction that completes a partial sum into k x the reference value (k != 1),
        which no use divides out: a sum where the reference averages. Values before it that the
        proof could not relate (a microbatch's share on its way to it) are steps to that sum."""
        start = next((k for k, e in enumerate(events) if e is event), len(events))
        tried = 0
        for later in events[start + 1 :]:
            terms = _terms(later)
            if later.inst.opcode not in REDUCTIONS or terms is None or terms[0] not in loader.exprs:
                continue
            tried += 1
            if tried > MAX_REDUCTIONS_AHEAD:
                return None
            operand = by_name.get(later.inst.operands[0]) if later.inst.operands else None
            op_terms = _terms(operand) if operand is not None else None
            if operand is None or op_terms is None or settle(operand, op_terms) == "unrelated":
                continue
            if status.get(_key(op_terms)) != "partial":
                continue
            if settle(later, terms) == "scaled" and _key(terms) in factors and not divided_out(later):
                return _scaled_reduction(later, factors[_key(terms)], partial_axis[_key(op_terms)], events, constants)
        return None

    def short_reduction_after(event: Event) -> Defect | None:
        """This or a later all-reduce over the wrong mesh axes (equivci.diagnose.reduction_axes) whose sum
        nothing after it completes. Values before it that the proof could not relate (a
        microbatch's share on its way to it) are steps to that reduction."""
        start = next((k for k, e in enumerate(events) if e is event), len(events))
        tried = 0
        for later in events[start:]:
            terms = _terms(later)
            if later.inst.opcode != "all-reduce" or terms is None or terms[0] not in loader.exprs:
                continue
            tried += 1
            if tried > MAX_REDUCTIONS_AHEAD:
                return None
            reduced = reduced_axes(later.inst, groups_by_axis, len(terms))
            operand = by_name.get(later.inst.operands[0]) if later.inst.operands else None
            op_terms = _terms(operand) if operand is not None else None
            if reduced is None or operand is None or op_terms is None:
                continue
            outcome, before = settle(later, terms), settle(operand, op_terms)
            axis = partial_axis.get(_key(op_terms)) if status.get(_key(op_terms)) == "partial" else None
            if outcome == "unrelated" and before != "unrelated" and axis is not None and axis not in reduced:
                return Defect(later.inst, wrong_axis(reduced, axis), axes=frozenset(reduced))
            axis = partial_axis.get(_key(terms)) if status.get(_key(terms)) == "partial" else None
            if axis is None or axis in reduced:
                continue
            whole, use = taken_whole(later)
            if whole:
                where = _at(use.inst) if use is not None else ""
                return Defect(
                    later.inst, missing_axis(reduced, axis, use.inst if use else None, where), axes=frozenset(reduced)
                )
        return None

    def taken_whole(event: Event) -> tuple[bool, Event | None]:
        """Whether a share of a sum reaches, through uses that stay shares (or multiples of one), a
        use that takes it as the whole value (an unrelated value, or an output), and no use
        completes it (a related value); and the first unrelated use."""
        queue, seen, first = [event], {event.inst.name}, None
        whole = _is_output(_terms(event) or [], output_terms)
        completed, budget = False, MAX_USES_SETTLED
        while queue and not completed:
            e = queue.pop(0)
            for use in op_users.get(e.inst.name, []):
                terms = _terms(use)
                if use.inst.name in seen or terms is None or terms[0] not in loader.exprs:
                    continue
                seen.add(use.inst.name)
                budget -= 1
                if budget < 0:
                    return False, None
                outcome = settle(use, terms)
                completed |= outcome == "related"
                if outcome == "unrelated":
                    whole, first = True, first or use
                else:
                    whole |= _is_output(terms, output_terms)
                    queue.append(use)
        return whole and not completed, first

    def divided_out(event: Event) -> bool:
        """A use of the value, or of a use of it, is related again: the factor was divided out."""
        near = [e for e in events if event.inst.name in e.inst.operands]
        uses = near + [u for e in near for u in events if e.inst.name in u.inst.operands]
        return any((t := _terms(u)) is not None and settle(u, t) == "related" for u in uses[:MAX_USES_SETTLED])

    settled: dict[tuple[int, ...], str] = {}

    def settle(event: Event, terms: list[Term]) -> str:
        """related, partial (its sum over `partial_axis` is related), scaled (a multiple of a related
        or partial value) or unrelated."""
        key = _key(terms)
        if key in settled:
            return settled[key]
        if event.inst.opcode in LAYOUT_OPS and _all_routed(event, by_name, routed):
            routed.update(id(t) for t in terms)  # the same routed rows (or mask entries), laid out anew
            settled[key] = "related"
            return "related"
        if classify(terms) == "related":
            settled[key] = "related"
            return "related"
        sums_by_axis = axis_sums(evaluator, terms, groups_by_axis)
        add_hypotheses(proof, [t for sums in sums_by_axis.values() for t in sums])
        partial_axes = [
            axis for axis, sums in sums_by_axis.items() if all(is_related(proof, t, constants) for t in sums)
        ]
        settled[key] = "unrelated"
        if partial_axes:
            status[key], partial_axis[key], settled[key] = "partial", partial_axes[0], "partial"
            return "partial"
        # Multiples of related values and of partial sums are deferred: a later reduction may
        # divide the factor out (a per-shard mean before its pmean).
        scaled_axes = [axis for axis, sums in sums_by_axis.items() if scaling.factor(sums) is not None]
        factor = scaling.factor(terms) if not scaled_axes else None
        if scaled_axes:
            status[key], partial_axis[key], settled[key] = "partial", scaled_axes[0], "scaled"
        elif factor is not None:
            status[key], factors[key], settled[key] = "scaled", factor, "scaled"
        return settled[key]

    # Each value's uses, by the terms that take it as an argument: through tuples, loop states and
    # the iterations of an unrolled loop, which share instruction names. An argument that is no
    # op's value (a sum of two microbatches whose common factor the evaluator pulled out) passes
    # its use on to the terms inside it.
    producer: dict[int, Event] = {}
    for event in events:
        if (terms := _terms(event)) and event.inst.opcode not in TRIVIAL_OPS:
            producer.setdefault(id(terms[0]), event)
    valued = set(producer)
    users: dict[int, list[Event]] = {}
    for event in events:
        terms = _terms(event)
        if terms is None or event.inst.opcode in TRIVIAL_OPS:
            continue
        inner, seen = [(a, 0) for a in terms[0].args], set()
        while inner:
            arg, level = inner.pop()
            if id(arg) in seen:
                continue
            seen.add(id(arg))
            users.setdefault(id(arg), []).append(event)
            if id(arg) not in valued and level < USE_LEVELS:
                inner.extend((a, level + 1) for a in arg.args)
    op_users: dict[str, list[Event]] = {}
    for event in events:
        for name in dict.fromkeys(event.inst.operands):
            op_users.setdefault(name, []).append(event)
    verdicts: dict[tuple[int, ...], bool | None] = {}
    budget = [ABSORB_BUDGET]

    def absorbed(event: Event, depth: int = 0) -> bool | None:
        """True when the value's uses that reach an output are related, partial sums or multiples of
        one, or absorbed in turn (bounded depth and work), and at least one is; False when one is
        unrelated (or the search gives up); None when no use shows either (its value reaches the
        outputs only inside another term, as a sum of microbatches whose common factor was pulled
        out does)."""
        terms = _terms(event) or []
        key = _key(terms)
        if key in verdicts:
            return verdicts[key]
        verdicts[key] = None
        # A value no term takes as an argument may still be an op's operand: the evaluator folded
        # it into that op's term (a pmax of local maxima is the max of the whole row).
        found = [
            u
            for u in users.get(id(terms[0])) or op_users.get(event.inst.name, [])
            if (t := _terms(u)) and t[0] in loader.exprs
        ]
        seen: set[bool | None] = set()
        for use in found:
            budget[0] -= 1
            if budget[0] <= 0 or depth >= ABSORB_DEPTH:
                seen.add(False)
                break
            use_terms = _terms(use) or []
            # Settling a value (its sums over each axis, its multiples) costs saturation: only the
            # nearest uses are settled, farther ones only classified.
            if (settle(use, use_terms) if depth < SETTLED_DEPTH else classify(use_terms)) in (
                "related",
                "partial",
                "scaled",
            ):
                seen.add(True)
            else:
                seen.add(False if _is_output(use_terms, output_terms) else absorbed(use, depth + 1))
            if False in seen:
                break
        verdicts[key] = False if False in seen else True if True in seen else None
        return verdicts[key]

    def made_of_absorbed(event: Event) -> bool:
        """A value no use shows (it reaches the outputs only inside another term) made from
        absorbed values, and related ones, is absorbed with them: a step on their way."""
        made = [producer.get(id(a)) for a in (_terms(event) or [])[0].args]
        found = [e for e in made if e is not None and e is not event]
        return any(absorbed(e) is True for e in found) and all(
            settle(e, _terms(e) or []) != "unrelated" or absorbed(e) is True for e in found
        )

    def taken_over(event: Event, terms: list[Term]) -> Defect:
        """The defect at `event`, or, for a value autodiff made from related values, at the
        gradient's first use outside autodiff (equivci.diagnose.gradients)."""
        found = explain(event, terms)
        use = first_use_after_autodiff(event, events) if made_by_autodiff(event.inst) else None
        if use is None or found.inst is not event.inst:
            return found
        grad_call = _grad_call_frame(event.inst)
        call = (
            _at(dataclasses.replace(event.inst, stack=event.inst.stack[grad_call:])) if grad_call is not None else None
        )
        return dataclasses.replace(
            found,
            inst=use.inst,
            message=f"this `{use.inst.opcode}` is the first use, outside autodiff, of a gradient "
            f"{f'the grad call at {call} makes' if call else 'autodiff makes'} from values the proof relates to the "
            f"reference's; the gradient is no shard, partial sum or copy of the reference's (the `{event.inst.opcode}` "
            f"JAX attributes to {_at(event.inst)} is the first of its values that stays apart), and nothing after the "
            "call turns it into one: what the program does with the gradient after the call (the reduction over the "
            "devices, a scale) is the first suspect",
            frontier=event.inst,
        )

    add_hypotheses(proof, _unloaded(events, loader.exprs, constants))
    first_scaled: tuple[Event, list[Term]] | None = None
    for event in events:
        terms = _terms(event)
        if terms is None or _key(terms) in defined:
            continue
        defined[_key(terms)] = event
        if event.inst.opcode in TRIVIAL_OPS or terms[0] not in loader.exprs:
            continue
        outcome = settle(event, terms)
        if outcome == "related":
            continue
        output = _is_output(terms, output_terms)
        if outcome == "partial":
            if output:
                return Defect(
                    event.inst,
                    f"this value is a partial sum over mesh axis '{partial_axis[_key(terms)]}' but it is "
                    "returned as the full value: a psum (all-reduce) over that axis is missing",
                    kept=True,
                )
            continue
        if outcome == "scaled":
            first_scaled = first_scaled or (event, terms)
            if not output:
                continue
        elif not output and (absorbed(event) is True or (absorbed(event) is None and made_of_absorbed(event))):
            # Every use of it is related again (a fused projection read in windows, a microbatch's
            # share of a sum): a step of the distributed program's own, not where the programs part.
            status[_key(terms)] = "absorbed"
            continue
        # A multiple that never turns back into the reference value: the sum that made it, or else
        # the first deferred op, as the plain rules would have said.
        found = scaled_sum(event) or scaled_reduction_after(event) or short_reduction_after(event)
        if found is not None:
            return found
        return taken_over(*(first_scaled or (event, terms)))
    if first_scaled:
        return taken_over(*first_scaled)
    return None


def unfinished_output(
    events: list[Event],
    reference_events: list[Event],
    proof: Proof,
    evaluator,
    groups_by_axis: dict[str, list[list[int]]],
    reference_outputs: list[Term],
    device_outputs: list[list[Term]],
) -> Defect | None:
    """An output that is, on some device, a part of a reference value from which the reference
    computes its output through more work (a residual add, a norm, a scale): the distributed program
    returns the value before that work. Blamed where the value is returned."""
    tracer = _Tracer(events, reference_events, proof, evaluator, groups_by_axis)
    finder = MissingWorkFinder(tracer)
    made = {id(t): e for e in events if e.inst.opcode not in TRIVIAL_OPS for t in e.values if isinstance(t, Term)}
    for dev, row in enumerate(proof.proved):
        for k, ok in enumerate(row):
            event = made.get(id(device_outputs[dev][k])) if not ok else None
            owner = finder.owner(event, dev) if event is not None else None
            end = finder.by_term.get(id(reference_outputs[k]))
            if event is None or owner is None or end is None or end is owner:
                continue
            reach = finder.reach(owner)
            work = (
                [e for e in finder.chain(reach, end.inst.name) if e.inst.opcode not in PASSIVE]
                if end.inst.name in reach
                else []
            )
            if not work:
                continue
            found = finder.placed(end, 0, owner, work)
            applies = f"the reference applies {found.what} here: {_where((found.anchor.file, found.anchor.line))}"
            snippet = source_text(found.anchor) if found.anchor.file else ""
            applies += f" (`{snippet}`)" if snippet else ""
            inst, name = _at_return(event.inst)
            value = f"`{name}`" if name else "this value"
            return Defect(
                inst,
                f"{value} is returned as the reference's `{owner.inst.opcode}` ({_at(owner.inst)}) on device {dev}, "
                f"but the reference passes that value through {found.what} before it returns it, and the "
                f"distributed program does not: {applies}.",
                work=found,
                kept=True,
            )
    return None


def _at_return(inst: Instruction) -> tuple[Instruction, str | None]:
    """`inst` placed at the statement that returns the name its line binds (`return y` after
    `y = psum_scatter(...)`), with that name; as it is when its own line returns it."""
    loc = _loc(inst)
    name = _bound_name(*loc) if loc is not None else None
    found = statement(*loc) if loc is not None and name is not None else None
    if loc is None or found is None or not found[1]:
        return inst, name
    func = found[1][-1]
    returns = [
        node
        for node in ast.walk(func)
        if isinstance(node, ast.Return)
        and node.lineno > loc[1]
        and node.value is not None
        and name in {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
    ]
    if len(returns) != 1:
        return inst, name
    return dataclasses.replace(inst, stack=(SourceLoc(loc[0], returns[0].lineno, func.name),) + tuple(inst.stack)), name


INDEXED_READS = {"gather", "dynamic-slice"}
MAX_RELAYOUTS = 8  # ops followed down an operand's chain of transposes and windows
# Uses followed forward to show an unrelated value is related again, and values settled doing so.
ABSORB_DEPTH = 8
ABSORB_BUDGET = 64
SETTLED_DEPTH = 2
USE_LEVELS = 3  # levels of a term that is no op's value searched for the values it uses


def _index_origin(event: Event, by_name: dict[str, Event], plain: str) -> Defect | None:
    """An indexed read (gather, dynamic slice) whose operands are related but whose value is not:
    what it reads is chosen by its indices. When they are computed on one other line of the
    user's code, that line leads and the read is the tied alternative."""
    if event.inst.opcode not in INDEXED_READS:
        return None
    here = _loc(event.inst)
    computed: dict[tuple[str, int], Event] = {}
    stack = [by_name.get(name) for name in event.inst.operands[1:]]
    seen: set[str] = set()
    while stack and len(seen) < 200:
        e = stack.pop()
        if e is None or e.inst.name in seen or (e.inst.opcode in TRIVIAL_OPS and not e.inst.operands):
            continue  # constants, iotas, the device's index and inputs are no computation of an index
        seen.add(e.inst.name)
        loc = _loc(e.inst)
        if loc is not None and loc != here and e.inst.opcode not in LAYOUT_OPS | TRIVIAL_OPS:
            computed.setdefault(loc, e)
            continue
        stack.extend(by_name.get(name) for name in e.inst.operands)
    if len(computed) != 1:
        return None
    loc, made = next(iter(computed.items()))
    return Defect(
        made.inst,
        f"the indices computed here choose what the `{event.inst.opcode}` at {_where(here)} "
        "reads; its data is related to the reference, yet what it reads is not a slice, a "
        "partial sum or a copy of any reference value, so these indices (or how the read uses "
        "them) differ from the reference's",
        alternative=(event.inst, plain + f"; its indices are computed at {_where(loc)}."),
    )


# Elementwise ops for which f(a + b) != f(a) + f(b): a share of a sum is no operand of theirs.
_NONLINEAR = {
    "log",
    "log-plus-one",
    "exponential",
    "exponential-minus-one",
    "sqrt",
    "rsqrt",
    "cbrt",
    "tanh",
    "logistic",
    "power",
    "maximum",
    "minimum",
    "compare",
    "abs",
    "sign",
    "floor",
    "ceil",
}


def _nonlinear_in(opcode: str, k: int, terms: list[Term]) -> bool:
    """The op is not linear in its operand `k` (a divisor is not; nor is a reduce that keeps the
    maximum, minimum or product of its lanes: max(a + b) is no max(a) + max(b))."""
    reducer = terms[0].attrs[0] if opcode == "reduce" and terms and terms[0].op == "reduce" else None
    return opcode in _NONLINEAR or (opcode == "divide" and k == 1) or reducer in _NONLINEAR | {"multiply"}


# Ops whose related value may still hold the wrong elements, chosen by an input-free operand.
_CHOOSERS = LAYOUT_OPS | INDEXED_READS | {"select"}
# Ops that make no value of their own from an input-free operand: its constants, the device's index.
_NO_COMPUTATION = LAYOUT_OPS | {"constant", "partition-id", "replica-id"}


def _input_free_origin(
    event: Event,
    by_name: dict[str, Event],
    constants,
    plain: str,
    shared: AbstractSet[tuple[str, int] | None],
    related: Callable[[list[Term]], bool],
) -> Defect | None:
    """An op whose data is related to the reference but whose value is not, and that takes a value
    computed from no input (a mask, positions, an expert's id, an offset: from iotas, the device's
    index and constants) on one other line of the user's code: that value decides what the op does
    with its data, so the line computing it leads and the op is the tied alternative.

    The walk goes through the op's own line (the rest of its statement: a take's index
    arithmetic, a broadcast; not a `related` value computed from what came in, such as a product of
    the right factors: only one that picks elements by it, a read or a select), through re-layouts and through the lines in `shared`, which the
    reference runs too (a rotation's angles from the positions it is given: the same code, so what
    differs is what the distributed program passes in); it stops at the first input-free op on
    another line, and never follows data (input-dependent values) to other lines. Only a value made
    for this op alone leads: one that other computations use too (a shard's first id, tested at
    both ends of its range) is no likelier wrong than the op, whose line then stays the finding."""
    here = _loc(event.inst)
    if here is None:
        return None
    computed: dict[tuple[str, int], Event] = {}
    data = False
    stack = list(event.inst.operands)
    seen: set[str] = set()
    while stack and len(seen) < 200:
        name = stack.pop()
        e = by_name.get(name)
        if e is None:  # an input, or a tuple element: data
            data = True
            continue
        if name in seen:
            continue
        seen.add(name)
        terms = _terms(e)
        free = terms is not None and all(t in constants or _input_free(t) for t in terms)
        loc = _loc(e.inst)
        data = data or not free
        if free and loc is not None and loc != here and loc not in shared and e.inst.opcode not in _NO_COMPUTATION:
            computed.setdefault(loc, e)
        elif (
            loc is None
            or (loc == here and (free or e.inst.opcode in _CHOOSERS or not related(terms or [])))
            or (free and (loc in shared or e.inst.opcode in LAYOUT_OPS))
        ):
            stack.extend(e.inst.operands)
    if len(computed) > 1:
        # Of several, the one whose value differs from device to device (positions offset by the
        # device's index): one every device computes alike (a key iota) is no part of the sharding.
        varying = {at: e for at, e in computed.items() if len({id(t) for t in e.values}) > 1}
        computed = varying if len(varying) == 1 else computed
    if not data or len(computed) != 1:
        return None
    loc, made = next(iter(computed.items()))
    walked = seen | {event.inst.name}
    if any(made.inst.name in e.inst.operands and e.inst.name not in walked for e in by_name.values()):
        return None
    inst = made.inst
    if _device_index_itself(*loc):
        # The device's index is never the wrong part; what the code does with it on the way is:
        # a name of the op's statement computed from it (an expert's global id, say).
        found = _name_from_device_index(made.inst, here, loc)
        if found is None:
            return None
        inst = found
    at = _loc(inst) or loc
    bound = _bound_name(*at)
    what = f"`{bound}`, computed here" if bound else f"the `{made.inst.opcode}` here computes a value"
    return Defect(
        inst,
        f"{what} from no input (iotas, the device's index, constants), reaches the `{event.inst.opcode}` at "
        f"{_where(here)} with data related to the reference, yet that op's value is not a slice, a partial sum "
        f"or a copy of any reference value: {f'`{bound}`' if bound else 'this value'} differs from the positions, "
        f"mask, ids or offsets the reference uses there, or the `{event.inst.opcode}` uses it in another way",
        alternative=(event.inst, plain + f"; it takes a value computed from no input at {_where(at)}."),
    )


# Ops a subscript's window becomes (a slice of a sharded array is partitioned into pads and slices).
_WINDOW_OPS = {"slice", "dynamic-slice", "pad"}


def _bounds_origin(event: Event, plain: str, op_lines: set[tuple[str, int]]) -> Defect | None:
    """A window op, unrelated although what it cuts is related, whose subscript's bounds read one
    name set by plain Python (an offset into a packed buffer, a line that made no op): that line
    decides the window, and leads; the op is the tied alternative."""
    loc = _loc(event.inst)
    found = statement(*loc) if loc is not None and event.inst.opcode in _WINDOW_OPS else None
    if loc is None or found is None:
        return None
    bounds = [
        part
        for node in ast.walk(found[0])
        if isinstance(node, ast.Subscript)
        for s in ast.walk(node.slice)
        if isinstance(s, ast.Slice)
        for part in (s.lower, s.upper)
        if part is not None
    ]
    origin = _python_origin(loc, bounds, op_lines) if bounds else None
    names = {n.id for b in bounds for n in ast.walk(b) if isinstance(n, ast.Name)}
    if origin is None or len({line for f in found[1] for n in names if (line := assigned_at(f, n, loc[1]))}) != 1:
        return None
    name, line, func = origin
    inst = dataclasses.replace(event.inst, stack=(SourceLoc(loc[0], line, func.name),) + tuple(event.inst.stack))
    return Defect(
        inst,
        f"`{name}`, set here by plain Python, gives the bounds of the subscript at {_where(loc)}, whose value is not "
        "a slice, a partial sum or a copy of any reference value although what it cuts is: the window these "
        f"bounds give is not one the reference reads, and `{name}` is the one name they read",
        alternative=(event.inst, plain + f"; its bounds use `{name}`, set at {_where((loc[0], line))}."),
    )


def _bound_name(file: str, line: int) -> str | None:
    """The one name the statement at `line` assigns, if it assigns one."""
    found = statement(file, line)
    targets = getattr(found[0], "targets", None) if found else None
    if found is not None and isinstance(found[0], (ast.AnnAssign, ast.AugAssign)):
        targets = [found[0].target]
    if targets is None or len(targets) != 1 or not isinstance(targets[0], ast.Name):
        return None
    return targets[0].id


def _input_free(term: Term, limit: int = 2000) -> bool:
    """No input (`param`) reaches the term: it is computed from constants, iotas and the device's
    index. False past `limit` sub-terms (a big term is data in all likelihood)."""
    stack, seen = [term], set[int]()
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if t.op == "param" or len(seen) > limit:
            return False
        stack.extend(t.args)
    return True


def _device_index_itself(file: str, line: int) -> bool:
    """The statement at `line` binds the device's index itself (`i = lax.axis_index("tp")`)."""
    found = statement(file, line)
    value = getattr(found[0], "value", None) if found else None
    return isinstance(value, ast.Call) and callee(value) == "axis_index"


def _name_from_device_index(inst: Instruction, here: tuple[str, int], index: tuple[str, int]) -> Instruction | None:
    """`inst` placed where a name its statement (at `here`) uses is computed from the device's
    index bound at `index`: the Python arithmetic between the two may have emitted no op."""
    found, bound = statement(*here), statement(*index)
    if found is None or bound is None or index[0] != here[0]:
        return None
    index_names = {n.id for t in getattr(bound[0], "targets", []) for n in ast.walk(t) if isinstance(n, ast.Name)}
    used = [n.id for n in ast.walk(found[0]) if isinstance(n, ast.Name)]
    for func in reversed(found[1]):
        for name in used:
            line = assigned_at(func, name, here[1])
            if line is None or line == index[1]:
                continue
            stmt = statement(here[0], line)
            value = getattr(stmt[0], "value", None) if stmt else None
            if value is not None and index_names & {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}:
                return dataclasses.replace(inst, stack=(SourceLoc(here[0], line, func.name),) + tuple(inst.stack))
    return None


def _all_routed(event: Event, by_name: dict[str, Event], routed: set[int]) -> bool:
    operands = [by_name.get(name) for name in event.inst.operands]
    return bool(operands) and all(
        e is not None and (ts := _terms(e)) and all(id(t) in routed for t in ts) for e in operands
    )


def _unloaded(events: list[Event], loaded, constants) -> list[Term]:
    """Event values built on loaded terms and constants but not loaded themselves: a value scaled
    on its way (a per-shard mean) reaches the outputs only through its unscaled base, yet must be
    classified."""
    new: dict[Term, None] = {}
    for event in events:
        for t in _terms(event) or ():
            if (
                t not in loaded
                and t not in new
                and t not in constants
                and t.args
                and all(a in loaded or a in new or a in constants for a in t.args)
            ):
                new[t] = None
    return list(new)


REDUCTIONS = {"all-reduce", "reduce-scatter"}
MAX_REDUCTIONS_AHEAD = 16  # reductions after the first unrelated value settled to look for a scaled sum
MAX_USES_SETTLED = 16  # uses of such a sum (and their uses) settled to see it divided back
_GRAD_CALLS = {"grad", "value_and_grad", "vjp"}


def part_mean(constants: tuple[float, float] | None) -> bool:
    """(±1/n, ±1/(k n)) for whole n and k > 1: a mean's factor over a part of the reference's rows (a
    shard's, a microbatch's), which a later sum over the parts brings back; the sign is the same."""
    if constants is None or not all(isinstance(c, float | int) and c != 0 for c in constants):
        return False
    if (constants[0] > 0) != (constants[1] > 0):
        return False
    # (constants are float32: 1/3 is recovered as the nearest fraction of small denominator)
    mine, reference = (1 / Fraction(abs(c)).limit_denominator(1 << 20) for c in constants)
    return (
        mine.denominator == reference.denominator == 1
        and reference > mine
        and reference.numerator % mine.numerator == 0
    )


def _scaled_reduction(event: Event, factor: Fraction, axis: str, events: list[Event], constants: dict) -> Defect:
    """A sum over `axis` that gives `factor` times the reference value; when a division by a
    constant follows it, the division, whose divisor does not take the factor out."""
    times = f"{float(factor):g} x the reference value"
    grad_call = _grad_call_frame(event.inst) if "transpose(" in event.inst.op_name else None
    if grad_call is None:
        inst = event.inst
        message = (
            f"this all-reduce completes the sum over mesh axis '{axis}' as {times}, and the "
            "factor is never divided out: the per-device terms are summed where the reference "
            "averages (pmean, or divide by the axis size), or the value was summed before"
        )
    else:
        # Autodiff made this reduction (the transpose of using a value that is the same on every
        # device of the axis): the user's line is the grad call, not the forward op JAX attributes it to.
        inst = dataclasses.replace(event.inst, stack=event.inst.stack[grad_call:])
        message = (
            f"the gradient computed here is already summed over mesh axis '{axis}' by autodiff, because "
            "the differentiated inputs are invariant over that axis, and comes out as "
            f"{times}: the factor is never divided out (lax.pcast(..., to='varying') gives per-device "
            "gradients to average)"
        )
    divided = constant_division(event, events, constants)
    if divided is None or divided[1] == factor:
        return Defect(inst, message)
    division, divisor = divided
    made = "by autodiff at the grad call" if grad_call is not None else "by the all-reduce"
    return Defect(
        division.inst,
        f"this division is where the sum over mesh axis '{axis}', made {made} at {_at(inst)} as {times}, "
        f"is divided, but by {divisor:g}, not by {float(factor):g}: the value after it is "
        f"{float(factor / Fraction(divisor)):g} x the reference value",
        alternative=(inst, message + "."),
    )


def _grad_call_frame(inst: Instruction) -> int | None:
    """The index of the innermost frame of `inst` whose statement calls jax.grad or a relative."""
    for k, loc in enumerate(inst.stack):
        if not is_user_frame(loc):
            continue
        found = statement(loc.file, loc.line)
        if found is None:
            continue
        for node in ast.walk(found[0]):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in _GRAD_CALLS:
                    return k
    return None


# -- following a wrong operand back to where it was made ------------------------------------------
# `slice_of(x, r)`: x is a slice or a re-layout of the reference value r; `window_of(x, r)`: x is a
# slice of r, elements in r's order. Localization only: the facts are seeded after a proof failed,
# so they never reach a verdict.
slice_of = relation("slice_of", T, T)
window_of = relation("window_of", T, T)
_x, _e, _r, _y = vars_("_x _e _r _y", T)
_d, _a, _b, _d2, _c, _g = vars_("_d _a _b _d2 _c _g", i64)
(_spec,) = vars_("_spec", String)


def _window_rules(rel, name: str) -> list:
    """A slice of a slice of r is one of r, in whichever order the slices nest."""
    return [
        named(
            f"{name}/slice", "a slice of a slice of r is a slice of r", rel(_x, _r), eq(_e).to(_x.slice(_d, _a, _b))
        ).then(rel(_e, _r)),
        # The proof keeps slices of different dims in one order (the higher dim outside), so a
        # device's window of the reference's y[.., a:b] (a fused projection's part) is written
        # y[c:g, ..][.., a:b], never as a slice of y[.., a:b] itself.
        named(
            f"{name}/reordered",
            "y[c:g along d2][a:b along d] = (y[a:b along d])[c:g along d2] is a slice of r = y[a:b along d]",
            rel(_x, _r),
            eq(_x).to(_y.slice(_d, _a, _b)),
            eq(_e).to(_y.slice(_d2, _c, _g).slice(_d, _a, _b)),
        ).then(rel(_e, _r)),
    ]


SLICE_OF = family(
    "slice_of",
    *_window_rules(slice_of, "slice_of"),
    named(
        "slice_of/reshape",
        "a reshape of a slice of r is a re-layout of r",
        slice_of(_x, _r),
        eq(_e).to(T.reshape(_spec, _x)),
    ).then(slice_of(_e, _r)),
    named(
        "slice_of/transpose",
        "a transpose of a slice of r is a re-layout of r",
        slice_of(_x, _r),
        eq(_e).to(T.transpose(_spec, _x)),
    ).then(slice_of(_e, _r)),
)
WINDOW_OF = family("window_of", *_window_rules(window_of, "window_of"))
CUTTERS = {"slice", "dynamic-slice"}
# Ops that read a part of their first operand, chosen by attributes or index operands.
WINDOW_READS = {"slice", "dynamic-slice", "gather"}
_WINDOW_KEYS = {"slice": "slice", "dynamic-slice": "dynamic_slice_sizes", "gather": "slice_sizes"}
_BINOPS = {
    "add": ast.Add,
    "subtract": ast.Sub,
    "multiply": ast.Mult,
    "divide": ast.Div,
    "power": ast.Pow,
    "dot": ast.MatMult,
}
_CALLS = {
    "dot": ("einsum", "matmul", "dot", "tensordot"),
    "reshape": ("reshape",),
    "broadcast": ("broadcast_to",),
    "select": ("where", "select"),
}
# Calls whose literal arguments are operands too (a `jnp.where` fill value), not attributes.
_LITERAL_OPERANDS = {"select"}


_loc = innermost


@functools.lru_cache(maxsize=64)
def _repo_of(file: str) -> Path | None:
    for parent in Path(file).resolve().parents:
        if (parent / ".git").exists():
            return parent
    return None


def _at(inst: Instruction) -> str:
    """Where `inst` is in the source, else `unlocated(inst)`."""
    loc = _loc(inst)
    return _where(loc) if loc is not None else unlocated(inst)


def unlocated(inst: Instruction) -> str:
    """An op whose metadata gives no source line (made by the compiler, or read from an HLO file):
    its HLO name, marked as such, is the only handle a reader has to find it."""
    return f"no source line, HLO `{inst.name}`"


def _where(loc: tuple[str, int] | None) -> str:
    if loc is None:
        return "an unknown line"
    root = _repo_of(loc[0])
    path = Path(loc[0])
    try:
        shown = path.resolve().relative_to(root).as_posix() if root else path.name
    except ValueError:
        shown = path.name
    return f"{shown}:{loc[1]}"


def _operand_exprs(stmt: ast.stmt, opcode: str, count: int) -> list[ast.expr] | None:
    """The source expressions of an op's operands, when the statement shows them unambiguously."""
    binop = _BINOPS.get(opcode)
    for node in ast.walk(stmt):
        if binop and isinstance(node, ast.BinOp) and isinstance(node.op, binop) and count == 2:
            return [node.left, node.right]
        if isinstance(node, ast.Call):
            if callee(node) in _CALLS.get(opcode, ()):
                args = [a for a in node.args if opcode in _LITERAL_OPERANDS or not isinstance(a, ast.Constant)]
                if callee(node) == "einsum" and len(args) == count + 1:
                    args = args[1:]  # the subscripts, passed by name
                if opcode == "reshape" and isinstance(node.func, ast.Attribute):
                    return [node.func.value] + args
                if len(args) == count:
                    return args
    return None


def _window_attrs(inst: Instruction) -> str:
    """How a window read picks its part, as HLO writes it (a strided slice shows its step)."""
    key = _WINDOW_KEYS[inst.opcode]
    return f"{key}={inst.attrs[key]}" if key in inst.attrs else "a part"


def _operand_name(inst: Instruction, index: int) -> str | None:
    loc = _loc(inst)
    found = statement(*loc) if loc else None
    if found is None:
        return None
    exprs = _operand_exprs(found[0], inst.opcode, len(inst.operands))
    if exprs is None or index >= len(exprs):
        return None
    text = ast.unparse(exprs[index])
    return text if len(text) <= 40 else None


_PERM_ARGS = {"ppermute": 2, "pshuffle": 2}  # call -> position of its permutation argument


def _perm_expr(stmt: ast.stmt) -> ast.expr | None:
    """The permutation argument of the ppermute call in `stmt`."""
    for node in ast.walk(stmt):
        if isinstance(node, ast.Call) and callee(node) in _PERM_ARGS:
            keyword = next((k.value for k in node.keywords if k.arg == "perm"), None)
            if keyword is not None:
                return keyword
            if len(node.args) > _PERM_ARGS[callee(node)]:
                return node.args[_PERM_ARGS[callee(node)]]
    return None


def _expr_origin(file: str, line: int, expr: ast.expr, events: list[Event], depth: int = 3):
    """(file, line, function) where the pure-Python value of `expr` is written.

    A literal, comprehension or lambda is written where it stands; a name (or a call of one) leads
    to its assignment or, for a parameter, to the argument at a call site recorded in the op stacks.
    """
    target = expr.func if isinstance(expr, ast.Call) else expr
    if not isinstance(target, ast.Name) or depth == 0:
        return file, expr.lineno, ""
    found = statement(file, line)
    if found is None:
        return None
    for func in reversed(found[1]):
        assigned = assigned_at(func, target.id, line)
        if assigned is not None:
            return file, assigned, func.name
        if target.id in parameters(func):
            site = call_argument(file, func, target.id, events)
            if site is None:
                return None
            cfile, arg = site
            return _expr_origin(cfile, arg.lineno, arg, events, depth - 1)
    return None


def call_chain_start(loc: SourceLoc, events: list[Event], depth: int = 5) -> SourceLoc:
    """Where the user's call chain that reaches `loc` starts: from the module-level function around
    `loc` to its call seen on the ops' stacks, and so on up. An op's own stack may end early (the
    stacks of a shard_map body's ops end at the body), so the calls come from every op's stack."""
    for _ in range(depth):
        found = statement(loc.file, loc.line)
        if not found or not found[1]:
            return loc
        scope = found[1][0]
        first, last = scope.lineno, scope.end_lineno or scope.lineno
        caller = next(
            (
                outer
                for e in events
                for inner, outer in zip(e.inst.stack, e.inst.stack[1:])
                if inner.file == loc.file
                and first <= inner.line <= last
                and is_user_frame(outer)
                and not (outer.file == loc.file and first <= outer.line <= last)
            ),
            None,
        )
        if caller is None:
            return loc
        loc = caller
    return loc


def _python_origin(loc: tuple[str, int], exprs: list[ast.expr], op_lines: set[tuple[str, int]]):
    """Where a name used in `exprs` was bound by plain Python (a line that emitted no op)."""
    found = statement(*loc)
    if found is None:
        return None
    _, funcs = found
    names = [n.id for expr in exprs for n in ast.walk(expr) if isinstance(n, ast.Name)]
    for func in reversed(funcs):
        for name in names:
            line = assigned_at(func, name, loc[1])
            if line is not None and (loc[0], line) not in op_lines:
                return name, line, func
    return None


def _assigned_value(file: str, line: int) -> ast.expr | None:
    """The value the statement at `line` assigns, if it is an assignment."""
    found = statement(file, line)
    return getattr(found[0], "value", None) if found else None


def _assignment_chain(file: str, line: int, depth: int = 4) -> list[int]:
    """`line` and the lines that assign the names its statement reads, followed back `depth` steps
    inside the enclosing functions, nearest first."""
    lines, frontier = [line], [line]
    for _ in range(depth):
        step = []
        for at in frontier:
            found = statement(file, at)
            value = getattr(found[0], "value", None) if found else None
            if found is None or value is None:
                continue
            for name in {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}:
                assigned = next((a for f in reversed(found[1]) if (a := assigned_at(f, name, at)) is not None), None)
                if assigned is not None and assigned not in lines:
                    lines.append(assigned)
                    step.append(assigned)
        frontier = step
    return lines


class _Tracer:
    def __init__(
        self,
        events: list[Event],
        reference_events: list[Event],
        proof: Proof,
        evaluator,
        groups_by_axis: dict[str, list[list[int]]],
    ):
        self.proof, self.evaluator, self.groups_by_axis = proof, evaluator, groups_by_axis
        self.events = events
        self.by_name = {e.inst.name: e for e in events}
        self.ref_by_name = {e.inst.name: e for e in reference_events}
        self.reference_events = reference_events
        self.order = {e.inst.name: k for k, e in enumerate(events)}
        self.ref_values = []
        seen = set()
        for e in reference_events:
            v = e.values[0]
            if isinstance(v, Term) and v in proof.loader.exprs and id(v) not in seen:
                seen.add(id(v))
                self.ref_values.append((e, v))
        if self.ref_values:  # egglog's register takes at least one command
            proof.egraph.register(*[slice_of(proof.loader.expr(v), proof.loader.expr(v)) for _, v in self.ref_values])
            proof.egraph.run(SLICE_OF.ruleset.saturate())
        self.op_lines = {(loc.file, loc.line) for e in events for loc in e.inst.stack[:1]}
        self.windows_seeded = False  # window_of is saturated only when a finding asks for it

    # -- values ----------------------------------------------------------------------------
    def value(self, event: Event, dev: int) -> Term | None:
        v = event.values[dev] if dev < len(event.values) else event.values[0]
        return v if isinstance(v, Term) else None

    def is_slice_of(self, t: Term | None, r: Term | None) -> bool:
        if t is None or r is None:
            return False
        if t is r:
            return True
        loader = self.proof.loader
        if t not in loader.exprs or r not in loader.exprs:
            return False
        try:
            self.proof.egraph.check(slice_of(loader.expr(t), loader.expr(r)))
            return True
        except Exception:  # egglog reports a failed check as an error
            return False

    def operands(self, event: Event, refs: bool = False) -> list[Event | None]:
        table = self.ref_by_name if refs else self.by_name
        return [table.get(name) for name in event.inst.operands]

    def skip(self, event: Event, dev: int, refs: bool = False) -> Event:
        """Skip ops that hand their operand on unchanged (copies, no-op converts and reshapes)."""
        for _ in range(50):
            ops = self.operands(event, refs)
            mine = self.value(event, 0 if refs else dev)
            nxt = next((o for o in ops if o is not None and self.value(o, 0 if refs else dev) is mine), None)
            if nxt is None or mine is None:
                return event
            event = nxt
        return event

    def matches(self, d: Event | None, r: Event | None, dev: int) -> bool:
        return d is None or r is None or self.is_slice_of(self.value(d, dev), self.value(r, 0))

    # -- the walk ------------------------------------------------------------------------------
    def counterpart(self, event: Event, dev: int) -> tuple[Event, list[int]] | None:
        """The reference op `event` stands for, and the positions of its operands that do not match."""
        loc = _loc(event.inst)
        same = [
            r
            for r in self.reference_events
            if r.inst.opcode == event.inst.opcode and len(r.inst.operands) == len(event.inst.operands)
        ]
        here = [r for r in same if loc is not None and _loc(r.inst) == loc]
        best = None
        for r in here or same:
            ops, rops = self.operands(event), self.operands(r, refs=True)
            bad = [k for k, (o, ro) in enumerate(zip(ops, rops)) if not self.matches(o, ro, dev)]
            # Away from the op's own line, only an operand seen to match ties an op to the
            # reference's: one whose values are not recorded (an input) matches vacuously.
            if not here and not any(
                o is not None and ro is not None and k not in bad for k, (o, ro) in enumerate(zip(ops, rops))
            ):
                continue
            if best is None or len(bad) < len(best[1]):
                best = (r, bad)
        return best

    def descend(self, d: Event, r: Event, dev: int) -> tuple[list[Event], list[Event], str]:
        """Follow a value that is not a slice of its reference counterpart to where that starts."""
        path, rpath = [d], [r]
        for _ in range(200):
            d, r = self.skip(d, dev), self.skip(r, dev, refs=True)
            path[-1], rpath[-1] = d, r
            if d.inst.opcode != r.inst.opcode or len(d.inst.operands) != len(r.inst.operands):
                return path, rpath, "diverge"
            if self.other_window(d, r, dev):
                return path, rpath, "window"
            bad = [
                (o, ro)
                for o, ro in zip(self.operands(d), self.operands(r, refs=True))
                if o is not None and ro is not None and not self.matches(o, ro, dev)
            ]
            if not bad:
                return path, rpath, "own"
            d, r = bad[0]
            path.append(d)
            rpath.append(r)
        return path, rpath, "own"

    def other_window(self, d: Event, r: Event, dev: int) -> bool:
        """Both read a window, and the distributed one is a window of what the reference's reads
        (made another way, a fused projection say): which window it takes is what differs."""
        base = self.operands(r, refs=True)[0] if r.inst.operands else None
        return (
            d.inst.opcode in WINDOW_READS
            and base is not None
            and _loc(d.inst) is not None
            and self.is_slice_of(self.value(d, dev), self.value(base, 0))
        )

    def elsewhere_in(self, window: tuple[Term, tuple] | None) -> bool:
        """`window` cuts a value the reference cuts windows of too, none of them this one."""
        if window is None or not window[1]:
            return False
        theirs = [w[1] for _, v in self.ref_values if (w := _window(v)) is not None and w[0] is window[0] and w[1]]
        return bool(theirs) and window[1] not in theirs

    def ancestors(self, event: Event, dev: int, limit: int = 400) -> list[Event]:
        out, stack, seen = [], [event], set[str]()
        while stack and len(seen) < limit:
            e = stack.pop()
            if e.inst.name in seen:
                continue
            seen.add(e.inst.name)
            out.append(e)
            stack.extend(o for o in self.operands(e) if o is not None)
        return out

    def owner(self, t: Term, prefer: list[Event | None]) -> Event | None:
        """The reference value `t` is a slice of: one of `prefer` if possible, else the latest."""
        for r in prefer:
            if r is not None and self.is_slice_of(t, self.value(r, 0)):
                return r
        for e, v in reversed(self.ref_values):
            if v.op != "param" and self.is_slice_of(t, v):
                return e
        return None

    def constant(self, t: Term | None):
        if t is None:
            return None
        v = self.evaluator.values.get(t)
        if v is None or not all_equal(v):
            return None
        return v.flat[0].item()

    # -- explanations ----------------------------------------------------------------------------
    def explain(self, event: Event, devices: list[int]) -> Defect | None:
        missing = self.missing_work(event, devices[0]) if devices else None
        if missing is not None:
            return missing
        for dev in devices:
            found = self.counterpart(event, dev)
            if found is None:
                continue
            ref, bad = found
            if bad:
                # An operand whose part's window moves back along a mesh axis (a round-robin pick)
                # was cut from the wrong place: the cut leads. Any operand: the compiler may have
                # swapped a dot's operands, so the one that fails to match need not be the one cut.
                defect = self.misaligned_window(event) or self.wrong_operand(event, ref, bad[0], dev)
            else:
                defect = self.fixed_window(event, ref, devices) or self.misaligned_window(event)
            if defect is not None:
                return defect
        return None

    def missing_work(self, event: Event, dev: int) -> Defect | None:
        """The reference computes an operand further than the distributed program does."""
        found = MissingWorkFinder(self).find(event, dev)
        if found is None:
            return None
        owner = found.owner
        param = self.value(owner, 0) if owner.inst.opcode == "parameter" else None
        held = (
            f"input #{param.attrs[0]}"
            if param is not None
            else f"the reference's `{owner.inst.opcode}` ({_at(owner.inst)})"
        )
        applies = f"the reference applies {found.what} here: {_where((found.anchor.file, found.anchor.line))}"
        snippet = source_text(found.anchor) if found.anchor.file else ""
        applies += f" (`{snippet}`)" if snippet else ""
        # The reference op `event` stands for (its line may be the call of a helper that makes it).
        consumer = f"`{event.inst.opcode}` ({_at(found.consumer.inst)})"
        operand = self.operands(event)[found.operand]
        made = self.skip(operand, dev) if operand is not None else None
        at_producer = None
        if made is not None and _loc(made.inst) is not None:
            at_producer = (
                made.inst,
                f"this value is {held}, which the reference passes through {found.what} before "
                f"its {consumer}, and the distributed program does not: {applies}.",
            )
        name = _operand_name(event.inst, found.operand) or f"operand {found.operand + 1}"
        at_consumer = (
            event.inst,
            f"`{name}` goes into this `{event.inst.opcode}` as {held}, without the "
            f"{found.what} the reference applies to it before its {consumer}: {applies}.",
        )
        wanted = self.operands(found.consumer, refs=True)[found.operand]
        holder = self.holder(wanted, event, dev) if wanted is not None else None
        if holder is not None:
            # The distributed program computes what the reference's op reads, the work done: no work
            # is missing, this op reads another value than that one.
            return Defect(
                event.inst,
                f"`{name}` goes into this `{event.inst.opcode}` as {held}, where the reference's {consumer} "
                f"reads that value after {found.what} ({applies}); the distributed program computes that "
                f"value at {_at(holder.inst)}, but this op reads the one from before it.",
                work=found,
            )
        if found.tied and at_producer is not None:
            lead, other = (at_producer, at_consumer) if found.at_producer else (at_consumer, at_producer)
            return Defect(*lead, work=found, alternative=other, kept=found.at_producer)
        produced = found.at_producer and at_producer is not None
        return Defect(*(at_producer if produced and at_producer else at_consumer), work=found, kept=produced)

    def holder(self, wanted: Event, before: Event, dev: int) -> Event | None:
        """The latest distributed op before `before` with a value (or a tuple element, as `top_k`'s)
        that is the reference's `wanted` value (computed from other values, not a constant) or a
        slice of it, of its rank; None when the budget runs out."""
        r = self.value(wanted, 0)
        if r is None or not r.args:
            return None
        checks = self.evaluator.budgets.missing_owner_checks
        for e in reversed(self.events[: self.order.get(before.inst.name, 0)]):
            held = e.values[dev] if dev < len(e.values) else e.values[0]
            for t in held if isinstance(held, tuple) else (held,):
                if not isinstance(t, Term) or (t.dtype, len(t.shape)) != (r.dtype, len(r.shape)):
                    continue
                if t is r:
                    return e
                checks -= 1
                if checks < 0:
                    return None
                if self.is_slice_of(t, r):
                    return e
        return None

    def wrong_operand(self, event: Event, ref: Event, k: int, dev: int) -> Defect | None:
        d_op, r_op = self.operands(event)[k], self.operands(ref, refs=True)[k]
        if d_op is None or r_op is None:  # counterpart() names only operands present on both sides
            return None
        here = _at(event.inst)
        name = _operand_name(event.inst, k) or f"operand {k + 1}"
        rname = _operand_name(ref.inst, k) or f"operand {k + 1}"
        path, rpath, kind = self.descend(d_op, r_op, dev)
        end, rend = path[-1], rpath[-1]
        value = self.value(d_op, dev)
        c_mine, c_ref = self.constant(self.value(end, dev)), self.constant(self.value(rend, 0))
        # Equal constants (a -inf fill of another dtype) show no difference: say nothing of them.
        # A mean over a device's part of the rows where the reference averages them all (1/8 for
        # 1/32) is the distributed program's own step, which a later sum over the parts undoes.
        if c_mine is not None and c_ref is not None and c_mine != c_ref and not part_mean((c_mine, c_ref)):
            lead = (
                f"`{name}` in the `{event.inst.opcode}` there is {c_mine:g} on device {dev}, where the "
                f"reference's `{ref.inst.opcode}` ({_at(ref.inst)}) uses {c_ref:g}"
            )
            found = self.at_python_origin(event, k, lead, path) or Defect(event.inst, lead + ".")
            return dataclasses.replace(found, constants=(c_mine, c_ref))
        if kind == "diverge":
            others = [o for j, o in enumerate(self.operands(ref, refs=True)) if j != k]
            own = self.owner(value, others) if value is not None else None
            if own is not None and own is not r_op:
                which = next((j for j, o in enumerate(self.operands(ref, refs=True)) if o is own), None)
                own_name = (_operand_name(ref.inst, which) if which is not None else None) or f"`{own.inst.opcode}`"
                what = f"is a slice of the reference's {own_name} ({_at(own.inst)})"
            else:
                what = "is not a slice of any reference value it should be"
            lead = (
                f"`{name}`, which feeds the `{event.inst.opcode}` at {here}, {what} on device {dev}, but the "
                f"reference's `{ref.inst.opcode}` there uses {rname} ({_at(r_op.inst)})"
            )
            cutters = [
                a
                for a in self.ancestors(end, dev)
                if a.inst.opcode in CUTTERS and self.constant(self.value(a, dev)) is None and _loc(a.inst) is not None
            ]
            # A window is shown wrong only where the value is one of another reference value, or a
            # window, at other offsets, of a value the reference also cuts a window of (a device's
            # rows of a RoPE table past the reference's); a value that is a slice of none says
            # nothing about the windows cut upstream of it.
            cut = max(cutters, key=lambda a: self.order.get(a.inst.name, -1)) if cutters else None
            window = _window(self.value(cut, dev)) if cut is not None else None
            if cut is not None and ((own is not None and own is not r_op) or self.elsewhere_in(window)):
                shown = ", ".join(f"[{a}:{b}) along dim {d}" for d, a, b in window[1]) if window else ""
                taken = f"the wrong window ({shown} on device {dev})" if shown else f"a wrong window on device {dev}"
                said = f"this slice takes {taken}: {lead}"
                return (
                    self.at_name_binding(event, k, cut, name, said)
                    or self.at_index_origin(cut, said)
                    or Defect(cut.inst, said + ".")
                )
            if own is not None and own is not r_op:
                # The reference's op reads this very value in another place (operands swapped): it
                # is made right, so the line to change is the op that reads it in this place.
                reader = path[-2] if len(path) > 1 else event
                return Defect(reader.inst, f"{lead}; the value is right, this op reads it in the other's place.")
            return Defect(end.inst, f"{lead}; the value is made here.")
        lead = (
            f"so `{name}`, which feeds the `{event.inst.opcode}` at {here}, is not a slice of the reference's "
            f"{rname} ({_at(r_op.inst)}) on device {dev}"
        )
        if kind == "window":
            said = (
                f"this `{end.inst.opcode}` reads {_window_attrs(end.inst)}, a window of the value the reference's "
                f"`{rend.inst.opcode}` ({_at(rend.inst)}) reads {_window_attrs(rend.inst)} of, but not the window "
                f"the reference takes: it picks other elements, {lead}"
            )
            return self.at_name_binding(event, k, end, name, said) or Defect(end.inst, said + ".")
        # The operands of `end` match the reference's, so its own attributes differ (a shape, a window).
        if end.inst.opcode in WINDOW_READS and end.inst.opcode == rend.inst.opcode and _loc(end.inst) is not None:
            said = (
                f"this `{end.inst.opcode}` reads {_window_attrs(end.inst)} of a value related to the "
                f"reference's, where the reference's `{rend.inst.opcode}` ({_at(rend.inst)}) "
                f"reads {_window_attrs(rend.inst)} of it: it picks other elements, {lead}"
            )
            return self.at_name_binding(event, k, end, name, said) or Defect(end.inst, said + ".")
        d_shape, r_shape = self.value(end, dev), self.value(rend, 0)
        if end.inst.opcode == "reshape" and self.per_device_shape(d_shape, r_shape):
            # A reshape of a part of the reference's operand into the reference's blocks, each
            # sharded dim cut by the mesh as expected: the part may not start on a block boundary.
            misaligned = self.misaligned_blocks(end, rend, dev, lead)
            if misaligned is not None:
                return misaligned
        shapes = ""
        if d_shape is not None and r_shape is not None and d_shape.shape != r_shape.shape:
            shapes = f": it gives shape {d_shape.shape} where the reference's gives {r_shape.shape}"
        lead = f"the `{end.inst.opcode}` at {_at(end.inst)} differs from the reference's ({_at(rend.inst)}){shapes}, {lead}"
        if (
            end.inst.opcode == "reshape"
            and d_shape is not None
            and r_shape is not None
            and len(d_shape.shape) == len(r_shape.shape)
        ):
            differ = [j for j, (m, n) in enumerate(zip(d_shape.shape, r_shape.shape)) if m != n]
            refined = self.at_python_origin(end, None, lead, path, dims=differ)
            if refined is not None:
                return refined
        if _loc(end.inst) is None:
            return None
        return Defect(end.inst, lead + ".")

    def per_device_shape(self, mine: Term | None, theirs: Term | None) -> bool:
        """`mine` has `theirs`'s rank, some dims differ, and each is cut by a product of mesh axis sizes:
        the shape a device holds of a sharded value, no defect of its own."""
        if mine is None or theirs is None or len(mine.shape) != len(theirs.shape) or mine.shape == theirs.shape:
            return False
        sizes = {len(groups[0]) for groups in self.groups_by_axis.values() if groups}
        cuts = {1}
        for size in sizes:
            cuts |= {c * size for c in cuts}
        return all(n == m or (m and n % m == 0 and n // m in cuts) for m, n in zip(mine.shape, theirs.shape))

    def misaligned_blocks(self, end: Event, rend: Event, dev: int, lead: str) -> Defect | None:
        """The cut upstream of a reshape whose operand is a part of the reference's operand but whose
        blocks are not the reference's: where that part starts is what differs."""
        cuts = [
            a
            for a in self.ancestors(end, dev)
            if a.inst.opcode in CUTTERS and self.constant(self.value(a, dev)) is None and _loc(a.inst) is not None
        ]
        if not cuts:
            return None
        cut = max(cuts, key=lambda a: self.order.get(a.inst.name, -1))
        said = (
            f"this slice takes a part of the value the reference splits into blocks at {_at(rend.inst)}, but on "
            f"device {dev} the `reshape` at {_at(end.inst)} does not split it into a part of the reference's "
            f"blocks (its shape is the per-device one): where the slice starts does not line up with those "
            f"blocks (or the reshape's blocks are not the reference's), {lead}"
        )
        return self.at_index_origin(cut, said) or Defect(cut.inst, said + ".")

    def at_python_origin(
        self, event: Event, k: int | None, lead: str, path: list[Event], dims: list[int] | None = None
    ) -> Defect | None:
        """Point at the Python line that set a static value (a width, a head size) the op uses."""
        loc = _loc(event.inst)
        found = statement(*loc) if loc else None
        if found is None or loc is None:
            return None
        exprs = _operand_exprs(found[0], event.inst.opcode, len(event.inst.operands))
        if exprs is None:
            return None
        if dims is not None:  # reshape: the shape arguments of the differing dims
            shape_args = exprs[1:]
            if len(shape_args) == 1 and isinstance(shape_args[0], ast.Tuple):
                shape_args = shape_args[0].elts
            if not dims or any(j >= len(shape_args) for j in dims):
                return None
            chosen = [shape_args[j] for j in dims]
        elif k is not None and k < len(exprs):
            chosen = [exprs[k]]
        else:
            return None
        origin = self.python_binding(loc, chosen)
        if origin is None:
            return None
        name, line, func = origin
        stack = (SourceLoc(loc[0], line, getattr(func, "name", "")),) + tuple(event.inst.stack)
        inst = dataclasses.replace(event.inst, stack=stack)
        return Defect(inst, f"`{name}` is set here and used at {_where(loc)}: {lead}.")

    def at_name_binding(self, event: Event, k: int, cut: Event, name: str, said: str) -> Defect | None:
        """The statement in the operand's chain of assignments that computes what the op that cut its
        window computes, when that op is attributed to a line outside the chain: the compiler merged
        two identical computations and kept the other line (`q = x @ w[0]` kept for `k = x @ w[0]`,
        or for `wk = w[0]`)."""
        loc, cut_loc = _loc(event.inst), _loc(cut.inst)
        found = statement(*loc) if loc is not None else None
        exprs = _operand_exprs(found[0], event.inst.opcode, len(event.inst.operands)) if found else None
        if loc is None or cut_loc is None or exprs is None or k >= len(exprs):
            return None
        origin = _expr_origin(loc[0], loc[1], exprs[k], self.events)
        if origin is None or not origin[2] or (origin[0], origin[1]) == loc:
            return None
        file, function = origin[0], origin[2]
        chain = _assignment_chain(file, origin[1])
        cut_value = _assigned_value(*cut_loc)
        if (cut_loc[0] == file and cut_loc[1] in chain) or cut_value is None:
            return None
        # A computation, not a name or a literal, that the cut's statement computes too.
        merged = {ast.dump(e) for e in ast.walk(cut_value) if isinstance(e, (ast.Call, ast.BinOp, ast.Subscript))}
        line = next((at for at in chain if ast.dump(_assigned_value(file, at) or ast.Pass()) in merged), None)
        if line is None:
            return None
        inst = dataclasses.replace(cut.inst, stack=(SourceLoc(file, line, function),) + tuple(cut.inst.stack))
        return Defect(
            inst,
            f"`{name}` gets its value from this line, whose computation the compiler merged with the same "
            f"expression at {_where(cut_loc)} (it keeps one line for both): "
            f"{said}.",
        )

    def python_binding(self, loc, exprs):
        return _python_origin(loc, exprs, self.op_lines)

    def relaid(self, event: Event, devices: list[int], plain: str) -> Defect | None:
        """A dot whose operands are windows of the reference dot's, one of them transposed on
        another line, and which contracts (or batches) other dims of it than the reference does:
        the transpose leads (a head split as (head_dim, heads) then swapped), the dot is the tied
        alternative. A transpose the dot's dims follow is a layout of its own, never blamed."""
        dev = devices[0] if devices else 0
        found = self.counterpart(event, dev) if event.inst.opcode == "dot" else None
        if found is None or found[1]:
            return None
        ref = found[0]
        for k, (operand, r_op) in enumerate(zip(self.operands(event), self.operands(ref, refs=True))):
            laid = self.transposed_window(operand, r_op, dev) if operand is not None and r_op is not None else None
            if laid is None or r_op is None:
                continue
            made, dims = laid
            side = "lhs" if k == 0 else "rhs"
            roles = [
                {dims[i] for i in dims_attr(event.inst.attrs.get(f"{side}_{role}_dims"))}
                == set(dims_attr(ref.inst.attrs.get(f"{side}_{role}_dims")))
                for role in ("contracting", "batch")
            ]
            if all(roles) or _loc(made.inst) in (None, _loc(event.inst)):
                continue
            return Defect(
                made.inst,
                f"this `transpose` lays out a window of the reference's `{r_op.inst.opcode}` ({_at(r_op.inst)}) "
                f"with its dims in another order, and the `dot` at {_at(event.inst)} then "
                f"{'contracts' if not roles[0] else 'batches'} other dims of it than the reference's `dot` "
                f"({_at(ref.inst)}) does: the dims are split or ordered otherwise than the reference's",
                alternative=(event.inst, plain + f"; its operand is transposed at {_at(made.inst)}."),
            )
        return None

    def transposed_window(self, operand: Event, r_op: Event, dev: int) -> tuple[Event, list[int]] | None:
        """(the outermost transpose, for each dim of `operand` the dim of `r_op` it holds) when
        `operand` is a window of `r_op`'s value through windows and transposes, one at least."""
        d, r = self.skip(operand, dev), self.skip(r_op, 0, refs=True)
        dims = list(range(len(d.inst.shape.dims)))
        made = None
        for _ in range(MAX_RELAYOUTS):
            if self.is_window_of(self.value(d, dev), self.value(r, 0)):
                return (made, dims) if made is not None else None
            if d.inst.opcode == "transpose":
                perm = dims_attr(d.inst.attrs.get("dimensions"))
                dims = [perm[i] for i in dims]
                made = made or d
            elif d.inst.opcode not in CUTTERS:
                return None
            below = self.operands(d)[0] if d.inst.operands else None
            if below is None:
                return None
            d = self.skip(below, dev)
        return None

    def is_window_of(self, t: Term | None, r: Term | None) -> bool:
        """`t` is a window of `r`, its elements in `r`'s order (no re-layout between them)."""
        loader, egraph = self.proof.loader, self.proof.egraph
        if t is None or r is None or t not in loader.exprs or r not in loader.exprs:
            return False
        if not self.windows_seeded:
            egraph.register(*[window_of(loader.expr(v), loader.expr(v)) for _, v in self.ref_values])
            egraph.run(WINDOW_OF.ruleset.saturate())
            self.windows_seeded = True
        try:
            egraph.check(window_of(loader.expr(t), loader.expr(r)))
            return True
        except Exception:  # egglog reports a failed check as an error
            return False

    def fixed_window(self, event: Event, ref: Event, devices: list[int]) -> Defect | None:
        """Operands that are slices of the right values, but one holds the same window on every device."""
        ops = self.operands(event)
        varying: list[int] = []
        fixed: list[tuple[int, Event]] = []
        for k, op in enumerate(ops):
            if op is None:
                # An input of the shard body (no op made it): its own terms show its window.
                given = [v.args[k] if isinstance(v, Term) and k < len(v.args) else None for v in event.values]
                windows = [_window(t) for t in given]
                if all(w is not None and w[1] for w in windows) and len(set(windows)) > 1:
                    varying.append(k)
                continue
            kinds = set()
            for a in self.ancestors(op, 0):
                windows = [_window(self.value(a, dev)) for dev in range(len(a.values))]
                known = [w for w in windows if w is not None]
                if len(known) < len(windows) or not known[0][1]:
                    continue
                kinds.add("fixed" if all(w == known[0] for w in known) else "varying")
            if "varying" in kinds:
                varying.append(k)
            elif "fixed" in kinds:
                fixed.append((k, op))
        if not varying or not fixed:
            return None
        k, fixed_op = fixed[0]
        slices = [
            (a, w)
            for a in self.ancestors(fixed_op, 0)
            if (w := _window(self.value(a, 0))) is not None and w[1] and _loc(a.inst) is not None
        ]
        if not slices:
            return None
        first, first_window = min(slices, key=lambda aw: self.order.get(aw[0].inst.name, 1 << 30))
        name = _operand_name(event.inst, k) or f"operand {k + 1}"
        other = _operand_name(event.inst, varying[0]) or f"operand {varying[0] + 1}"
        dims = ", ".join(f"[{a}:{b})" for _, a, b in first_window[1])
        said = (
            f"the same window {dims} of the reference's on every device, so `{name}` in the "
            f"`{event.inst.opcode}` at {_at(event.inst)} does not line up with `{other}`, whose window "
            "moves with the device: an offset by the device's position (axis_index) is missing."
        )
        return self.at_name_setting(event, k, first, said) or Defect(first.inst, f"this value takes {said}")

    def at_name_setting(self, event: Event, k: int, cut: Event, said: str) -> Defect | None:
        """Where the name operand `k` is read through is set, when its window is cut on the op's own
        line (a constant table folded into the op): that line chose the window."""
        loc = _loc(event.inst)
        found = statement(*loc) if loc is not None and _loc(cut.inst) == loc else None
        exprs = _operand_exprs(found[0], event.inst.opcode, len(event.inst.operands)) if found else None
        origin = _python_origin(loc, [exprs[k]], set()) if loc is not None and exprs and k < len(exprs) else None
        if loc is None or origin is None or origin[1] == loc[1]:
            return None
        name, line, func = origin
        inst = dataclasses.replace(event.inst, stack=(SourceLoc(loc[0], line, func.name),) + tuple(event.inst.stack))
        return Defect(inst, f"`{name}`, set here, holds {said}", alternative=(cut.inst, f"this value takes {said}"))

    def misaligned_window(self, event: Event) -> Defect | None:
        """Operands that are slices of the right values, but one's window moves back along a mesh
        axis (a round-robin pick of a replicated weight's part): it pairs with other devices' parts.
        The window is of an input, or of a value every device computes alike (a projection the
        slice was pushed through)."""
        for k, op in enumerate(self.operands(event)):
            if op is None or _terms(op) is None:
                continue
            cuts: list[tuple[str, int, list[tuple[int, int]], list[Term] | None]] = [
                (f"input #{leaf}", dim, ranges, None)
                for (leaf, dim), ranges in input_windows([list(op.values)]).items()
            ]
            cuts += [
                ("a computed value", dim, ranges, windows)
                for windows, dim, ranges in _common_base_windows(list(op.values))
            ]
            for what, dim, ranges, windows in cuts:
                back = window_goes_back(ranges, self.groups_by_axis)
                if back is None:
                    continue
                if windows is None:
                    cut = cutter(self.events, int(what.removeprefix("input #")), dim, ranges)
                else:
                    cut = _producer_of(self.events, windows) or op
                at = _loc(cut.inst) if cut is not None else None
                if cut is None or at is None:
                    continue
                axis, a, b = back
                # The name the cut's own line binds: the compiler may have reordered the op's operands.
                name = _bound_name(*at) or _operand_name(event.inst, k) or f"operand {k + 1}"
                lead = (
                    f"this slice of {what} along dim {dim} takes {_shown(ranges)} on devices "
                    f"0..{len(ranges) - 1}: along mesh axis '{axis}' the window moves back (device {b} takes "
                    f"[{ranges[b][0]}:{ranges[b][1]}) after device {a}'s [{ranges[a][0]}:{ranges[a][1]})), so "
                    f"`{name}` in the `{event.inst.opcode}` at {_at(event.inst)} is a part of the "
                    "reference's that does not line up with the other operands' parts"
                )
                return self.at_index_origin(cut, lead) or Defect(cut.inst, lead + ".")
        return None

    def at_index_origin(self, cut: Event, lead: str) -> Defect | None:
        return at_index_origin(cut, lead, self.events, self.op_lines)


_DYNAMIC_CUT = re.compile(r"dynamic_(slice|index)")  # lax.dynamic_slice(_in_dim), dynamic_index_in_dim


def at_index_origin(cut: Event, lead: str, events: list[Event], op_lines: set[tuple[str, int]]) -> Defect | None:
    """Point at the Python line that computes the device-dependent index a dynamic slice starts
    at (`kv_head = i % n` used as `kv_head * HEAD_DIM`): where the device-to-part map is written.
    An index the enclosing function receives as a parameter is computed where its caller passes it."""
    loc = _loc(cut.inst)
    found = statement(*loc) if loc else None
    calls = (
        [n for n in ast.walk(found[0]) if isinstance(n, ast.Call) and _DYNAMIC_CUT.search(callee(n))] if found else []
    )
    if not found or loc is None or len(calls) != 1 or len(calls[0].args) < 2:
        return None
    origin = _index_source(loc[0], loc[1], calls[0].args[1], cut.inst.stack, events, op_lines)
    if origin is None:
        return None
    file, line, function, text, passed_as = origin
    inst = dataclasses.replace(cut.inst, stack=(SourceLoc(file, line, function),) + tuple(cut.inst.stack))
    how = f"is passed here as `{passed_as}`" if passed_as else "is computed here"
    return Defect(inst, f"`{text}` {how} and gives the start of the slice at {_where(loc)}: {lead}.")


def _index_source(
    file: str,
    line: int,
    expr: ast.expr,
    stack: tuple[SourceLoc, ...],
    events: list[Event],
    op_lines: set[tuple[str, int]],
    depth: int = 3,
) -> tuple[str, int, str, str, str | None] | None:
    """(file, line, function, what, parameter) where a device-dependent name used in `expr` is
    computed: its assignment in an enclosing function or, for a parameter, what the caller on
    `stack` passes (followed to where that is computed, else the call itself)."""
    found = statement(file, line)
    if found is None:
        return None
    names = [n.id for n in ast.walk(expr) if isinstance(n, ast.Name)]
    for func in reversed(found[1]):
        for name in names:
            assigned = assigned_at(func, name, line)
            if assigned is None and name in parameters(func):
                site = call_argument(file, func, name, events, stack)
                if site is None:
                    continue
                cfile, arg = site
                deeper = _index_source(cfile, arg.lineno, arg, stack, events, op_lines, depth - 1) if depth else None
                if deeper is not None:
                    return deeper
                if _device_index(cfile, arg.lineno, arg, op_lines):
                    return cfile, arg.lineno, "", ast.unparse(arg), name
                continue
            bound = statement(file, assigned) if assigned is not None else None
            value = getattr(bound[0], "value", None) if bound else None
            # A start that is the name alone is wholly decided where the name is bound, even to the
            # device's index itself (`e0 = lax.axis_index("ep")` where the start is e0 * size).
            alone = isinstance(expr, ast.Name) and isinstance(value, ast.Call) and callee(value) == "axis_index"
            if assigned is not None and value is not None and (alone or _device_index(file, assigned, value, op_lines)):
                return file, assigned, func.name, name, None
    return None


def _device_index(file: str, line: int, value: ast.expr, op_lines: set[tuple[str, int]]) -> bool:
    """`value`, written at `line`, is computed on the device (it emitted ops) from more than the
    device index itself."""
    return (file, line) in op_lines and not (isinstance(value, ast.Call) and callee(value) == "axis_index")


def _window(t: Term | None) -> tuple[Term, tuple] | None:
    """A term as (base, ((dim, start, stop), ...)) through its outer slices."""
    if t is None or not isinstance(t, Term):
        return None
    parts = []
    while t.op == "slice":
        parts.append(t.attrs)
        t = t.args[0]
    return t, tuple(sorted(parts))


def source_of(inst: Instruction, repo_root: str) -> tuple[str | None, int | None]:
    """The innermost frame of `inst` inside the user's repository, as a repo-relative path."""
    root = Path(repo_root).resolve()
    for loc in inst.stack:
        try:
            path = Path(loc.file).resolve()
        except (OSError, ValueError):
            continue
        if "site-packages" in path.parts or path.name.startswith("<"):
            continue
        try:
            return path.relative_to(root).as_posix(), loc.line
        except ValueError:
            continue
    return None, None
