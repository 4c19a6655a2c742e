"""Parse HLO text (as printed by XLA and JAX, with stack-frame tables) into the typed IR."""

from __future__ import annotations

import codecs
import functools
import re

from equivci.hlo.ir import Computation, Instruction, Module, Shape, SourceLoc

_OPEN = {"{": "}", "[": "]", "(": ")"}


class HloParseError(ValueError):
    pass


def split_top(text: str, sep: str = ",") -> list[str]:
    """Split on `sep` outside brackets and quotes."""
    # Visits only the characters that matter (a 405B-shaped module has millions of characters).
    parts, depth, quote, start, skip = [], 0, False, 0, -1
    for m in _special(sep).finditer(text):
        i = m.start()
        if i == skip:  # the character after a backslash inside quotes
            continue
        ch = text[i]
        if quote:
            if ch == "\\":
                skip = i + 1
            elif ch == '"':
                quote = False
        elif ch == '"':
            quote = True
        elif ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        parts.append(text[start:].strip())
    return parts


@functools.lru_cache(maxsize=None)
def _special(sep: str) -> re.Pattern:
    return re.compile(r'["\\{}\[\]()' + re.escape(sep) + "]")


def balanced_end(text: str, start: int) -> int:
    """Index just past the bracket group that opens at text[start]."""
    depth, quote = 0, False
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            if ch == '"' and text[i - 1] != "\\":
                quote = False
            continue
        if ch == '"':
            quote = True
        elif ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
            if depth == 0:
                return i + 1
    raise HloParseError(f"unbalanced brackets in: {text[start : start + 80]!r}")


_ARRAY_SHAPE = re.compile(r"^([a-z][a-z0-9]*)\[([0-9,\s]*)\](\{[^}]*\})?$")


def parse_shape(text: str) -> Shape:
    text = text.strip()
    if text.startswith("("):
        inner = text[1 : balanced_end(text, 0) - 1]
        return Shape("tuple", (), tuple(parse_shape(p) for p in split_top(inner)) if inner.strip() else ())
    m = _ARRAY_SHAPE.match(text)
    if not m:
        if text in ("token[]", "token"):
            return Shape("token")
        raise HloParseError(f"cannot parse shape {text!r}")
    dims = tuple(int(d) for d in m.group(2).replace(" ", "").split(",") if d)
    return Shape(m.group(1), dims)


_SHAPE_AT = re.compile(r"[a-z][a-z0-9]*\[[0-9,\s]*\](\{[^}]*\})?")
_OPCODE = re.compile(r"([\w\-]+)\(")


def _scan_shape(text: str, pos: int) -> int:
    """End index of the shape starting at text[pos]."""
    if text[pos] == "(":
        return balanced_end(text, pos)
    m = _SHAPE_AT.match(text, pos)
    if not m:
        raise HloParseError(f"expected a shape at: {text[pos : pos + 60]!r}")
    return m.end()


_COMMENT = re.compile(r"/\*.*?\*/")
_INSTR_HEAD = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_COMP_HEAD = re.compile(r"^\s*(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*\)\s*->\s*.*)?\{\s*$")


def _parse_kv_braces(text: str) -> dict[str, str]:
    """`{a=1 b="x y" c=3}` (metadata) -> dict."""
    body = text.strip()[1:-1]
    out: dict[str, str] = {}
    for m in re.finditer(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', body):
        val = m.group(2)
        out[m.group(1)] = val[1:-1] if val.startswith('"') else val
    return out


class _Tables:
    """The FileNames / FunctionNames / FileLocations / StackFrames tables of JAX >= 0.9 dumps."""

    def __init__(self) -> None:
        self.files: dict[int, str] = {}
        self.functions: dict[int, str] = {}
        self.locations: dict[int, tuple[int, int, int]] = {}  # id -> (file id, function id, line)
        self.frames: dict[int, tuple[int, int]] = {}  # id -> (location id, parent frame id)
        # Stacks by frame id: the instructions of a big module share a few thousand frames, and
        # walking each instruction's stack anew was half of parsing.
        self._stacks: dict[int, tuple[SourceLoc, ...]] = {}

    def stack(self, frame_id: int) -> tuple[SourceLoc, ...]:
        chain, seen = [], set()
        while frame_id in self.frames and frame_id not in seen and frame_id not in self._stacks:
            seen.add(frame_id)
            chain.append(frame_id)
            # Printed parent ids are off by one: 1 names no parent, k + 1 names frame k.
            frame_id = self.frames[frame_id][1] - 1
        cycle = frame_id in seen
        out = () if cycle else self._stacks.get(frame_id, ())
        for frame in reversed(chain):
            file_id, fn_id, line = self.locations.get(self.frames[frame][0], (0, 0, 0))
            out = (SourceLoc(self.files.get(file_id, "?"), line, self.functions.get(fn_id, "")),) + out
            if not cycle:  # on a cycle a frame's stack depends on where the walk began
                self._stacks[frame] = out
        return out


_TABLE_NAMES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def _read_tables(lines: list[str], start: int, tables: _Tables) -> int:
    section = lines[start].strip()
    i = start + 1
    while i < len(lines) and lines[i].strip():
        row = lines[i].strip()
        ident, _, rest = row.partition(" ")
        key = int(ident)
        if section == "FileNames":  # C-escaped: `tp \303\274.py` is `tp ü.py`
            tables.files[key] = codecs.escape_decode(rest.strip().strip('"').encode())[0].decode("utf-8", "replace")
        elif section == "FunctionNames":
            tables.functions[key] = rest.strip().strip('"')
        elif section == "FileLocations":
            kv = _parse_kv_braces(rest)
            tables.locations[key] = (int(kv["file_name_id"]), int(kv["function_name_id"]), int(kv["line"]))
        else:
            kv = _parse_kv_braces(rest)
            tables.frames[key] = (int(kv["file_location_id"]), int(kv["parent_frame_id"]))
        i += 1
    return i


def _parse_instruction(line: str, tables: _Tables) -> Instruction:
    m = _INSTR_HEAD.match(line)
    if not m:
        raise HloParseError(f"cannot parse instruction: {line.strip()[:120]!r}")
    pos = m.end()
    shape_end = _scan_shape(line, pos)
    shape = parse_shape(line[pos:shape_end])
    rest = line[shape_end:].lstrip()
    om = _OPCODE.match(rest)
    if not om:
        raise HloParseError(f"cannot parse opcode in: {line.strip()[:120]!r}")
    opcode = om.group(1)
    args_start = om.end() - 1
    args_end = balanced_end(rest, args_start)
    args_text = rest[args_start + 1 : args_end - 1]
    attrs_text = rest[args_end:].lstrip().lstrip(",")
    attrs: dict[str, str] = {}
    for part in split_top(attrs_text):
        key, eq, value = part.partition("=")
        if eq:
            attrs[key.strip()] = value.strip()
    operands: list[str] = []
    if opcode in ("parameter", "constant", "iota", "partition-id", "replica-id"):
        attrs["_number" if opcode == "parameter" else "_literal"] = args_text.strip()
    else:
        for part in split_top(args_text):
            # Operands may be printed with their shape in front ("f32[8] %x").
            operands.append(part.split()[-1].lstrip("%"))
    op_name = ""
    stack: tuple[SourceLoc, ...] = ()
    if "metadata" in attrs:
        meta = _parse_kv_braces(attrs["metadata"])
        op_name = meta.get("op_name", "")
        if "stack_frame_id" in meta:
            stack = tables.stack(int(meta["stack_frame_id"]))
        elif "source_file" in meta:
            source_file = codecs.escape_decode(meta["source_file"].encode())[0].decode("utf-8", "replace")
            stack = (SourceLoc(source_file, int(meta.get("source_line", 0))),)
    return Instruction(m.group(2), opcode, shape, tuple(operands), attrs, op_name, stack, bool(m.group(1)))


def parse_module(text: str) -> Module:
    lines = text.splitlines()
    tables = _Tables()
    # Tables come before the computations that refer to them.
    i = 0
    while i < len(lines):
        if lines[i].strip() in _TABLE_NAMES:
            i = _read_tables(lines, i, tables)
        i += 1
    name, mod_attrs = "", {}
    computations: dict[str, Computation] = {}
    entry_name = None
    current: list[Instruction] | None = None
    comp_name, comp_entry = "", False
    for raw in lines:
        # XLA numbers long tuples and operand lists with /*index=N*/ comments.
        line = (_COMMENT.sub("", raw) if "/*" in raw else raw).rstrip()
        stripped = line.strip()
        if not stripped or stripped.startswith("//"):
            continue
        if stripped.startswith("HloModule"):
            head = split_top(stripped[len("HloModule") :].strip())
            name = head[0] if head else ""
            for part in head[1:]:
                k, _, v = part.partition("=")
                mod_attrs[k.strip()] = v.strip()
            continue
        if current is None:
            cm = _COMP_HEAD.match(line)
            if cm and "=" not in stripped.split("(")[0]:
                current, comp_name, comp_entry = [], cm.group(2), bool(cm.group(1))
            continue
        if stripped == "}":
            computations[comp_name] = Computation(comp_name, tuple(current), comp_entry)
            if comp_entry:
                entry_name = comp_name
            current = None
            continue
        current.append(_parse_instruction(line, tables))
    if entry_name is None:
        raise HloParseError("no ENTRY computation found in the HLO text")
    return Module(name, computations, entry_name, mod_attrs)
