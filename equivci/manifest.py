"""Manifest v1 (equivci.yaml): schema and validation. Static checks only; nothing is imported here.

Every problem raises EquivciError with one paragraph: `FILE:LINE: KEY: what is wrong; how to fix it`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Hashable
from pathlib import Path
from typing import Any, NoReturn, cast

import yaml

from equivci.errors import EquivciError

SUPPORTED_VERSION = 1
MAX_DEVICES = 64  # fake CPU devices per capture child; more makes capture impractically slow

TOP_KEYS = ("version", "models")
REQUIRED_MODEL_KEYS = ("name", "reference", "distributed", "inputs", "mesh")
MODEL_KEYS = REQUIRED_MODEL_KEYS + ("kind", "tags", "capture_timeout", "oracle", "assume_valid_indices", "int_range")
# `kind: hlo`: programs given as HLO files (another compiler's dumps) and a relation file.
HLO_REQUIRED_KEYS = ("name", "kind", "reference", "distributed", "relations", "mesh")
HLO_MODEL_KEYS = HLO_REQUIRED_KEYS + ("tags",)
KINDS = ("jax", "hlo")
ORACLE_KEYS = ("rtol", "atol", "inputs")
DEFAULT_CAPTURE_TIMEOUT = 900.0  # seconds for importing, tracing and partitioning one model

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclasses.dataclass(frozen=True)
class Entrypoint:
    spec: str  # as written in the manifest, e.g. "models/llama.py:forward"
    function: str
    file: Path | None = None  # absolute path, for the FILE.py:FUNC form
    module: str | None = None  # dotted module, for the package.module:FUNC form

    @property
    def source(self) -> str:
        """Where the function lives, for messages: the file or the module as written."""
        return self.spec.rpartition(":")[0]


@dataclasses.dataclass(frozen=True)
class OracleSpec:
    """The numeric oracle's settings for one model (the manifest's `oracle:` key).

    rtol / atol: a tolerance set by hand, replacing the one derived from the reference's own
    roundings (atol relative to the output's magnitude, as for the built-in tolerances).
    inputs: a zero-argument function returning smaller inputs for the oracle alone, for models
    too large to run on random inputs (the entrypoints must accept them)."""

    rtol: float | None = None
    atol: float | None = None
    inputs: Entrypoint | None = None

    @property
    def tolerance_set(self) -> bool:
        return self.rtol is not None or self.atol is not None


@dataclasses.dataclass(frozen=True)
class HloSources:
    """A model given as HLO files (`kind: hlo`): each program as HLO text or a serialized
    HloModuleProto, and the relation file saying how the distributed program's parameters and
    outputs relate to the reference's (docs/byo-hlo.md). Absolute paths."""

    reference: Path
    distributed: Path
    relations: Path

    def files(self) -> tuple[Path, ...]:
        return (self.reference, self.distributed, self.relations)


def mesh_size(mesh: tuple[tuple[str, int], ...]) -> int:
    return math.prod(size for _, size in mesh)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    reference: Entrypoint | None  # None for an HLO model (`hlo` holds its files)
    distributed: Entrypoint | None
    inputs: Entrypoint | None
    mesh: tuple[tuple[str, int], ...]
    tags: tuple[str, ...] = ()
    capture_timeout: float = DEFAULT_CAPTURE_TIMEOUT  # seconds; `capture_timeout:` or --capture-timeout
    oracle: OracleSpec = OracleSpec()
    hlo: HloSources | None = None
    # False: a proof that holds only for integer inputs in the range the reference indexes with
    # is `unproven`, not "verified, assuming the inputs its note names".
    assume_valid_indices: bool = True
    # [lo, hi): the values every integer input takes (positions, lengths, ids), stated by the user;
    # proofs may rest on it (with a note) and the numeric check draws integers there.
    int_range: tuple[int, int] | None = None

    @property
    def num_devices(self) -> int:
        return mesh_size(self.mesh)

    def entrypoints(self) -> tuple[Entrypoint, Entrypoint, Entrypoint]:
        """reference, distributed and inputs of a JAX model."""
        if self.reference is None or self.distributed is None or self.inputs is None:
            raise EquivciError(
                f"model '{self.name}' is given as HLO files: it has no Python entrypoints to import or run."
            )
        return self.reference, self.distributed, self.inputs


@dataclasses.dataclass(frozen=True)
class Manifest:
    path: Path  # absolute path of the manifest file
    root: Path  # the manifest's folder; entrypoint paths are relative to it
    models: tuple[ModelSpec, ...]

    def names(self) -> list[str]:
        return [m.name for m in self.models]


# --- YAML loading with line numbers -------------------------------------------------------------


class _Map(dict):
    """A YAML mapping that remembers where it and each of its keys were written (1-based lines)."""

    line: int = 0
    key_lines: dict[Any, int]


class _Seq(list):
    line: int = 0
    item_lines: list[int]


class LineLoader(yaml.SafeLoader):
    """SafeLoader that keeps line numbers and rejects duplicate keys (YAML silently keeps the last)."""


class DuplicateKey(Exception):
    def __init__(self, key: Any, line: int):
        self.key, self.line = key, line


def _construct_map(loader: LineLoader, node: yaml.MappingNode) -> _Map:
    loader.flatten_mapping(node)
    result = _Map()
    result.line = node.start_mark.line + 1
    result.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if not isinstance(key, Hashable) or isinstance(key, (list, dict)):
            raise yaml.constructor.ConstructorError(
                "while reading a mapping", node.start_mark, f"found {_describe(key)} as a key", key_node.start_mark
            )
        if key in result.key_lines:
            raise DuplicateKey(key, line)
        result.key_lines[key] = line
        result[key] = loader.construct_object(value_node, deep=True)
    return result


def _construct_seq(loader: LineLoader, node: yaml.SequenceNode) -> _Seq:
    result = _Seq(loader.construct_object(child, deep=True) for child in node.value)
    result.line = node.start_mark.line + 1
    result.item_lines = [child.start_mark.line + 1 for child in node.value]
    return result


LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_map)
LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_seq)


# --- validation -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Ctx:
    display: str  # the manifest path as the user wrote it
    root: Path

    def fail(self, key: str, line: int | None, what: str, fix: str) -> NoReturn:
        where = f"{self.display}:{line}" if line else self.display
        end = "" if fix.endswith(("?", ".")) else "."
        raise EquivciError(f"{where}: {key}: {what}; {fix}{end}")


def _describe(value: Any) -> str:
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", type(None): "empty"}
    for t, name in kind.items():
        if type(value) is t:
            return f"{name} ({value!r})" if value is not None else "empty"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def _suggest(word: Any, choices: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(str(word), choices, n=1, cutoff=0.6)
    if close:
        return f"did you mean '{close[0]}'?"
    return "remove it; the allowed keys are " + ", ".join(choices)


def _check_keys(ctx: _Ctx, node: _Map, prefix: str, allowed: tuple[str, ...], required: tuple[str, ...]) -> None:
    for key in node:
        if key not in allowed:
            where = f"{prefix}.{key}" if prefix else str(key)
            ctx.fail(where, node.key_lines.get(key), "unknown key", _suggest(key, allowed))
    for key in required:
        if key not in node:
            where = f"{prefix}.{key}" if prefix else key
            ctx.fail(where, node.line, "missing required key", f"add `{key}:` ({_HELP[key]})")


_HELP = {
    "version": "the manifest format version, `version: 1`",
    "models": "a list of models to verify",
    "name": "a unique name made of letters, digits, '_', '.' and '-'",
    "reference": "the single-device function, e.g. `models/llama.py:forward`",
    "distributed": "the sharded function, e.g. `models/llama_tp.py:forward`",
    "inputs": "a zero-argument function returning a tuple of jax.ShapeDtypeStruct, e.g. `models/llama.py:inputs`",
    "mesh": "mesh axis names and sizes, e.g. `{tp: 4}`",
    "kind": "`kind: hlo` for a model given as HLO files",
    "relations": "the relation file of an HLO model, e.g. `hlo/relations.yaml` (see docs/byo-hlo.md)",
}


def _oracle(ctx: _Ctx, model: _Map, prefix: str) -> OracleSpec:
    node = model.get("oracle")
    if node is None:
        return OracleSpec()
    where, line = f"{prefix}.oracle", model.key_lines.get("oracle")
    if not isinstance(node, dict):
        ctx.fail(
            where,
            line,
            f"expected a mapping, got {_describe(node)}",
            "write e.g. `oracle: {rtol: 1e-2, atol: 1e-3}` or `oracle: {inputs: models/llama.py:small_inputs}`",
        )
    node = cast(_Map, node)  # every mapping the loader builds is a _Map
    _check_keys(ctx, node, where, ORACLE_KEYS, ())
    bounds: dict[str, float] = {}
    for key in ("rtol", "atol"):
        value = node.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or math.isinf(value):
            ctx.fail(
                f"{where}.{key}",
                node.key_lines.get(key),
                f"expected a non-negative number, got {_describe(value)}",
                f"write e.g. `{key}: 1e-3`",
            )
        bounds[key] = float(value)
    inputs = _entrypoint(ctx, node, "inputs", where) if "inputs" in node else None
    return OracleSpec(rtol=bounds.get("rtol"), atol=bounds.get("atol"), inputs=inputs)


def _entrypoint(ctx: _Ctx, model: _Map, key: str, prefix: str) -> Entrypoint:
    where, line = f"{prefix}.{key}", model.key_lines.get(key)
    spec = model[key]
    example = "`models/llama.py:forward` (a file relative to the manifest folder) or `mypkg.models:forward`"
    if not isinstance(spec, str):
        ctx.fail(where, line, f"expected an entrypoint string, got {_describe(spec)}", f"write it as {example}")
    target, sep, function = spec.strip().rpartition(":")
    if not sep or not target or not _IDENT_RE.fullmatch(function):
        ctx.fail(
            where, line, f"'{spec}' is not of the form FILE.py:FUNC or package.module:FUNC", f"write it as {example}"
        )
    if target.endswith(".py"):
        file = (ctx.root / target).resolve()
        if not file.is_file():
            ctx.fail(
                where,
                line,
                f"file '{target}' does not exist (looked for {file})",
                "entrypoint files are relative to the manifest's folder; fix the path",
            )
        return Entrypoint(spec=spec, function=function, file=file)
    if not all(_IDENT_RE.fullmatch(part) for part in target.split(".")):
        ctx.fail(
            where,
            line,
            f"'{target}' is neither a .py file nor a dotted module name",
            f"write it as {example}",
        )
    return Entrypoint(spec=spec, function=function, module=target)


def _file(ctx: _Ctx, model: _Map, key: str, prefix: str) -> Path:
    where, line = f"{prefix}.{key}", model.key_lines.get(key)
    value = model[key]
    if not isinstance(value, str) or not value.strip():
        ctx.fail(
            where,
            line,
            f"expected a file path, got {_describe(value)}",
            "write it relative to the manifest's folder, e.g. `hlo/model.hlo.txt`",
        )
    path = (ctx.root / value.strip()).resolve()
    if not path.is_file():
        ctx.fail(
            where,
            line,
            f"file '{value}' does not exist (looked for {path})",
            "paths are relative to the manifest's folder; fix the path",
        )
    return path


def _mesh(ctx: _Ctx, model: _Map, prefix: str) -> tuple[tuple[str, int], ...]:
    where, line = f"{prefix}.mesh", model.key_lines.get("mesh")
    mesh = model["mesh"]
    fix = "write it as a mapping from axis name to device count, e.g. `mesh: {dp: 2, tp: 4}`"
    if not isinstance(mesh, dict):
        ctx.fail(where, line, f"expected a mapping, got {_describe(mesh)}", fix)
    if not mesh:
        ctx.fail(where, line, "the mesh has no axes", fix)
    mesh = cast(_Map, mesh)
    axes: list[tuple[str, int]] = []
    for axis, size in mesh.items():
        axis_where, axis_line = f"{where}.{axis}", mesh.key_lines.get(axis, line)
        if not isinstance(axis, str) or not _IDENT_RE.fullmatch(axis):
            ctx.fail(axis_where, axis_line, f"axis name {axis!r} is not an identifier", "use names like dp, tp, sp, ep")
        # bool is an int subclass in Python, and YAML reads `yes`/`on` as true.
        if isinstance(size, bool) or not isinstance(size, int):
            ctx.fail(
                axis_where,
                axis_line,
                f"axis size must be a positive integer, got {_describe(size)}",
                f"write e.g. `{axis}: 4`",
            )
        if size <= 0:
            ctx.fail(
                axis_where, axis_line, f"axis size must be a positive integer, got {size}", f"write e.g. `{axis}: 4`"
            )
        axes.append((axis, size))
    total = 1
    for _, size in axes:
        total *= size
    if total > MAX_DEVICES:
        shape = " x ".join(f"{a}={s}" for a, s in axes)
        ctx.fail(
            where,
            line,
            f"the mesh {shape} needs {total} devices, more than the {MAX_DEVICES} fake CPU devices equivci supports",
            "verify a smaller mesh of the same shape (the parallel code is the same at smaller sizes)",
        )
    return tuple(axes)


def _tags(ctx: _Ctx, model: _Map, prefix: str) -> tuple[str, ...]:
    tags = model.get("tags")
    if tags is None:
        return ()
    where, line = f"{prefix}.tags", model.key_lines.get("tags")
    fix = "write it as a list of strings, e.g. `tags: [nightly, tp]`"
    if not isinstance(tags, list):
        ctx.fail(where, line, f"expected a list of strings, got {_describe(tags)}", fix)
    tags = cast(_Seq, tags)  # every sequence the loader builds is a _Seq
    for i, tag in enumerate(tags):
        if not isinstance(tag, str) or not tag:
            ctx.fail(f"{where}[{i}]", tags.item_lines[i], f"expected a non-empty string, got {_describe(tag)}", fix)
    return tuple(tags)


def _capture_timeout(ctx: _Ctx, model: _Map, prefix: str) -> float:
    value = model.get("capture_timeout", DEFAULT_CAPTURE_TIMEOUT)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        ctx.fail(
            f"{prefix}.capture_timeout",
            model.key_lines.get("capture_timeout"),
            f"expected a positive number of seconds, got {_describe(value)}",
            f"write e.g. `capture_timeout: 1800` (the default is {DEFAULT_CAPTURE_TIMEOUT:g})",
        )
    return float(value)


def _assume_valid_indices(ctx: _Ctx, model: _Map, prefix: str) -> bool:
    value = model.get("assume_valid_indices", True)
    if not isinstance(value, bool):
        ctx.fail(
            f"{prefix}.assume_valid_indices",
            model.key_lines.get("assume_valid_indices"),
            f"expected true or false, got {_describe(value)}",
            "write `assume_valid_indices: false` to refuse proofs that hold only for valid index inputs "
            "(the default, true, accepts them with a note)",
        )
    return value


def _int_range(ctx: _Ctx, model: _Map, prefix: str) -> tuple[int, int] | None:
    value = model.get("int_range")
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        or value[0] >= value[1]
    ):
        ctx.fail(
            f"{prefix}.int_range",
            model.key_lines.get("int_range"),
            f"expected [lo, hi] with integers lo < hi, got {_describe(value)}",
            "write e.g. `int_range: [0, 24]`: every integer input lies in [0, 24) (24 excluded)",
        )
    return (value[0], value[1])


def _model(ctx: _Ctx, node: Any, index: int, line: int) -> ModelSpec:
    prefix = f"models[{index}]"
    if not isinstance(node, dict):
        ctx.fail(
            prefix,
            line,
            f"expected a mapping with keys {', '.join(REQUIRED_MODEL_KEYS)}, got {_describe(node)}",
            "write each model as `- name: ...` followed by its keys, indented",
        )
    node = cast(_Map, node)
    kind = node.get("kind", "jax")
    if kind not in KINDS:
        ctx.fail(
            f"{prefix}.kind",
            node.key_lines.get("kind"),
            f"unknown model kind {kind!r}",
            "write `kind: hlo` for a model given as HLO files, or leave it out for JAX entrypoints",
        )
    if kind == "hlo":
        _check_keys(ctx, node, prefix, HLO_MODEL_KEYS, HLO_REQUIRED_KEYS)
    else:
        _check_keys(ctx, node, prefix, MODEL_KEYS, REQUIRED_MODEL_KEYS)
    name = node["name"]
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        ctx.fail(
            f"{prefix}.name",
            node.key_lines.get("name"),
            f"invalid model name {name!r}",
            "use only letters, digits, '_', '.' and '-', e.g. `llama-tp`",
        )
    if kind == "hlo":
        sources = HloSources(*(_file(ctx, node, key, prefix) for key in ("reference", "distributed", "relations")))
        return ModelSpec(
            name=name,
            reference=None,
            distributed=None,
            inputs=None,
            mesh=_mesh(ctx, node, prefix),
            tags=_tags(ctx, node, prefix),
            hlo=sources,
        )
    return ModelSpec(
        name=name,
        reference=_entrypoint(ctx, node, "reference", prefix),
        distributed=_entrypoint(ctx, node, "distributed", prefix),
        inputs=_entrypoint(ctx, node, "inputs", prefix),
        mesh=_mesh(ctx, node, prefix),
        tags=_tags(ctx, node, prefix),
        capture_timeout=_capture_timeout(ctx, node, prefix),
        oracle=_oracle(ctx, node, prefix),
        assume_valid_indices=_assume_valid_indices(ctx, node, prefix),
        int_range=_int_range(ctx, node, prefix),
    )


def _read_yaml(ctx: _Ctx, path: Path) -> Any:
    if path.exists() and not path.is_file():  # a folder, or a FIFO whose read would wait forever
        raise EquivciError(f"{ctx.display}: not a file; pass the manifest file itself with --manifest PATH.")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise EquivciError(
            f"{ctx.display}: manifest not found; create it, starting with `version: 1` and a `models:` list, "
            "or pass its path with --manifest PATH."
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise EquivciError(
            f"{ctx.display}: cannot read the manifest ({exc}); check the path and its permissions."
        ) from None
    try:
        return yaml.load(text, Loader=LineLoader)
    except RecursionError:
        raise EquivciError(
            f"{ctx.display}: nested too deeply to read (hundreds of levels of lists or mappings); a manifest "
            "needs three levels: `models:`, each model's keys, and `mesh:` or `tags:`."
        ) from None
    except DuplicateKey as dup:
        ctx.fail(
            str(dup.key), dup.line, "key written twice (YAML would silently keep the last one)", "remove one of them"
        )
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = " ".join(filter(None, [exc.context, exc.problem]))
        where = f"{ctx.display}:{mark.line + 1}" if mark else ctx.display
        raise EquivciError(
            f"{where}: not valid YAML: {problem}; fix the syntax (check indentation, colons and quotes)."
        ) from None
    except yaml.YAMLError as exc:
        raise EquivciError(f"{ctx.display}: not valid YAML: {' '.join(str(exc).split())}; fix the syntax.") from None


def load_manifest(path: Path) -> Manifest:
    """Read and validate a v1 manifest. Entrypoint files must exist; nothing is imported."""
    display = str(path)
    path = Path(path).absolute()
    ctx = _Ctx(display=display, root=path.parent)
    doc = _read_yaml(ctx, path)
    if not isinstance(doc, dict):
        ctx.fail(
            "<top level>",
            getattr(doc, "line", None),
            f"expected a mapping with `version` and `models`, got {_describe(doc)}",
            "start the file with `version: 1` and `models:`",
        )
    doc = cast(_Map, doc)
    _check_keys(ctx, doc, "", TOP_KEYS, TOP_KEYS)
    version = doc["version"]
    if type(version) is not int or version != SUPPORTED_VERSION:  # rejects True, 1.0 and '1'
        ctx.fail(
            "version",
            doc.key_lines["version"],
            f"unsupported manifest version {version!r}",
            f"this equivci reads version {SUPPORTED_VERSION}; write `version: {SUPPORTED_VERSION}`",
        )
    models = doc["models"]
    models_line = doc.key_lines["models"]
    if not isinstance(models, list):
        ctx.fail(
            "models",
            models_line,
            f"expected a list of models, got {_describe(models)}",
            "write `models:` followed by `- name: ...` entries",
        )
    if not models:
        ctx.fail(
            "models",
            models_line,
            "the list is empty",
            "add at least one model with name, reference, distributed, inputs and mesh",
        )
    models = cast(_Seq, models)
    specs: list[ModelSpec] = []
    first_line: dict[str, int] = {}
    for i, node in enumerate(models):
        spec = _model(ctx, node, i, models.item_lines[i])
        if spec.name in first_line:
            ctx.fail(
                f"models[{i}].name",
                node.key_lines["name"],
                f"duplicate model name '{spec.name}' (already used on line {first_line[spec.name]})",
                "give each model a unique name",
            )
        first_line[spec.name] = node.key_lines["name"]
        specs.append(spec)
    return Manifest(path=path, root=path.parent, models=tuple(specs))
