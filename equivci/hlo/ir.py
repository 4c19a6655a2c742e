"""Typed IR of an HLO module: what the parser produces and the verifier consumes."""

from __future__ import annotations

import dataclasses

# Ops that hand a value on (or make one from nothing) without computing on it.
TRIVIAL_OPS = {
    "parameter",
    "copy",
    "tuple",
    "get-tuple-element",
    "call",
    "opt-barrier",
    "custom-call",
    "bitcast",
    "constant",
    "partition-id",
    "replica-id",
    "iota",
}


# The float dtypes the verifier reasons about over the reals (f8 types stay opaque), and for each
# the wider ones a value of it can be rounded from.
FLOATS = frozenset({"bf16", "f16", "f32", "f64"})
WIDER = {"bf16": ("f32", "f64"), "f16": ("f32", "f64"), "f32": ("f64",)}


@dataclasses.dataclass(frozen=True)
class Shape:
    dtype: str  # "f32", "bf16", "s32", "pred", ...; "tuple" for tuples, "token" for tokens
    dims: tuple[int, ...] = ()
    elements: tuple["Shape", ...] = ()  # for tuples

    @property
    def is_tuple(self) -> bool:
        return self.dtype == "tuple"

    def __str__(self) -> str:
        if self.is_tuple:
            return "(" + ", ".join(str(e) for e in self.elements) + ")"
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"


@dataclasses.dataclass(frozen=True)
class SourceLoc:
    file: str  # as recorded by JAX (absolute on the capturing machine)
    line: int
    function: str = ""


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    opcode: str
    shape: Shape
    operands: tuple[str, ...]
    attrs: dict[str, str]  # raw attribute text by key, e.g. {"lhs_contracting_dims": "{1}"}
    op_name: str = ""  # metadata op_name (JAX's name stack)
    stack: tuple[SourceLoc, ...] = ()  # innermost frame first
    is_root: bool = False


@dataclasses.dataclass(frozen=True)
class Computation:
    name: str
    instructions: tuple[Instruction, ...]
    is_entry: bool = False

    @property
    def root(self) -> Instruction:
        for inst in self.instructions:
            if inst.is_root:
                return inst
        return self.instructions[-1]

    def parameters(self) -> list[Instruction]:
        params = [i for i in self.instructions if i.opcode == "parameter"]
        return sorted(params, key=lambda i: int(i.attrs["_number"]))


@dataclasses.dataclass(frozen=True, eq=False)  # identity: the verifier caches digests per module
class Module:
    name: str
    computations: dict[str, Computation]
    entry_name: str
    attrs: dict[str, str]

    @property
    def entry(self) -> Computation:
        return self.computations[self.entry_name]
