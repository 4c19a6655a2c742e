"""What an instruction's attributes and the computations it calls say: dims lists, a name-free
digest of a called computation, and the reducers and combiners the handlers recognize.
"""

from __future__ import annotations

import functools
import hashlib
import re

from equivci.hlo.ir import Computation, Instruction, Module

REDUCERS = {"add": "add", "maximum": "maximum", "minimum": "minimum", "multiply": "multiply", "and": "and", "or": "or"}


def dims_attr(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    return tuple(int(x) for x in re.findall(r"-?\d+", text))


def semantic_attrs(inst: Instruction, module: Module) -> dict[str, str]:
    """The attributes that decide what `inst` computes: no metadata or shardings, and called
    computations by a name-free digest."""
    attrs = {k: v for k, v in inst.attrs.items() if k not in ("metadata", "frontend_attributes", "sharding")}
    for key in ("to_apply", "body", "condition", "calls", "comparator"):
        name = attrs.get(key, "").lstrip("%")
        if name in module.computations:
            attrs[key] = fingerprint(name, module)
    return attrs


@functools.lru_cache(maxsize=None)
def fingerprint(name: str, module: Module) -> str:
    """A name-free digest of a computation, for opaque ops that call one (sort, while, scatter)."""
    comp = module.computations[name]
    index = {inst.name: k for k, inst in enumerate(comp.instructions)}
    rows = [
        f"{inst.opcode}|{inst.shape}|{[index.get(o, o) for o in inst.operands]}|"
        f"{sorted(semantic_attrs(inst, module).items())}|{inst.is_root}"
        for inst in comp.instructions
    ]
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16]


def called(module: Module, inst: Instruction, key: str) -> Computation:
    return module.computations[inst.attrs[key].lstrip("%")]


def reducer_of(module: Module, inst: Instruction) -> str | None:
    """The elementwise op of a reduction's `to_apply` when it is one of REDUCERS, else None."""
    comp = called(module, inst, "to_apply")
    root = comp.root
    params = {p.name for p in comp.parameters()}
    if len(comp.instructions) == 3 and root.opcode in REDUCERS and set(root.operands) == params:
        return REDUCERS[root.opcode]
    return None


def overwrites(comp: Computation) -> bool:
    """A scatter combiner that returns the update (its second parameter)."""
    params = {int(p.attrs["_number"]): p.name for p in comp.parameters()}
    return len(params) == 2 and comp.root.opcode == "parameter" and comp.root.name == params.get(1)


def scatter_combiner(module: Module, inst: Instruction) -> str | None:
    """ "add" when a scatter adds its updates, "set" when it overwrites with them, else None."""
    if reducer_of(module, inst) == "add":
        return "add"
    return "set" if overwrites(called(module, inst, "to_apply")) else None


def custom_call_target(attrs: dict[str, str]) -> str:
    return attrs.get("custom_call_target", "").strip('"')
