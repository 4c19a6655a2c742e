"""From the localizer's defect to the findings a reviewer reads.

One root cause gives one finding: its layer is the op's own named scope (an op outside every
scope, such as the LM head or the final norm, has none), and the other layers whose proof failed
and that run the same line are named in it rather than reported again. The numeric frontier
(equivci/diagnose/numeric.py) confirms the finding or, where the proof's first unrelated op
matches the reference numerically, goes first. Where the evidence ties between two lines, both
are reported with one `tie` number, the first as the error; equivci.diagnose.ranking puts a line
the pull request changed first.
"""

from __future__ import annotations

import ast
import dataclasses
import keyword
from pathlib import Path

from equivci.capture.types import CapturedModel
from equivci.diagnose.arguments import Choice, literal_written, made_in, passed_choice, written_callback
from equivci.diagnose.frames import innermost, library_call, shared_call
from equivci.diagnose.handed import handed_origin
from equivci.diagnose.localize import Defect, call_chain_start, part_mean, source_of, unlocated
from equivci.diagnose.nearest import nearest_located
from equivci.diagnose.numeric import NumericFrontier
from equivci.diagnose.precision import narrowing, rounding_message
from equivci.diagnose.siblings import departure, one_statement, returns_its_argument
from equivci.diagnose.source import callee
from equivci.hlo.ir import Instruction, SourceLoc
from equivci.layers.segments import Layering, layer_of, leaves
from equivci.results import Finding
from equivci.translate.evaluator import Event

SHOWN_LAYERS = 3
ADDITIVE = {"add", "subtract"}  # ops whose operands an all-reduce of their result sums term by term


def layer_label(inst: Instruction, events: list[Event], layering: Layering | None) -> str | None:
    """The op's own named scope; for an op without a name, the layer its value was counted in."""
    if inst.op_name or layering is None:
        return layer_of(inst.op_name)
    for event in events:
        if event.inst is inst:
            return next((layering.label.get(v) for v in leaves(event.values[0])), None)
    return None


def same_line_layers(inst: Instruction, events: list[Event], failed: set[str]) -> list[str]:
    """The other failed layers that run an op of the same kind at the same line."""
    here, own = innermost(inst), layer_of(inst.op_name)
    if here is None:
        return []
    found = {layer_of(e.inst.op_name) for e in events if e.inst.opcode == inst.opcode and innermost(e.inst) == here}
    return sorted((name for name in found if name in failed and name != own), key=_natural)


def _natural(name: str) -> tuple:
    digits = "".join(c if c.isdigit() else " " for c in name).split()
    return (name.rstrip("0123456789"), int(digits[-1]) if digits else -1)


def _more_layers(names: list[str]) -> str:
    shown = ", ".join(names) if len(names) <= SHOWN_LAYERS else f"{names[0]} ... {names[-1]}"
    noun = "layer" if len(names) == 1 else "layers"
    return f" The same line runs in {len(names)} more {noun} ({shown}), whose proof fails too."


def _finding(
    inst: Instruction,
    message: str,
    captured: CapturedModel,
    events: list[Event],
    layering: Layering | None,
    severity: str = "error",
    tie: int | None = None,
) -> Finding:
    path, line = source_of(inst, captured.repo_root)
    near = nearest_located(inst, events, captured.repo_root) if path is None else None
    if near is not None:
        path, line = source_of(near[0], captured.repo_root)
        message += (
            f" XLA made this `{inst.opcode}` ({unlocated(inst)}); the line is that of the `{near[0].opcode}` {near[1]}."
        )
    return Finding(path, line, severity, layer_label(inst, events, layering), message, op=inst.name, tie=tie)


def defect_findings(
    defect: Defect,
    captured: CapturedModel,
    events: list[Event],
    layering: Layering | None,
    failed_layers: set[str],
    frontier: NumericFrontier | None = None,
    outputs_equal: bool = False,
    shown: bool = True,
    reference_events: list[Event] | None = None,
    reference_lines: frozenset[tuple[str, int]] = frozenset(),
    entry: tuple[str, str] | None = None,
    foreign: tuple[tuple[str, str], ...] = (),
) -> list[Finding]:
    """The findings for `defect`, ranked with the numeric frontier when there is one.

    `outputs_equal`: the numeric oracle ran and found the outputs equal (an unproven model).
    `shown`: a check showed the programs differ (a counterexample); without one, the finding says
    what could not be related and where the reference computes it, and claims no defect.
    `reference_lines`: the (file, line) pairs on the reference program's op stacks.
    `entry`: (file, function) of the distributed entrypoint, where its call chain starts; `foreign`:
    those of the manifest's models checked against another reference."""
    if shown:
        found = _defect_findings(defect, captured, events, layering, failed_layers, frontier, outputs_equal)
        kept, use = _kept(defect, frontier, found)
        found = _received(found, kept, captured, reference_lines)
        runs = frozenset(loc.function.split(".")[-1] for e in reference_events or () for loc in e.inst.stack)
        taking = _receiving(use, captured, reference_lines) if use is not None else None
        found = _caller_choices(found, captured, events, entry, foreign, runs, taking, reference_lines)
        found = _axes_written(found, defect, captured, events, entry)
    else:
        inst = defect.frontier or defect.inst
        found = [
            (
                _finding(
                    inst,
                    _unrelated(defect, captured, events, reference_events or [], outputs_equal),
                    captured,
                    events,
                    layering,
                ),
                inst,
            )
        ]
    return _located_first(_library_callers(found, captured, events, reference_lines))


def _defect_findings(
    defect: Defect,
    captured: CapturedModel,
    events: list[Event],
    layering: Layering | None,
    failed_layers: set[str],
    frontier: NumericFrontier | None,
    outputs_equal: bool,
) -> list[tuple[Finding, Instruction | None]]:
    message = defect.message
    if defect.context is not None:
        cpath, cline = source_of(defect.context, captured.repo_root)
        where = f"{cpath}:{cline}" if cpath else unlocated(defect.context)
        message += f" (it is combined with the other operand at {where}, `{defect.context.opcode}`)"
    message = message if message.endswith((".", "!")) else message + "."
    more = same_line_layers(defect.inst, events, failed_layers)
    if more:
        message += _more_layers(more)
    numeric = frontier.event if frontier is not None else None
    if numeric is not None and _before(numeric.inst, defect, events):
        # The proof related (or deferred, as a routed or scaled value) what numerics cannot
        # match to a single reference value: the proof's order stands.
        numeric = None
    if frontier is not None and numeric is not None and frontier.partial is not None:
        # A partial sum used as the full value is the difference itself, whatever the proof could
        # not relate before it: the all-reduce it lacks belongs where it is made.
        summed, axis, use = frontier.partial
        upath, uline = source_of(use.inst, captured.repo_root)
        later = _finding(defect.inst, f"where the proof stops: {message}", captured, events, layering, severity="note")
        if frontier.reduced_after is not None and use.inst.opcode in ADDITIVE:
            inside = _summed_inside(summed, axis, use, frontier.reduced_after, captured, events, layering)
            return [(inside, use.inst), (later, defect.inst)]
        first = _finding(
            summed.inst,
            f"on random inputs (the numeric oracle's seed 0) this value is a partial sum over mesh axis "
            f"'{axis}' (its sum over the devices of that axis is a reference value, it alone is none), "
            f"and no all-reduce follows: the `{use.inst.opcode}` at "
            f"{f'{upath}:{uline}' if upath else unlocated(use.inst)} uses it as the full value, so a psum "
            "(all-reduce) over that axis is missing here.",
            captured,
            events,
            layering,
        )
        return [(first, summed.inst), (later, defect.inst)]
    missing_rule = defect.unexplained and frontier is not None and frontier.start_matches
    if (
        frontier is not None
        and numeric is not None
        and (missing_rule or frontier.apart)
        and not _agrees(defect, numeric.inst)
    ):
        # A value numerics confirms differs leads one the proof only could not relate and whose
        # value (or one computed from it) matches a reference value on the draw; a defect the proof
        # explains (a wrong window, a missing sum) keeps the lead: numerics cannot tell the right
        # reference value from another. Unless the difference is apart from the stop, not computed
        # from it: then the stop (an index numerics does not compare, a value it matches) cannot
        # account for it, whatever the proof says of the stop.
        if missing_rule:
            after = "after the op where the proof stops (next finding)."
            stop = (
                "the proof cannot relate the value here to the reference, but on random inputs it (or a value "
                f"computed from it) matches one, so this may be a missing rule, not the defect: {message}"
            )
        else:
            after = "not computed from the op where the proof stops (next finding), so that op does not explain it."
            stop = f"where the proof stops: {message}"
        first = _finding(
            numeric.inst,
            f"on random inputs (the numeric oracle's seed 0) this `{numeric.inst.opcode}` "
            f"gives device {frontier.device} the first distributed value that is no shard, "
            f"copy or partial sum of any reference value and that no value computed from it matches again, {after}",
            captured,
            events,
            layering,
        )
        later = _finding(defect.inst, stop, captured, events, layering, severity="warning" if missing_rule else "note")
        return [(first, numeric.inst), (later, defect.inst)]
    if numeric is not None and innermost(numeric.inst) == innermost(defect.inst):
        message += " On random inputs, this is where the values first differ from the reference's."
    elif numeric is not None:
        npath, nline = source_of(numeric.inst, captured.repo_root)
        message += (
            f" On random inputs, the values first differ from the reference's at the `{numeric.inst.opcode}` "
            f"at {f'{npath}:{nline}' if npath else unlocated(numeric.inst)}."
        )
    elif frontier is not None and frontier.event is None and frontier.note is None and outputs_equal:
        message = (
            "the proof cannot relate the value here to the reference, yet on random inputs every distributed "
            "value matches a reference value and the outputs agree: likely a rule equivci lacks, not a "
            f"defect. The proof's view: {message}"
        )
    findings: list[tuple[Finding, Instruction | None]] = [
        (_finding(defect.inst, message, captured, events, layering, tie=0 if defect.alternative else None), defect.inst)
    ]
    if defect.alternative is not None:
        inst, why = defect.alternative
        findings.append((_finding(inst, why, captured, events, layering, severity="note", tie=0), inst))
    if frontier is not None and frontier.note:
        findings.append((Finding(None, None, "note", None, frontier.note), None))
    return findings


def _summed_inside(
    summed: Event,
    axis: str,
    use: Event,
    reduced: Event,
    captured: CapturedModel,
    events: list[Event],
    layering: Layering | None,
) -> Finding:
    """`psum(partial + full)`: an all-reduce over an axis sums every term of what it is handed, so a
    value the same on every device of that axis, added to a partial sum inside it, is counted once
    per device; the add is where it enters the sum, the line to change."""
    return _finding(
        use.inst,
        f"on random inputs (the numeric oracle's seed 0) this `{use.inst.opcode}` combines a partial sum over "
        f"mesh axis '{axis}' (the `{summed.inst.opcode}` at {_where(summed.inst, captured)}: its sum over the "
        "devices of that axis is a reference value, it alone is none) with a value that is not one, and the "
        f"all-reduce over that axis at {_where(reduced.inst, captured)} sums the result: the other operand is "
        "summed over the devices of the axis too (a value the same on each is counted once per device). The "
        "all-reduce belongs on the partial sum alone, before this op.",
        captured,
        events,
        layering,
    )


def _where(inst: Instruction, captured: CapturedModel) -> str:
    path, line = source_of(inst, captured.repo_root)
    return f"{path}:{line}" if path else unlocated(inst)


def _kept(
    defect: Defect, frontier: NumericFrontier | None, found: list[tuple[Finding, Instruction | None]]
) -> tuple[Instruction | None, Instruction | None]:
    """The lead's op when its own value is a reference value or a share of one (a partial sum no
    all-reduce follows, a value the reference passes through more work): the fault follows it; and
    the op that takes it as it is (the full value, the value after the work): the work belongs
    between the two."""
    lead = found[0][1] if found else None
    partial = frontier.partial if frontier is not None else None
    if lead is not None and partial is not None and lead is partial[0].inst:
        return lead, partial[2].inst
    if lead is None or not defect.kept or lead is not defect.inst:
        return None, None
    return lead, (defect.frontier if defect.work is not None else None)


def _receiving(inst: Instruction, captured: CapturedModel, reference_lines: frozenset[tuple[str, int]]) -> Instruction:
    """`inst` seen from the distributed program's own code: with the stack of its call into the
    shared code it is made in, if any."""
    shared = shared_call(inst, captured.repo_root, reference_lines)
    return inst if shared is None else dataclasses.replace(inst, stack=inst.stack[inst.stack.index(shared[1]) :])


def _received(
    found: list[tuple[Finding, Instruction | None]],
    kept: Instruction | None,
    captured: CapturedModel,
    reference_lines: frozenset[tuple[str, int]],
) -> list[tuple[Finding, Instruction | None]]:
    """A value made right in code both programs run, whose fault is what follows it (the all-reduce
    or the residual add it lacks): the lead moves to where the distributed program's own code
    receives it, the call into the shared code, and not to what the shared code was handed
    (equivci.diagnose.handed: that holds for a shared op whose value differs). The lead's op keeps
    the call's stack, so that a choice its caller makes there (`combine(y)`, a callable another
    call passes otherwise) is searched from that statement; the op's own line stays as a tied note."""
    if kept is None:
        return found
    lead, rest = found[0][0], found[1:]
    shared = shared_call(kept, captured.repo_root, reference_lines)
    if lead.severity != "error" or lead.tie is not None or shared is None:
        return found
    called = _receiving(kept, captured, reference_lines)
    path, line = source_of(called, captured.repo_root)
    if path is None:
        return found
    tie = _new_tie(found)
    moved, note = _moved(
        lead,
        (path, line, tie),
        f"the `{kept.opcode}` at {lead.path}:{lead.line} is in code both programs run and its value is the "
        "reference's (or a share of it); the distributed program receives it here, where what the reference "
        f"does after it is missing. There: {lead.message}",
        f"the `{kept.opcode}` that the finding at {path}:{line} is about is made here, in code the reference runs too.",
    )
    return [(moved, called), (note, None)] + rest


def _library_callers(
    findings: list[tuple[Finding, Instruction | None]],
    captured: CapturedModel,
    events: list[Event],
    reference_lines: frozenset[tuple[str, int]],
) -> list[Finding]:
    """An error on an op made while a shared adapter runs a library moves to where the distributed
    program's own call chain into the adapter starts; the op's own line stays as a tied note."""
    out: list[Finding] = []
    ties = max((f.tie for f, _ in findings if f.tie is not None), default=-1)
    for finding, inst in findings:
        found = library_call(inst, captured.repo_root, reference_lines) if inst is not None else None
        shared = shared_call(inst, captured.repo_root, reference_lines) if inst is not None and not found else None
        if inst is None or not (found or shared) or finding.severity != "error" or finding.tie is not None:
            out.append(finding)
            continue
        if shared is not None:
            out += _shared_caller(finding, inst, shared, captured, ties + 1, events, reference_lines)
            ties += 1
            continue
        assert found is not None
        call, library, start = found
        start = call_chain_start(start, events)
        lead_path, lead_line = source_of(dataclasses.replace(inst, stack=(start,) + inst.stack), captured.repo_root)
        call_path, call_line = source_of(dataclasses.replace(inst, stack=(call,)), captured.repo_root)
        if (lead_path, lead_line) == (finding.path, finding.line):
            out.append(finding)
            continue
        ties += 1
        out.append(
            dataclasses.replace(
                finding,
                path=lead_path,
                line=lead_line,
                tie=ties,
                message=f"{finding.message} The `{inst.opcode}` is made while {call_path}:{call_line}, which the "
                f"reference runs too, runs library code ({Path(library.file).name}:{library.line}); this line, "
                "which the reference does not run, is where the distributed program's call chain into it starts, "
                "with the arguments it passes down.",
            )
        )
        out.append(
            dataclasses.replace(
                finding,
                severity="note",
                tie=ties,
                message=f"the `{inst.opcode}` that the finding at {lead_path}:{lead_line} is about is made here, "
                f"called through {call_path}:{call_line}.",
            )
        )
    return out


def _shared_caller(
    finding: Finding,
    inst: Instruction,
    shared: tuple[SourceLoc, SourceLoc],
    captured: CapturedModel,
    tie: int,
    events: list[Event],
    reference_lines: frozenset[tuple[str, int]],
) -> list[Finding]:
    """The error moves from a line both programs run to where the distributed program makes the
    value it hands that line (equivci.diagnose.handed), else to where it calls it; the op's own
    line (and the call) stay as tied notes."""
    call_path, call_line = source_of(dataclasses.replace(inst, stack=(shared[1],)), captured.repo_root)
    origin = handed_origin(inst, events, captured.repo_root, reference_lines)
    if origin is not None:
        path, line = source_of(origin, captured.repo_root)
        if path is not None and (path, line) not in {(finding.path, finding.line), (call_path, call_line)}:
            moved, note = _moved(
                finding,
                (path, line, tie),
                f"the `{inst.opcode}` at {finding.path}:{finding.line} is in code both programs run, which "
                "computes what the reference's does from the same values, so the difference comes in with what "
                f"it is handed: this `{origin.opcode}`, in the distributed program's own code, makes it (the "
                f"call into the shared code is at {call_path}:{call_line}). There: {finding.message}",
                f"the `{inst.opcode}` that the finding at {path}:{line} is about is made here, in code the "
                "reference runs too.",
            )
            called = dataclasses.replace(
                note,
                path=call_path,
                line=call_line,
                message=f"the distributed program calls the shared code of the finding at {path}:{line} here.",
            )
            return [moved, note] + ([called] if call_path is not None else [])
    if call_path is None or (call_path, call_line) == (finding.path, finding.line):
        return [finding]
    return list(
        _moved(
            finding,
            (call_path, call_line, tie),
            f"the `{inst.opcode}` at {finding.path}:{finding.line} is in code both programs run; the distributed "
            "program reaches it through this call, which the reference does not make, so what this call passes "
            f"in is the first suspect. There: {finding.message}",
            f"the `{inst.opcode}` that the finding at {call_path}:{call_line} is about is made here, in code the "
            "reference runs too.",
        )
    )


def _caller_choices(
    findings: list[tuple[Finding, Instruction | None]],
    captured: CapturedModel,
    events: list[Event],
    entry: tuple[str, str] | None,
    foreign: tuple[tuple[str, str], ...] = (),
    reference_runs: frozenset[str] = frozenset(),
    taking: Instruction | None = None,
    reference_lines: frozenset[tuple[str, int]] = frozenset(),
) -> list[tuple[Finding, Instruction | None]]:
    """The lead error moves to the call that passes the static value its op depends on, where another
    call of the same helper passes another (equivci.diagnose.arguments); the op's line stays as a
    tied note. `reference_runs`: the names of the functions the reference runs. `taking`: the op that
    takes the lead's partial sum as the full value, or its value as the one the reference computes
    further (a residual add, a norm), seen from the distributed program's own code: the all-reduce
    or the work is missing between the two, so a choice made where that op receives it counts too."""
    if not findings:
        return findings
    (lead, inst), rest = findings[0], findings[1:]
    if inst is None or lead.severity != "error":
        return findings
    choice = passed_choice(inst, events, captured.repo_root, entry, foreign, reference_runs)
    if choice is None and taking is not None:
        found = passed_choice(taking, events, captured.repo_root, entry, foreign, reference_runs)
        # Only a callable the caller passes can stand where the all-reduce or the work belongs
        # (`reduce(g)` given `lambda g: g`, `residual(x, y)` given `lambda x, y: y`); a flag picks a
        # branch, whose own line is written in the helper.
        if found is not None and _callable(found.text):
            choice = dataclasses.replace(found, use=found.use or taking)
    if (
        choice is None
        and shared_call(inst, captured.repo_root, reference_lines) is not None
        and handed_origin(inst, events, captured.repo_root, reference_lines) is None
    ):
        # An op of code both programs run, handed nothing the distributed program's own code makes
        # otherwise: what the call into that code passes in is the suspect, and a choice its
        # statement reads (a schedule's tick count, a callback) counts as the op's.
        choice = passed_choice(
            _receiving(inst, captured, reference_lines), events, captured.repo_root, entry, foreign, reference_runs
        )
    if choice is None:
        choice = written_callback(inst, events, captured.repo_root, foreign, reference_runs)
    if choice is None:
        return findings
    path, line = source_of(
        dataclasses.replace(inst, stack=(SourceLoc(choice.file, choice.line, ""),)), captured.repo_root
    )
    if path is None or (path, line) == (lead.path, lead.line):
        return findings
    others = "; ".join(f"{_shown(file, captured)}:{n} passes `{text}`" for file, n, text in choice.others[:2])
    depends = f"the `{inst.opcode}` at {lead.path}:{lead.line} depends on it"
    if choice.use is not None:
        upath, uline = source_of(choice.use, captured.repo_root)
        depends = (
            f"the `{choice.use.opcode}` at {upath}:{uline}, which uses what the `{inst.opcode}` at "
            f"{lead.path}:{lead.line} computes, depends on it"
        )
    # A lead tied with other places keeps its tie: the call joins them, first.
    tie = lead.tie if lead.tie is not None else _new_tie(findings)
    unchanged = choice.text.isidentifier() and returns_its_argument(choice.file, choice.text)
    if choice.branch is not None and not (_callable(choice.text) and not unchanged):
        # A function passed by name is written in its own body, whatever branch it also picks.
        return _branch_taken(choice, inst, lead, (path, line, tie), depends, others, captured) + rest
    if choice.text.isidentifier() and not unchanged:
        body = _passed_function(choice, inst, lead, (path, line, tie), depends, others, events, captured)
        if body:
            return body + rest
    moved, note = _moved(
        lead,
        (path, line, tie),
        f"`{choice.text}` is passed here as `{choice.parameter}` of `{choice.function}` (elsewhere {others})"
        f"{', a function that returns its argument unchanged,' if unchanged else ','} and {depends}. "
        f"There: {lead.message}",
        f"the `{inst.opcode}` that the finding at {path}:{line} is about is made here, from what that call passes.",
    )
    return [(moved, None), (note, None)] + rest


def _branch_taken(
    choice: Choice,
    inst: Instruction,
    lead: Finding,
    call: tuple[str, int | None, int],
    depends: str,
    others: str,
    captured: CapturedModel,
) -> list[tuple[Finding, Instruction | None]]:
    """A value passed for a flag picks the `if` branch the op's chain runs through: that branch's
    statement is the code written for this call, where the reviewer changes it; the call that
    passes the flag stays as a tied note."""
    path, line, tie = call
    assert choice.branch is not None
    bpath, bline = source_of(dataclasses.replace(inst, stack=(SourceLoc(*choice.branch, ""),)), captured.repo_root)
    if bpath is None:
        return [(lead, inst)]
    moved, note = _moved(
        lead,
        (bpath, bline, tie),
        f"this statement runs because `{choice.text}`, passed at {path}:{line} as `{choice.parameter}` of "
        f"`{choice.function}` (elsewhere {others}), picks its branch, and {depends}. There: {lead.message}",
        f"the `{inst.opcode}` that the finding at {bpath}:{bline} is about is made here.",
    )
    passed = dataclasses.replace(
        note,
        path=path,
        line=line,
        message=f"`{choice.text}`, which picks the branch of the finding at {bpath}:{bline}, is passed here.",
    )
    # The op written on the branch's statement itself needs no note of its own: one place, one finding.
    own = [] if (note.path, note.line) == (moved.path, moved.line) else [(note, None)]
    return [(moved, None), *own, (passed, None)]


def _new_tie(found: list[tuple[Finding, Instruction | None]]) -> int:
    """A tie group number no finding of `found` uses yet."""
    return max((f.tie for f, _ in found if f.tie is not None), default=-1) + 1


def _callable(text: str) -> bool:
    """`text` is a lambda, a partial, or names a function (not a constant such as `True` or `AXES`)."""
    try:
        body = ast.parse(text, mode="eval").body
    except SyntaxError:
        return False
    if isinstance(body, ast.Call):
        return callee(body) == "partial"
    return isinstance(body, ast.Lambda) or (
        isinstance(body, ast.Name) and not body.id.isupper() and not keyword.iskeyword(body.id)
    )


def _axes_written(
    found: list[tuple[Finding, Instruction | None]],
    defect: Defect,
    captured: CapturedModel,
    events: list[Event],
    entry: tuple[str, str] | None,
) -> list[tuple[Finding, Instruction | None]]:
    """An all-reduce whose mesh axes are the defect sums over the axes its caller set: where its own
    statement does not write them (a `reduce` bound by functools.partial elsewhere, an axis passed
    in), the lead moves to the statement that does (equivci.diagnose.arguments.literal_written),
    which is the line to change; the op's line stays as a tied note."""
    (lead, inst), rest = found[0], found[1:]
    if inst is not defect.inst or not defect.axes or lead.severity != "error":
        return found
    written = literal_written(inst, events, captured.repo_root, defect.axes, entry)
    if written is None:
        return found
    path, line = source_of(
        dataclasses.replace(inst, stack=(SourceLoc(written[0], written[1], ""),)), captured.repo_root
    )
    if path is None or (path, line) == (lead.path, lead.line):
        return found
    tie = lead.tie if lead.tie is not None else _new_tie(found)
    axes = ", ".join(f"'{a}'" for a in sorted(defect.axes))
    moved, note = _moved(
        lead,
        (path, line, tie),
        f"the mesh axes ({axes}) that the `{inst.opcode}` at {lead.path}:{lead.line} sums over are written here. "
        f"There: {lead.message}",
        f"the `{inst.opcode}` that the finding at {path}:{line} is about is made here, over the axes written there.",
    )
    return [(moved, None), (note, None)] + rest


def _passed_function(
    choice: Choice,
    inst: Instruction,
    lead: Finding,
    call: tuple[str, int | None, int],
    depends: str,
    others: str,
    events: list[Event],
    captured: CapturedModel,
) -> list[tuple[Finding, Instruction | None]]:
    """A function passed by name is written in its own body, where the reviewer changes it, not at
    the call that names it (a lambda is written at the call itself): the lead goes to the statement
    where it departs from the function another call passes (equivci.diagnose.siblings), else to where
    it computes what the op depends on. The call, the helper's op the op reads and the op's own line
    are tied notes. Empty when neither is found."""
    path, line, tie = call
    helper = made_in(choice.text, inst, events, captured.repo_root)
    made = source_of(dataclasses.replace(inst, stack=(helper,)), captured.repo_root) if helper is not None else None
    departs = departure(choice.file, choice.text, choice.others)
    if departs is not None:
        hpath, hline = source_of(
            dataclasses.replace(inst, stack=(SourceLoc(departs.file, departs.line, ""),)), captured.repo_root
        )
        spath, _ = source_of(
            dataclasses.replace(inst, stack=(SourceLoc(departs.sibling_file, departs.sibling_line, ""),)),
            captured.repo_root,
        )
        how = (
            f"departs here from `{departs.sibling}` ({spath}:{departs.sibling_line}), which the other call passes; "
            "what it computes reaches the op"
        )
    elif made is not None and made[0] is not None:
        (hpath, hline), how = made, "computes this"
    elif (only := one_statement(choice.file, choice.text)) is not None:
        # Nothing the op reads is made in it (an offset the op's statement adds after the op, or
        # one folded to a constant), but a one-line function is written on that line.
        hpath, hline = source_of(
            dataclasses.replace(inst, stack=(SourceLoc(choice.file, only, ""),)), captured.repo_root
        )
        how = "is written on this one line"
    else:
        return []
    if hpath is None:
        return []
    moved, note = _moved(
        lead,
        (hpath, hline, tie),
        f"`{choice.text}`, passed at {path}:{line} as `{choice.parameter}` of `{choice.function}` "
        f"(elsewhere {others}), {how}, and {depends}. There: {lead.message}",
        f"the `{inst.opcode}` that the finding at {hpath}:{hline} is about is made here, from what "
        f"`{choice.text}` computes.",
    )
    named = dataclasses.replace(
        note,
        path=path,
        line=line,
        message=f"`{choice.text}`, which the finding at {hpath}:{hline} is in, is passed here.",
    )
    notes: list[tuple[Finding, Instruction | None]] = [(named, None)]
    if departs is not None and made is not None and made[0] is not None and made != (hpath, hline):
        read = f"the value of `{choice.text}` that the `{inst.opcode}` at {lead.path}:{lead.line} reads is made here."
        notes.append((dataclasses.replace(note, path=made[0], line=made[1], message=read), None))
    if (hpath, hline) != (lead.path, lead.line) and all((f.path, f.line) != (lead.path, lead.line) for f, _ in notes):
        notes.append((note, None))
    return [(moved, None)] + notes


def _moved(lead: Finding, to: tuple[str, int | None, int], message: str, note: str) -> tuple[Finding, Finding]:
    """The lead error at its new place (path, line, tie), and a note at its old place, tied to it."""
    path, line, tie = to
    return (
        dataclasses.replace(lead, path=path, line=line, tie=tie, message=message),
        dataclasses.replace(lead, severity="note", tie=tie, message=note),
    )


def _shown(file: str, captured: CapturedModel) -> str:
    try:
        return Path(file).resolve().relative_to(Path(captured.repo_root).resolve()).as_posix()
    except ValueError:
        return Path(file).name


def _located_first(findings: list[Finding]) -> list[Finding]:
    """A finding without a place never leads while one with a place exists."""
    if findings and findings[0].path is None:
        k = next((k for k, f in enumerate(findings) if f.path is not None and f.severity != "note"), None)
        if k is not None:
            lead = findings[k]
            findings = [dataclasses.replace(lead, severity=findings[0].severity)] + [
                f for j, f in enumerate(findings) if j != k
            ]
    return findings


def _unrelated(
    defect: Defect, captured: CapturedModel, events: list[Event], reference_events: list[Event], outputs_equal: bool
) -> str:
    """What the proof could not relate, for a model no check showed wrong: the op, its shape and the
    reference op it should correspond to (the one of the same kind at the same line, if any)."""
    inst = defect.frontier or defect.inst
    operand = next((e.inst for e in events if inst.operands and e.inst.name == inst.operands[0]), None)
    if (rounded := narrowing(inst, operand)) is not None and outputs_equal:
        said = defect.message if defect.inst is inst else rounding_message(*rounded)
        return (
            f"{said}. The outputs agree within what rounding explains: if the lower precision is intended, round "
            f"the reference the same way; otherwise keep {rounded[1]} here."
        )
    message = (
        f"equivci cannot relate this `{inst.opcode}` ({inst.shape} on each device) to the reference: the proof "
        "could not show that it is a window, a partial sum or a copy of any reference value"
    )
    here = innermost(inst)
    same_line = [e.inst for e in reference_events if here is not None and innermost(e.inst) == here]
    counterpart = next((i for i in same_line if i.opcode == inst.opcode), same_line[0] if same_line else None)
    if counterpart is not None:
        path, line = source_of(counterpart, captured.repo_root)
        where = f"{path}:{line}" if path else "the same line"
        message += f"; it should correspond to the reference's `{counterpart.opcode}` ({counterpart.shape}) at {where}"
    elif (nearest := _nearest_shard_of(inst, events, reference_events)) is not None:
        path, line = source_of(nearest, captured.repo_root)
        where = f" at {path}:{line}" if path else ""
        message += (
            f"; the reference runs no op at this line, and its `{inst.opcode}` nearest in program order whose "
            f"shape this one's divides is {nearest.shape}{where}"
        )
    else:
        message += "; the reference runs no op at this line"
    if outputs_equal:
        return message + ". No check shows the programs differ (likely a rule equivci lacks, not a defect)."
    if part_mean(defect.constants):
        # 1/n where the reference has 1/(k n): a mean over a part of the rows (a shard's, a
        # microbatch's), which a later sum over the parts brings back. No guess at all then.
        return message + ". No check shows a difference rounding cannot explain."
    guess = defect.message if defect.message.endswith((".", "!")) else defect.message + "."
    return message + f". No check shows a difference rounding cannot explain; an unchecked guess at a cause: {guess}"


def _nearest_shard_of(inst: Instruction, events: list[Event], reference_events: list[Event]) -> Instruction | None:
    """The reference op of the same kind, nearest in relative program order, whose shape `inst`'s
    could be a block of (every dim divides)."""
    position = next((k for k, e in enumerate(events) if e.inst is inst), None)
    dims = inst.shape.dims
    shards = [
        (k, e.inst)
        for k, e in enumerate(reference_events)
        if e.inst.opcode == inst.opcode
        and len(e.inst.shape.dims) == len(dims)
        and all(m and n % m == 0 for m, n in zip(dims, e.inst.shape.dims))
    ]
    if position is None or not shards:
        return None
    at = position / max(1, len(events))
    return min(shards, key=lambda pair: abs(pair[0] / max(1, len(reference_events)) - at))[1]


def _before(numeric: Instruction, defect: Defect, events: list[Event]) -> bool:
    """The numeric frontier comes before the op the proof stopped at (or that op is not in `events`)."""
    position = {id(e.inst): k for k, e in enumerate(events)}
    stop = position.get(id(defect.frontier or defect.inst))
    return stop is None or position.get(id(numeric), stop) < stop


def _agrees(defect: Defect, numeric: Instruction) -> bool:
    """The numeric frontier is the op the defect was found at, or on one of its lines."""
    insts = [i for i in (defect.inst, defect.frontier) if i is not None]
    return any(numeric is i for i in insts) or innermost(numeric) in {innermost(i) for i in insts}


def with_counterexample(findings: list[Finding], counterexample: str) -> list[Finding]:
    """The counterexample as a finding at the first finding's place."""
    return _at_first(findings, "error", counterexample)


def with_note(findings: list[Finding], note: str) -> list[Finding]:
    """What the numeric check said short of a counterexample, as a note at the first finding's place."""
    return _at_first(findings, "note", note)


def _at_first(findings: list[Finding], severity: str, message: str) -> list[Finding]:
    return findings + [dataclasses.replace(findings[0], severity=severity, message=message, tie=None)]
