"""Capture of a model given as HLO files (`kind: hlo`, docs/byo-hlo.md): programs dumped by another
compiler (Neuron, torch-xla), read as they are, with a relation file in place of the sharding
information a JAX capture reads from the partitioner. The result is the `CapturedModel` a JAX
capture makes, so verification, the memo and reports work unchanged:

- the reference program is used as it is: its entry parameters are the inputs, its flattened
  result the outputs;
- the distributed program's declared custom calls become the HLO ops they stand for (a vendor
  all-reduce an `all-reduce` over the declared mesh axes, a transfer a `copy`), `replica-id` becomes
  `partition-id` where the relation file says the device index comes from it;
- a new entry computation takes the reference's parameters, computes each distributed parameter
  from them as the relation file says (a device's block of a split, a concatenation of windows
  of fused weights, the device index itself) and calls the original entry; its result lists the
  distributed outputs in the order of the reference's.

Constants are never taken from elided text (`constant({...})`): two different tables must never
compare equal. A serialized HloModuleProto is printed with every constant in full by jaxlib.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

import numpy as np

from equivci import cache
from equivci.capture.relations import CustomCall, Key, Part, Relation, Relations, load_relations
from equivci.capture.types import CapturedModel, LeafPlacement
from equivci.errors import EquivciError
from equivci.git import repo_root
from equivci.hlo.ir import Instruction, Module, Shape
from equivci.hlo.parser import HloParseError, balanced_end, parse_module
from equivci.manifest import Manifest, ModelSpec

PROTO_SUFFIXES = (".pb", ".proto", ".hlo.pb")
_ELIDED = re.compile(r"constant\(\{\.\.\.\}\)")
_SOURCE_FILE = re.compile(r'source_file="((?:[^"\\]|\\.)*)"')
_ENTRY = re.compile(r"^(\s*)ENTRY\s+%?[\w.\-]+", re.MULTILINE)
PROGRAM = "byo.program"  # the distributed entry, called from the new one (XLA names the entry `main`)
HLO_TO_NUMPY = {
    "f32": "float32",
    "f64": "float64",
    "f16": "float16",
    "bf16": "bfloat16",
    "s8": "int8",
    "s16": "int16",
    "s32": "int32",
    "s64": "int64",
    "u8": "uint8",
    "u16": "uint16",
    "u32": "uint32",
    "u64": "uint64",
    "pred": "bool",
}


def capture_model(model: ModelSpec, manifest: Manifest, memo: dict | None = None) -> CapturedModel:
    """`memo` as for the JAX capture (run.capture_model): a known content key ends the capture
    before anything is rewritten (the result then has cached=True and no HLO)."""
    assert model.hlo is not None
    t0 = time.perf_counter()
    files = model.hlo
    display = {path: _display(path, manifest.root) for path in files.files()}
    relations = load_relations(files.relations, tuple(axis for axis, _ in model.mesh), display[files.relations])
    texts = [_read_program(path, display[path]) for path in (files.reference, files.distributed)]
    root = repo_root(manifest.root)
    key = cache.key(memo["fingerprint"] if memo else "", "hlo-files", repr(model.mesh), *texts, relations.text)
    sources = tuple(sorted(p.relative_to(root).as_posix() for p in files.files() if p.is_relative_to(root)))
    # The texts are the whole content: where the ops come from is part of the key already.
    known = CapturedModel(
        name=model.name,
        mesh=model.mesh,
        reference_hlo="",
        distributed_hlo="",
        inputs=(),
        outputs=(),
        repo_root=str(root),
        content_key=key,
        loc_digest=key,
        sources=sources,
        cached=True,
    )
    if memo is not None and _known(memo, key):
        return known
    texts = [
        _absolute_sources(text, path.parent, manifest.root)
        for text, path in zip(texts, (files.reference, files.distributed))
    ]
    reference = _parse(texts[0], display[files.reference])
    distributed = _parse(texts[1], display[files.distributed])
    builder = _Builder(model, relations, display[files.relations], reference, distributed)
    ref_text = builder.reference_text(_rewrite_calls(texts[0], reference, builder, 1, display[files.reference]))
    dist_text = builder.distributed_text(
        _rewrite_calls(texts[1], distributed, builder, model.num_devices, display[files.distributed])
    )
    return dataclasses.replace(
        known,
        reference_hlo=ref_text,
        distributed_hlo=dist_text,
        inputs=builder.inputs(),
        outputs=builder.outputs(),
        cached=False,
        timings=(("read HLO files", time.perf_counter() - t0),),
    )


def _known(memo: dict, key: str) -> bool:
    """As the JAX capture decides it: a result of this run, or one in the memo's store."""
    known = memo.get("known") or {}
    if key in known and known[key] in (None, key):
        return True
    store = cache.Memo(Path(memo["cache_dir"])) if memo.get("cache_dir") else None
    return store is not None and store.usable(key, key)


def _display(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)


def _read_program(path: Path, display: str) -> str:
    data = path.read_bytes()
    if path.name.endswith(PROTO_SUFFIXES):
        return _proto_text(data, display)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise EquivciError(
            f"{display}: not HLO text (not UTF-8); name a serialized HloModuleProto with a .pb suffix, or dump the "
            "module as text."
        ) from None
    elided = _ELIDED.search(text)
    if elided:
        line = text.count("\n", 0, elided.start()) + 1
        raise EquivciError(
            f"{display}:{line}: an elided constant (`constant({{...}})`): the dump left out its values, and equivci "
            "never guesses a constant (two different tables would compare equal); dump the module as a serialized "
            "HloModuleProto (XLA: --xla_dump_hlo_as_proto) and name the .pb file in the manifest, or dump the text "
            "with large constants printed (XLA: print_large_constants)."
        )
    return text


# jaxlib prints a module proto with every constant. In a child process: jaxlib's threads must not
# be in the process that forks the verifier.
_PRINT_PROTO = """
import sys
from jax._src.lib import xla_client
text = xla_client.XlaComputation(sys.stdin.buffer.read()).as_hlo_text(print_large_constants=True)
sys.stdout.write(text)
"""


def _proto_text(data: bytes, display: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", _PRINT_PROTO],
        input=data,
        capture_output=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    if proc.returncode != 0:
        lines = proc.stderr.decode(errors="replace").strip().splitlines()
        raise EquivciError(
            f"{display}: jaxlib cannot read it as a serialized HloModuleProto ({lines[-1] if lines else 'no message'}); "
            "name HLO text with a .txt or .hlo suffix, or dump the module proto again."
        )
    return proc.stdout.decode("utf-8")


def _absolute_sources(text: str, folder: Path, root: Path) -> str:
    """Relative `source_file` metadata, resolved against the HLO file's folder, then the manifest's,
    so that findings point at the file (frontends record paths relative to where they ran)."""

    def resolve(m: re.Match) -> str:
        name = m.group(1)
        if Path(name).is_absolute():
            return m.group(0)
        for base in (folder, root):
            if (base / name).is_file():
                return f'source_file="{(base / name).resolve()}"'
        return m.group(0)

    return _SOURCE_FILE.sub(resolve, text) if "source_file=" in text else text


def _parse(text: str, display: str) -> Module:
    try:
        return parse_module(text)
    except (HloParseError, KeyError, ValueError) as exc:
        raise EquivciError(
            f"{display}: not HLO text equivci can read ({exc}); give the module as XLA prints it "
            "(HloModule ..., ENTRY ...), or as a serialized HloModuleProto (.pb)."
        ) from None


def _leaves(shape: Shape, path: str = "") -> list[tuple[str, Shape]]:
    if shape.is_tuple:
        return [leaf for k, e in enumerate(shape.elements) for leaf in _leaves(e, f"{path}[{k}]")]
    return [(path, shape)]


def _placement(path: str, shape: Shape, slices: list[tuple[tuple[int, int], ...]]) -> LeafPlacement:
    return LeafPlacement(
        path=path, shape=shape.dims, dtype=HLO_TO_NUMPY.get(shape.dtype, shape.dtype), device_slices=tuple(slices)
    )


# --- custom calls ---------------------------------------------------------------------------------


def _rewrite_calls(text: str, module: Module, builder: "_Builder", num_devices: int, display: str) -> str:
    """Declared custom calls as the ops they stand for; `replica-id` as `partition-id` when it is
    the device index. Every custom call must be declared."""
    lines = text.splitlines()
    index: dict[str, list[int]] = {}
    for k, line in enumerate(lines):
        m = re.match(r"\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=", line)
        if m:
            index.setdefault(m.group(1), []).append(k)
    for comp in module.computations.values():
        for inst in comp.instructions:
            if inst.opcode != "custom-call" and not (
                inst.opcode == "replica-id" and builder.relations.device_index == "replica-id"
            ):
                continue
            for k in index.get(inst.name, ()):
                lines[k] = builder.rewrite(lines[k], inst, num_devices, display)
    # Reducers before their users, as XLA's own text parser wants them.
    head = next((k + 1 for k, line in enumerate(lines) if line.startswith("HloModule")), 0)
    return "\n".join(lines[:head] + builder.reducers() + lines[head:]) + "\n"


# --- the distributed entry ------------------------------------------------------------------------


@dataclasses.dataclass
class _Emit:
    lines: list[str] = dataclasses.field(default_factory=list)
    count: int = 0
    prefix: str = "byo"

    def __call__(self, shape: Shape | str, body: str) -> str:
        self.count += 1
        name = f"{self.prefix}.{self.count}"
        self.lines.append(f"  %{name} = {shape} {body}")
        return name


class _Builder:
    def __init__(self, model: ModelSpec, relations: Relations, display: str, reference: Module, distributed: Module):
        self.model, self.relations, self.display = model, relations, display
        self.n = model.num_devices
        self.ref_params = reference.entry.parameters()
        self.dist_params = distributed.entry.parameters()
        self.dist_entry = distributed.entry
        self.ref_outputs = _leaves(reference.entry.root.shape)
        self.dist_outputs = _leaves(distributed.entry.root.shape)
        self._reducers: dict[str, str] = {}
        for p in self.ref_params + self.dist_params:
            if p.shape.is_tuple:
                raise EquivciError(
                    f"{display}: parameter {p.name} is a tuple; equivci reads entry parameters that "
                    "are arrays (flatten the tuple in the dump)."
                )
        # Each distributed parameter's relation, checked against both programs.
        self.by_param: dict[int, Relation] = {}
        for rel in relations.parameters:
            param = self._param(self.dist_params, rel.key, rel.where, rel.line, "distributed")
            if int(param.attrs["_number"]) in self.by_param:
                self._fail(rel.where, rel.line, f"parameter {param.name} has two relations", "keep one")
            self.by_param[int(param.attrs["_number"])] = rel
        self.index_param = None
        if relations.index_parameter is not None:
            self.index_param = self._param(
                self.dist_params, relations.index_parameter, "device_index.parameter", 0, "distributed"
            )
            if self.index_param.shape.dims not in ((), (1,)) or self.index_param.shape.dtype[0] not in "su":
                self._fail(
                    "device_index.parameter",
                    0,
                    f"parameter {self.index_param.name} is {self.index_param.shape}",
                    "the device index is an integer scalar (or a one-element array)",
                )
        for p in self.dist_params:
            number = int(p.attrs["_number"])
            if number not in self.by_param and p is not self.index_param:
                self._fail(
                    "parameters",
                    0,
                    f"distributed parameter {number} ({p.name}, {p.shape}) has no relation",
                    f"add `{p.name}: {{reference: NAME, split: {{DIM: AXIS}}}}` under `parameters:`",
                )
        # A reference parameter only split (one part, no window) by one distributed parameter is
        # passed in as that split; every other one whole, and the new entry cuts it.
        uses: dict[int, list[Part]] = {}
        for rel in self.by_param.values():
            for part in rel.parts:
                uses.setdefault(self._ref_number(part), []).append(part)
        self.direct = {
            k: parts[0]
            for k, parts in uses.items()
            if len(parts) == 1 and not parts[0].window and self._single(parts[0])
        }
        self.output_map = self._outputs()

    # -- checks ---------------------------------------------------------------------------------
    def _fail(self, where: str, line: int, what: str, fix: str) -> NoReturn:
        at = f"{self.display}:{line}" if line else self.display
        raise EquivciError(f"{at}: {where}: {what}; {fix}.")

    def _param(self, params: list[Instruction], key: Key, where: str, line: int, side: str) -> Instruction:
        for p in params:
            if (isinstance(key, int) and int(p.attrs["_number"]) == key) or p.name == key:
                return p
        names = [p.name for p in params]
        close = difflib.get_close_matches(str(key), names, n=1)
        hint = (
            f"did you mean '{close[0]}'?"
            if close
            else f"the {side} entry parameters are "
            + ", ".join(f"{int(p.attrs['_number'])} ({p.name})" for p in params)
        )
        self._fail(where, line, f"no {side} parameter named {key!r}", hint)

    def _ref_number(self, part: Part) -> int:
        return int(
            self._param(self.ref_params, part.reference, f"{part.where}.reference", part.line, "reference").attrs[
                "_number"
            ]
        )

    def _single(self, part: Relation | Part) -> bool:
        return not isinstance(part, Relation) or len(part.parts) == 1

    # -- placements -----------------------------------------------------------------------------
    def _blocks(self, part: Part, shape: tuple[int, ...]) -> list[list[tuple[int, int]]]:
        """Per device, per dimension: (start, stop) of the device's block of the (windowed) value."""
        sizes = dict(self.model.mesh)
        axes = [a for a, _ in self.model.mesh]
        window = {d: (lo, hi) for d, lo, hi in part.window}
        for d, lo, hi in part.window:
            if d >= len(shape) or hi > shape[d]:
                self._fail(
                    f"{part.where}.window",
                    part.line,
                    f"window [{lo}, {hi}) of dimension {d} is outside "
                    f"reference parameter {part.reference!r} of shape {list(shape)}",
                    "fix the window",
                )
        base = [window.get(d, (0, n)) for d, n in enumerate(shape)]
        out = []
        for device in range(self.n):
            coords = dict(zip(axes, np.unravel_index(device, [sizes[a] for a in axes])))
            block = list(base)
            for d, split_axes in part.split:
                if d >= len(shape):
                    self._fail(
                        f"{part.where}.split",
                        part.line,
                        f"dimension {d} is not a dimension of reference "
                        f"parameter {part.reference!r} of shape {list(shape)}",
                        "fix the dimension",
                    )
                count = int(np.prod([sizes[a] for a in split_axes]))
                lo, hi = base[d]
                if (hi - lo) % count:
                    self._fail(
                        f"{part.where}.split",
                        part.line,
                        f"dimension {d} of size {hi - lo} does not divide "
                        f"into {count} blocks over {', '.join(split_axes)}",
                        "equivci takes even splits only",
                    )
                chunk = int(np.ravel_multi_index([int(coords[a]) for a in split_axes], [sizes[a] for a in split_axes]))
                size = (hi - lo) // count
                block[d] = (lo + chunk * size, lo + (chunk + 1) * size)
            out.append(block)
        return out

    def inputs(self) -> tuple[LeafPlacement, ...]:
        out = []
        for p in self.ref_params:
            number = int(p.attrs["_number"])
            part = self.direct.get(number)
            blocks = self._blocks(part, p.shape.dims) if part else [[(0, n) for n in p.shape.dims]] * self.n
            out.append(_placement(p.name, p.shape, [tuple(b) for b in blocks]))
        return tuple(out)

    def _outputs(self) -> list[tuple[int, Relation | None]]:
        """For each reference output leaf: the distributed output leaf that holds it, and how."""
        if self.relations.outputs is None:
            if len(self.dist_outputs) != len(self.ref_outputs):
                self._fail(
                    "outputs",
                    0,
                    f"the distributed program has {len(self.dist_outputs)} outputs and the "
                    f"reference {len(self.ref_outputs)}",
                    "say which is which under `outputs:`",
                )
            return [(k, None) for k in range(len(self.ref_outputs))]
        found: dict[int, tuple[int, Relation]] = {}
        for rel in self.relations.outputs:
            dist = self._output(rel.key, self.dist_outputs, rel.where, rel.line, "distributed")
            if not self._single(rel) or rel.parts[0].window:
                self._fail(
                    rel.where,
                    rel.line,
                    "an output relation is a split or a replica of one reference output",
                    "write `{reference: K, split: {DIM: AXIS}}`",
                )
            ref = self._output(
                rel.parts[0].reference, self.ref_outputs, f"{rel.where}.reference", rel.line, "reference"
            )
            if ref in found:
                self._fail(rel.where, rel.line, f"reference output {ref} is given twice", "map each once")
            found[ref] = (dist, rel)
        missing = [k for k in range(len(self.ref_outputs)) if k not in found]
        if missing:
            self._fail(
                "outputs",
                0,
                f"reference output(s) {missing} have no distributed output",
                "map every reference output under `outputs:`",
            )
        return [found[k] for k in range(len(self.ref_outputs))]

    def _output(self, key: Key, leaves: list, where: str, line: int, side: str) -> int:
        if isinstance(key, int) and 0 <= key < len(leaves):
            return key
        self._fail(
            where,
            line,
            f"no {side} output {key!r}",
            f"outputs are numbered 0 to {len(leaves) - 1} in the order of the flattened result",
        )

    def outputs(self) -> tuple[LeafPlacement, ...]:
        out: list[LeafPlacement] = []
        for (path, shape), (dist, rel) in zip(self.ref_outputs, self.output_map):
            blocks = self._blocks(rel.parts[0], shape.dims) if rel else [[(0, n) for n in shape.dims]] * self.n
            local = self.dist_outputs[dist][1]
            if tuple(hi - lo for lo, hi in blocks[0]) != local.dims:
                where, line = (rel.where, rel.line) if rel else ("outputs", 0)
                self._fail(
                    where,
                    line,
                    f"distributed output {dist} is {local} but the relation makes a block of shape "
                    f"{[hi - lo for lo, hi in blocks[0]]}",
                    "fix the split",
                )
            out.append(_placement(path or f"[{len(out)}]", shape, [tuple(b) for b in blocks]))
        return tuple(out)

    # -- the rewritten program ------------------------------------------------------------------
    def rewrite(self, line: str, inst: Instruction, num_devices: int, display: str) -> str:
        if inst.opcode == "replica-id":
            return line.replace("replica-id()", "partition-id()", 1)
        target = inst.attrs.get("custom_call_target", "").strip('"')
        call = self.relations.custom_calls.get(target)
        if call is None:
            raise EquivciError(
                f'{display}: {inst.name} calls custom call "{target}", which {self.display} does not declare under '
                f"`custom_calls:`; equivci cannot know what it computes: add `{target}: identity`, `opaque`, or a "
                "collective such as `{all-reduce: add, groups: [tp]}` there (docs/byo-hlo.md)."
            )
        start = line.index("custom-call(")
        end = balanced_end(line, start + len("custom-call"))
        operands = line[start + len("custom-call(") : end - 1]
        meta = f", metadata={inst.attrs['metadata']}" if "metadata" in inst.attrs else ""
        if call.kind == "opaque":
            return line
        if len(inst.operands) != 1 or inst.shape.is_tuple:
            raise EquivciError(
                f"{self.display}: {call.where}: {inst.name} has {len(inst.operands)} operands and shape "
                f"{inst.shape}; a declared custom call takes one array, or is declared `opaque`."
            )
        head = line[:start]
        if call.kind == "identity":
            return f"{head}copy({operands}){meta}"
        groups = self._groups(call, num_devices)
        if call.kind == "all-gather":
            return f"{head}all-gather({operands}), dimensions={{{call.dim}}}, replica_groups={groups}{meta}"
        reducer = self._reducer(call.reduce, inst.shape.dtype)
        if call.kind == "all-reduce":
            return f"{head}all-reduce({operands}), replica_groups={groups}, to_apply=%{reducer}{meta}"
        return f"{head}reduce-scatter({operands}), dimensions={{{call.dim}}}, replica_groups={groups}, to_apply=%{reducer}{meta}"

    def _groups(self, call: CustomCall, num_devices: int) -> str:
        if call.groups is None or num_devices == 1:
            return "{}"
        spec = ",".join(f"'{a}'={s}" for a, s in self.model.mesh)
        return f"mesh[{spec}] {{{','.join(repr(a) for a in call.groups)}}}"

    def _reducer(self, op: str, dtype: str) -> str:
        name = f"byo.{op}.{dtype}"
        self._reducers[name] = (
            f"%{name} (a: {dtype}[], b: {dtype}[]) -> {dtype}[] {{\n  %a = {dtype}[] parameter(0)\n"
            f"  %b = {dtype}[] parameter(1)\n  ROOT %r = {dtype}[] {op}(%a, %b)\n}}\n"
        )
        return name

    def reducers(self) -> list[str]:
        out = list(self._reducers.values())
        self._reducers.clear()
        return out

    def reference_text(self, text: str) -> str:
        """The reference with, for each fused distributed parameter (a concatenation of parts), the
        whole value its device blocks are windows of: the concatenation of every device's block, in
        device order. Nothing uses it; it is a reference value, so a device's fused weight is a
        slice of one and the fused weight, which no reference op computes, is not reported as the
        first value unrelated to the reference."""
        emit = _Emit(prefix="byo.fused")
        for rel in self.by_param.values():
            if rel.concat is None:
                continue
            dtype = self.dist_params[0].shape.dtype
            blocks: list[str] = []
            seen: dict[tuple, str] = {}
            for device in range(self.n):
                pieces = []
                for part in rel.parts:
                    param = self._ref_param(part)
                    box = tuple(self._blocks(part, param.shape.dims)[device])
                    size = tuple(hi - lo for lo, hi in box)
                    dtype = param.shape.dtype
                    pieces.append(
                        (
                            emit(
                                Shape(dtype, size),
                                f"slice(%{param.name}), slice={{" + ", ".join(f"[{lo}:{hi}]" for lo, hi in box) + "}",
                            ),
                            size,
                        )
                    )
                key = tuple(p for p, _ in pieces)
                if any(len(s) <= rel.concat for _, s in pieces):
                    return text  # reported with the distributed entry
                width = sum(s[rel.concat] for _, s in pieces)
                shape = list(pieces[0][1])
                shape[rel.concat] = width
                if key not in seen:
                    seen[key] = emit(
                        Shape(dtype, tuple(shape)),
                        f"concatenate({', '.join('%' + p for p, _ in pieces)}), dimensions={{{rel.concat}}}",
                    )
                    blocks.append(seen[key])
            if len(blocks) > 1:
                total = list(shape)
                total[rel.concat] = width * len(blocks)
                emit(
                    Shape(dtype, tuple(total)),
                    f"concatenate({', '.join('%' + b for b in blocks)}), dimensions={{{rel.concat}}}",
                )
        if not emit.lines:
            return text
        lines = text.splitlines()
        start = next(k for k, line in enumerate(lines) if line.lstrip().startswith("ENTRY"))
        end = next(k for k in range(start + 1, len(lines)) if lines[k].strip() == "}")
        return "\n".join(lines[:end] + emit.lines + lines[end:]) + "\n"

    def _ref_param(self, part: Part) -> Instruction:
        number = self._ref_number(part)
        return next(p for p in self.ref_params if int(p.attrs["_number"]) == number)

    def distributed_text(self, text: str) -> str:
        """The program with a new entry that takes the reference's parameters."""
        text = _ENTRY.sub(rf"\1%{PROGRAM}", text)
        emit = _Emit()
        header, args = [], {}
        inputs = self.inputs()
        for p, leaf in zip(self.ref_params, inputs):
            number = int(p.attrs["_number"])
            local = Shape(p.shape.dtype, tuple(hi - lo for lo, hi in leaf.device_slices[0]))
            header.append(f"byo.p{number}: {local}")
            emit.lines.append(f"  %byo.p{number} = {local} parameter({number})")
            args[number] = f"byo.p{number}"
        pid = emit("u32[]", "partition-id()")
        operands = []
        for p in self.dist_params:
            if p is self.index_param:
                value = emit(f"{p.shape.dtype}[]", f"convert(%{pid})")
                operands.append(emit(p.shape, f"reshape(%{value})") if p.shape.dims else value)
                continue
            rel = self.by_param[int(p.attrs["_number"])]
            pieces = [self._piece(part, args, emit, pid) for part in rel.parts]
            shapes = [shape for _, shape in pieces]
            if rel.concat is None:
                name, dims = pieces[0]
            else:
                if any(len(s) != len(shapes[0]) or rel.concat >= len(s) for s in shapes):
                    self._fail(
                        f"{rel.where}.concat",
                        rel.line,
                        f"parts of shapes {shapes} do not concatenate along dimension {rel.concat}",
                        "fix the parts or the dimension",
                    )
                width = sum(s[rel.concat] for s in shapes)
                dims = shapes[0][: rel.concat] + (width,) + shapes[0][rel.concat + 1 :]
                name = emit(
                    Shape(p.shape.dtype, dims),
                    f"concatenate({', '.join('%' + n for n, _ in pieces)}), dimensions={{{rel.concat}}}",
                )
            if dims != p.shape.dims:
                self._fail(
                    rel.where,
                    rel.line,
                    f"the relation makes a {p.shape.dtype}{list(dims)} but distributed parameter {p.name} is {p.shape}",
                    "fix the split, window or parts",
                )
            operands.append(name)
        result = self.dist_entry.root.shape
        call = emit(result, f"call({', '.join('%' + o for o in operands)}), to_apply=%{PROGRAM}")
        outs: list[tuple[str, Shape]] = []
        for dist, _ in self.output_map:
            name, shape = call, result
            for index in _leaf_path(result, dist):
                shape = shape.elements[index]
                name = emit(shape, f"get-tuple-element(%{name}), index={index}")
            outs.append((name, shape))
        if result.is_tuple or len(outs) != 1:
            root_shape = Shape("tuple", (), tuple(s for _, s in outs))
            emit.lines.append(f"  ROOT %byo.out = {root_shape} tuple({', '.join('%' + n for n, _ in outs)})")
        else:
            root_shape = outs[0][1]
            emit.lines.append(f"  ROOT %byo.out = {root_shape} copy(%{outs[0][0]})")
        entry = f"ENTRY %byo.entry ({', '.join(header)}) -> {root_shape} {{\n" + "\n".join(emit.lines) + "\n}\n"
        return text + "\n" + entry

    def _piece(self, part: Part, args: dict[int, str], emit: _Emit, pid: str) -> tuple[str, tuple[int, ...]]:
        """This device's block of one part, from the new entry's parameter."""
        number = self._ref_number(part)
        param = self._ref_param(part)
        blocks = self._blocks(part, param.shape.dims)
        size = tuple(hi - lo for lo, hi in blocks[0])
        if number in self.direct:  # passed in as this device's block already
            return args[number], size
        offsets = []
        for d in range(len(size)):
            starts = [block[d][0] for block in blocks]
            if len(set(starts)) == 1:
                offsets.append(emit("s32[]", f"constant({starts[0]})"))
                continue
            table = emit(f"s32[{self.n}]", f"constant({{{', '.join(map(str, starts))}}})")
            one = emit("s32[1]", f"dynamic-slice(%{table}, %{pid}), dynamic_slice_sizes={{1}}")
            offsets.append(emit("s32[]", f"reshape(%{one})"))
        block = emit(
            Shape(param.shape.dtype, size),
            f"dynamic-slice(%{args[number]}, {', '.join('%' + o for o in offsets)}), "
            f"dynamic_slice_sizes={{{','.join(map(str, size))}}}",
        )
        return block, size


def _leaf_path(shape: Shape, leaf: int) -> list[int]:
    """Tuple indices from `shape` down to its `leaf`-th flattened leaf."""
    if not shape.is_tuple:
        return []
    for k, element in enumerate(shape.elements):
        count = len(_leaves(element))
        if leaf < count:
            return [k] + _leaf_path(element, leaf)
        leaf -= count
    raise IndexError(leaf)
