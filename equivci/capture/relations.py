"""The relation file of an HLO model (`kind: hlo`): how the distributed program's parameters and
outputs relate to the reference's, where the device index comes from, and what the custom calls
the tool cannot know compute. Schema and validation only; the format is in docs/byo-hlo.md.

Every problem raises EquivciError with one paragraph: `FILE:LINE: KEY: what is wrong; how to fix it`.
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any, NoReturn

import yaml

from equivci.errors import EquivciError
from equivci.manifest import DuplicateKey, LineLoader

VERSION = 1
TOP_KEYS = ("version", "device_index", "parameters", "outputs", "custom_calls")
PART_KEYS = ("reference", "split", "window")
CONCAT_KEYS = ("concat", "parts")
DEVICE_INDEX = ("partition-id", "replica-id")
REDUCERS = ("add", "maximum", "minimum", "multiply")
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter")
CALL_KEYS = COLLECTIVES + ("reduce", "groups")

Key = str | int  # a parameter or output by name or by number


@dataclasses.dataclass(frozen=True)
class Part:
    """A window of one reference parameter, then this device's block of it."""

    reference: Key
    where: str  # `parameters.wqkv.parts[1]`, for messages
    line: int
    window: tuple[tuple[int, int, int], ...] = ()  # (dim, start, stop): taken before splitting
    split: tuple[tuple[int, tuple[str, ...]], ...] = ()  # dim -> mesh axes, major first


@dataclasses.dataclass(frozen=True)
class Relation:
    """One distributed parameter or output: the concatenation of its parts along `concat`
    (a single part when `concat` is None)."""

    key: Key
    where: str
    line: int
    parts: tuple[Part, ...]
    concat: int | None = None


@dataclasses.dataclass(frozen=True)
class CustomCall:
    """A declared custom-call target: `identity`, `opaque` (an unknown function, equal only to
    itself on equal operands) or a collective over groups of devices."""

    target: str
    where: str
    line: int
    kind: str  # identity | opaque | all-reduce | all-gather | reduce-scatter
    reduce: str = "add"
    dim: int = 0  # all-gather / reduce-scatter dimension
    groups: tuple[str, ...] | None = None  # mesh axes each group spans; None: all devices


@dataclasses.dataclass(frozen=True)
class Relations:
    path: Path
    device_index: str  # partition-id | replica-id | parameter
    index_parameter: Key | None  # the distributed parameter holding the device index
    parameters: tuple[Relation, ...]
    outputs: tuple[Relation, ...] | None  # None: output k is reference output k, replicated
    custom_calls: dict[str, CustomCall]
    text: str  # the file as read, for the memo key


@dataclasses.dataclass(frozen=True)
class _Ctx:
    display: str
    mesh: tuple[str, ...]

    def fail(self, where: str, line: int | None, what: str, fix: str) -> NoReturn:
        at = f"{self.display}:{line}" if line else self.display
        end = "" if fix.endswith(("?", ".")) else "."
        raise EquivciError(f"{at}: {where}: {what}; {fix}{end}")


def _line(node: Any, key: Any, default: int = 0) -> int:
    return getattr(node, "key_lines", {}).get(key, default)


def _keys(ctx: _Ctx, node: Any, where: str, line: int, allowed: tuple[str, ...]) -> dict:
    if not isinstance(node, dict):
        ctx.fail(where, line, f"expected a mapping, got {type(node).__name__}", "see docs/byo-hlo.md for the format")
    for key in node:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
            fix = f"did you mean '{close[0]}'?" if close else "the allowed keys are " + ", ".join(allowed)
            ctx.fail(f"{where}.{key}", _line(node, key, line), "unknown key", fix)
    return node


def _key(ctx: _Ctx, value: Any, where: str, line: int) -> Key:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        ctx.fail(where, line, f"expected a parameter name or number, got {value!r}", "write e.g. `wq` or `3`")
    return value


def _dim(ctx: _Ctx, value: Any, where: str, line: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        ctx.fail(where, line, f"expected a dimension number (0, 1, ...), got {value!r}", "write e.g. `1`")
    return value


def _axes(ctx: _Ctx, value: Any, where: str, line: int) -> tuple[str, ...]:
    axes = [value] if isinstance(value, str) else value
    if not isinstance(axes, list) or not axes or not all(isinstance(a, str) for a in axes):
        ctx.fail(where, line, f"expected a mesh axis or a list of them, got {value!r}", "write e.g. `tp` or `[dp, tp]`")
    for axis in axes:
        if axis not in ctx.mesh:
            ctx.fail(
                where,
                line,
                f"'{axis}' is not an axis of the model's mesh ({', '.join(ctx.mesh)})",
                "use the axis names of the manifest's `mesh:`",
            )
    if len(set(axes)) != len(axes):
        ctx.fail(where, line, f"axis listed twice in {axes}", "list each mesh axis once")
    return tuple(axes)


def _part(ctx: _Ctx, node: Any, where: str, line: int) -> Part:
    node = _keys(ctx, node, where, line, PART_KEYS)
    if "reference" not in node:
        ctx.fail(where, line, "missing `reference:`", "name the reference parameter (or output) this is a part of")
    reference = _key(ctx, node["reference"], f"{where}.reference", _line(node, "reference", line))
    split, window = [], []
    for dim, axes, at in _by_dim(ctx, node, "split", where, line, "mesh axes", "`split: {1: tp}`"):
        split.append((dim, _axes(ctx, axes, f"{where}.split.{dim}", at)))
    used = [a for _, axes in split for a in axes]
    if len(set(used)) != len(used):
        ctx.fail(
            f"{where}.split",
            _line(node, "split", line),
            "a mesh axis splits two dimensions",
            "each mesh axis can split one dimension",
        )
    for dim, bounds, at in _by_dim(ctx, node, "window", where, line, "[start, stop]", "`window: {1: [512, 1024]}`"):
        if not (
            isinstance(bounds, list)
            and len(bounds) == 2
            and all(type(b) is int and b >= 0 for b in bounds)
            and bounds[0] < bounds[1]
        ):
            ctx.fail(
                f"{where}.window.{dim}",
                at,
                f"expected [start, stop] with 0 <= start < stop, got {bounds!r}",
                "write e.g. `[512, 1024]`",
            )
        window.append((dim, bounds[0], bounds[1]))
    return Part(reference, where, line, tuple(sorted(window)), tuple(sorted(split)))


def _by_dim(
    ctx: _Ctx, node: dict, key: str, where: str, line: int, what: str, example: str
) -> list[tuple[int, Any, int]]:
    """(dimension, value, line) of a mapping from dimension numbers (`split:`, `window:`)."""
    raw = node.get(key) or {}
    if not isinstance(raw, dict):
        ctx.fail(
            f"{where}.{key}",
            _line(node, key, line),
            f"expected a mapping from dimension to {what}",
            f"write e.g. {example}",
        )
    return [
        (_dim(ctx, dim, f"{where}.{key}", _line(raw, dim, line)), value, _line(raw, dim, line))
        for dim, value in raw.items()
    ]


def _relation(ctx: _Ctx, key: Any, node: Any, where: str, line: int) -> Relation:
    key = _key(ctx, key, where, line)
    if isinstance(node, dict) and "concat" in node:
        node = _keys(ctx, node, where, line, CONCAT_KEYS)
        dim = _dim(ctx, node["concat"], f"{where}.concat", _line(node, "concat", line))
        parts = node.get("parts")
        if not isinstance(parts, list) or len(parts) < 2:
            ctx.fail(
                f"{where}.parts",
                _line(node, "parts", line),
                "a concatenation needs a list of two or more parts",
                "write e.g. `parts: [{reference: wq, split: {1: tp}}, {reference: wk, split: {1: tp}}]`",
            )
        lines = getattr(parts, "item_lines", [line] * len(parts))
        return Relation(
            key, where, line, tuple(_part(ctx, p, f"{where}.parts[{i}]", lines[i]) for i, p in enumerate(parts)), dim
        )
    return Relation(key, where, line, (_part(ctx, node, where, line),))


def _relations(ctx: _Ctx, doc: dict, name: str) -> tuple[Relation, ...]:
    node = doc[name]
    line = _line(doc, name)
    if not isinstance(node, dict) or not node:
        ctx.fail(
            name,
            line,
            "expected a mapping from distributed parameter (name or number) to its relation",
            f"write e.g. `{name}: {{0: {{reference: 0, split: {{1: tp}}}}}}`",
        )
    return tuple(_relation(ctx, k, v, f"{name}.{k}", _line(node, k, line)) for k, v in node.items())


def _custom_call(ctx: _Ctx, target: Any, node: Any, line: int) -> CustomCall:
    where = f"custom_calls.{target}"
    if node in ("identity", "opaque"):
        return CustomCall(str(target), where, line, node)
    if not isinstance(node, dict):
        ctx.fail(
            where,
            line,
            f"expected identity, opaque or a collective, got {node!r}",
            "write e.g. `identity` or `{all-reduce: add, groups: [tp]}`",
        )
    node = _keys(ctx, node, where, line, CALL_KEYS)
    kinds = [k for k in COLLECTIVES if k in node]
    if len(kinds) != 1:
        ctx.fail(
            where,
            line,
            "name exactly one collective",
            "write one of `all-reduce: add`, `all-gather: DIM`, `reduce-scatter: DIM` (with `reduce: add`)",
        )
    kind = kinds[0]
    reduce, dim = "add", 0
    if kind == "all-reduce":
        reduce = node[kind]
    else:
        dim = _dim(ctx, node[kind], f"{where}.{kind}", _line(node, kind, line))
        reduce = node.get("reduce", "add")
    if reduce not in REDUCERS:
        ctx.fail(where, line, f"unknown reduction {reduce!r}", "use one of " + ", ".join(REDUCERS))
    groups = _axes(ctx, node["groups"], f"{where}.groups", _line(node, "groups", line)) if "groups" in node else None
    return CustomCall(str(target), where, line, kind, reduce, dim, groups)


def load_relations(path: Path, mesh: tuple[str, ...], display: str | None = None) -> Relations:
    """Read and check a relation file against the mesh axes (its parameter and output names are
    checked against the HLO programs when they are read)."""
    ctx = _Ctx(display or str(path), mesh)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EquivciError(
            f"{ctx.display}: cannot read the relation file ({exc}); check the manifest's `relations:` path."
        ) from None
    try:
        doc = yaml.load(text, Loader=LineLoader)
    except DuplicateKey as dup:
        ctx.fail(str(dup.key), dup.line, "key written twice (YAML would keep only the last)", "remove one of them")
    except yaml.YAMLError as exc:
        raise EquivciError(f"{ctx.display}: not valid YAML: {' '.join(str(exc).split())}; fix the syntax.") from None
    doc = _keys(ctx, doc, "<top level>", 1, TOP_KEYS)
    if doc.get("version") != VERSION or type(doc.get("version")) is not int:
        ctx.fail(
            "version",
            _line(doc, "version", 1),
            f"expected `version: {VERSION}`, got {doc.get('version')!r}",
            f"start the file with `version: {VERSION}`",
        )
    if "parameters" not in doc:
        ctx.fail("parameters", 1, "missing", "say how each distributed parameter relates to the reference's")
    source = doc.get("device_index", "partition-id")
    index_parameter = None
    if isinstance(source, dict) and set(source) == {"parameter"}:
        index_parameter = _key(ctx, source["parameter"], "device_index.parameter", _line(doc, "device_index"))
        source = "parameter"
    elif source not in DEVICE_INDEX:
        ctx.fail(
            "device_index",
            _line(doc, "device_index"),
            f"unknown device index source {source!r}",
            "write `partition-id`, `replica-id` or `{parameter: NAME}`",
        )
    calls = doc.get("custom_calls") or {}
    if not isinstance(calls, dict):
        ctx.fail(
            "custom_calls",
            _line(doc, "custom_calls"),
            "expected a mapping from target to declaration",
            "write e.g. `custom_calls: {AwsNeuronAllReduce: {all-reduce: add, groups: [tp]}}`",
        )
    return Relations(
        path=path,
        device_index=source,
        index_parameter=index_parameter,
        parameters=_relations(ctx, doc, "parameters"),
        outputs=_relations(ctx, doc, "outputs") if "outputs" in doc else None,
        custom_calls={str(t): _custom_call(ctx, t, v, _line(calls, t)) for t, v in calls.items()},
        text=text,
    )
