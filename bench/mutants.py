"""Mutation sweep: a soundness check of equivci against source-level mutants of correct models.

For every correct model of configs/zoo.yaml and equivci.yaml (labels from the expected.yaml
sidecars, via equivci/testing/zoo.py), the distributed function is mutated with Python's `ast`
(one change per mutant: a constant off by one, `+`/`-` swapped, a collective deleted, another
mesh axis, a changed `axis=`/`tiled=`, a slice start moved, `axis_index` replaced by 0, a
reversed ppermute ring, a PartitionSpec entry moved, ...). Module-level helpers the distributed
function calls are cloned first (`_layer` -> `_layer__dist`), so a mutant never touches the
reference. Each mutant goes to the numeric oracle (equivci/capture/oracle.py, random inputs on
the fake mesh, several seeds) and, if it runs, to `equivci verify --no-cache --format json`.

    python bench/mutants.py                                  # full sweep
    python bench/mutants.py --models ring-matmul,mlp-tp --max-per-model 5 --keep /tmp/mut
    python bench/mutants.py --probes                         # plus the hand-written probes

An UNSOUND case is a mutant the oracle shows different that equivci reports `verified`; each is
printed with its diff (exit status 1). Mutants that JAX rejects (tracing or shape errors) are
counted and skipped. Oracle-equal mutants that are not verified are completeness gaps,
reported for information; oracle-equal mutants reported `mismatch` are listed (a mismatch must
rest on a counterexample). `--probes` adds configs/probes.yaml: hand-written variants whose
difference the oracle cannot see (tolerance, value-dependent, integer ranges it does not draw)
and per-layer / per-iteration bugs; none but its control may be verified.
"""

from __future__ import annotations

import argparse
import ast
import collections
import concurrent.futures
import copy
import dataclasses
import difflib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable

import yaml

from equivci.capture.oracle import NumericComparison, compare_many_in_child
from equivci.errors import EquivciError
from equivci.testing.runs import SHARDS, verify_json
from equivci.testing.zoo import MANIFESTS, Case, cases

REPO = Path(__file__).resolve().parents[1]

CORRECT_MANIFESTS = {rel: side for rel, side in MANIFESTS.items() if rel in ("equivci.yaml", "configs/zoo.yaml")}
SEEDS = (0, 1, 2, 3)
CANDIDATES_PER_KEPT = 2
CLONE_SUFFIX = "__dist"

COLLECTIVES = {"psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "all_to_all", "ppermute"}
KIND_SWAP = {"psum": "pmean", "pmean": "psum", "pmax": "pmin", "pmin": "pmax"}
# Position of the start index among the positional arguments.
SLICE_START_ARG = {"dynamic_slice_in_dim": 1, "dynamic_update_slice_in_dim": 2, "dynamic_index_in_dim": 1}
CONCATS = {"concatenate", "stack", "hstack", "vstack"}
AXIS_KWARGS = {"axis", "tiled", "scatter_dimension", "split_axis", "concat_axis", "dimension", "keepdims"}
ARITH_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult}
NONCOMMUTATIVE = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.MatMult)
CMP_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}


# --- mutation operators: pure functions of one AST node -----------------------------------------


@dataclasses.dataclass(frozen=True)
class Ctx:
    axes: tuple[str, ...]  # the model's mesh axis names, in order
    consts: dict  # module-level NAME = "string" assignments, to resolve axis-name constants
    keyword_values: frozenset  # ids of nodes that are keyword values (handled by `kwarg`, not `int+-1`)


Replacement = tuple[str, ast.AST]  # (what it becomes, the new node)


def _callee(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Attribute):
            return node.func.attr
        if isinstance(node.func, ast.Name):
            return node.func.id
    return None


def _with(node: ast.AST, **fields) -> ast.AST:
    new = copy.deepcopy(node)
    for k, v in fields.items():
        setattr(new, k, v)
    return new


def _int_const(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def op_int_pm1(node, ctx: Ctx) -> list[Replacement]:
    if not _int_const(node) or id(node) in ctx.keyword_values:
        return []
    return [(str(v), ast.Constant(v)) for v in (node.value + 1, node.value - 1)]


def op_arith(node, ctx: Ctx) -> list[Replacement]:
    if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in ARITH_SWAP:
        new = _with(node, op=ARITH_SWAP[type(node.op)]())
        return [(ast.unparse(new), new)]
    return []


def op_operands(node, ctx: Ctx) -> list[Replacement]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, NONCOMMUTATIVE):
        if ast.dump(node.left) != ast.dump(node.right):
            new = _with(node, left=copy.deepcopy(node.right), right=copy.deepcopy(node.left))
            return [(ast.unparse(new), new)]
    return []


def op_compare(node, ctx: Ctx) -> list[Replacement]:
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in CMP_SWAP:
        new = _with(node, ops=[CMP_SWAP[type(node.ops[0])]()])
        return [(ast.unparse(new), new)]
    return []


def op_drop_collective(node, ctx: Ctx) -> list[Replacement]:
    if _callee(node) in COLLECTIVES and node.args:
        return [(ast.unparse(node.args[0]), copy.deepcopy(node.args[0]))]
    return []


def op_collective_kind(node, ctx: Ctx) -> list[Replacement]:
    name = _callee(node)
    if name in KIND_SWAP and isinstance(node.func, ast.Attribute):
        new = _with(node, func=_with(node.func, attr=KIND_SWAP[name]))
        return [(ast.unparse(new), new)]
    return []


def _axis_arg(node: ast.Call) -> tuple[str, int | str] | None:
    """Where a collective or axis_index takes its mesh axis: ("args", i) or ("kw", name)."""
    name = _callee(node)
    for kw in node.keywords:
        if kw.arg == "axis_name":
            return ("kw", kw.arg)
    if name == "axis_index" and node.args:
        return ("args", 0)
    if name in COLLECTIVES and len(node.args) > 1:
        return ("args", 1)
    return None


def _resolve_axes(node: ast.AST, ctx: Ctx) -> tuple[str, ...] | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return (node.value,)
    if isinstance(node, ast.Name) and node.id in ctx.consts:
        return (ctx.consts[node.id],)
    if isinstance(node, ast.Tuple):
        parts = [_resolve_axes(e, ctx) for e in node.elts]
        return None if None in parts else tuple(a for p in parts for a in p)
    return None


def op_axis_name(node, ctx: Ctx) -> list[Replacement]:
    if len(ctx.axes) < 2 or _callee(node) not in COLLECTIVES | {"axis_index"}:
        return []
    where = _axis_arg(node)
    if where is None:
        return []
    kind, key = where
    current = node.args[key] if kind == "args" else next(k.value for k in node.keywords if k.arg == key)
    now = _resolve_axes(current, ctx)
    choices: list[tuple[str, ...]] = [(a,) for a in ctx.axes]
    if _callee(node) != "axis_index":
        choices.append(tuple(ctx.axes))
    out = []
    for axes in choices:
        if now is not None and set(axes) == set(now):
            continue
        value = ast.Constant(axes[0]) if len(axes) == 1 else ast.Tuple([ast.Constant(a) for a in axes], ast.Load())
        new = copy.deepcopy(node)
        if kind == "args":
            new.args[key] = value
        else:
            next(k for k in new.keywords if k.arg == key).value = value
        out.append((ast.unparse(new), new))
    return out


def op_kwarg(node, ctx: Ctx) -> list[Replacement]:
    if not isinstance(node, ast.Call):
        return []
    out = []
    for i, kw in enumerate(node.keywords):
        if kw.arg not in AXIS_KWARGS or not isinstance(kw.value, ast.Constant):
            continue
        value = kw.value.value
        if type(value) is bool:
            values = [not value]
        elif type(value) is int:
            values = [value + 1, value - 1] if value > 0 else [value + 1]
        else:
            continue
        for v in values:
            new = copy.deepcopy(node)
            new.keywords[i].value = ast.Constant(v)
            out.append((f"{kw.arg}={v}", new))
    return out


def op_slice_start(node, ctx: Ctx) -> list[Replacement]:
    pos = SLICE_START_ARG.get(_callee(node))
    if pos is None or len(node.args) <= pos:
        return []
    # By one element, and (for a slice of static size) by a whole block: the neighbour's shard,
    # which also makes the last shard's start clamp back into range.
    steps = [ast.Constant(1)]
    if _callee(node) == "dynamic_slice_in_dim" and len(node.args) > 2:
        steps.append(node.args[2])
    out = []
    for step in steps:
        for op, sign in ((ast.Add(), "+"), (ast.Sub(), "-")):
            new = copy.deepcopy(node)
            new.args[pos] = ast.BinOp(copy.deepcopy(node.args[pos]), op, copy.deepcopy(step))
            out.append((f"start {ast.unparse(node.args[pos])} {sign} {ast.unparse(step)}", new))
    return out


def op_axis_index(node, ctx: Ctx) -> list[Replacement]:
    """axis_index -> 0, the shards in reverse order, or rotated by one."""
    if _callee(node) != "axis_index" or not node.args:
        return []
    size = copy.deepcopy(node)  # lax.axis_size, spelled as the axis_index call is
    if isinstance(size.func, ast.Attribute):
        size.func.attr = "axis_size"
    else:
        size.func = ast.Attribute(ast.Name("lax", ast.Load()), "axis_size", ast.Load())
    variants = {
        "0": ast.Constant(0),
        "reversed": ast.BinOp(ast.BinOp(size, ast.Sub(), ast.Constant(1)), ast.Sub(), copy.deepcopy(node)),
        "rotated": ast.BinOp(ast.BinOp(copy.deepcopy(node), ast.Add(), ast.Constant(1)), ast.Mod(), copy.deepcopy(size)),
    }
    return [(ast.unparse(v), v) for v in variants.values()]


def op_concat_swap(node, ctx: Ctx) -> list[Replacement]:
    if _callee(node) not in CONCATS or not node.args or not isinstance(node.args[0], (ast.List, ast.Tuple)):
        return []
    elts, out = node.args[0].elts, []
    for i in range(len(elts) - 1):
        if ast.dump(elts[i]) == ast.dump(elts[i + 1]):
            continue
        new = copy.deepcopy(node)
        e = new.args[0].elts
        e[i], e[i + 1] = e[i + 1], e[i]
        out.append((f"operands {i} and {i + 1} swapped", new))
    return out


def op_arg_swap(node, ctx: Ctx) -> list[Replacement]:
    # Same-shaped arguments in the wrong order (q and k, a where's branches) is the wrong-slice
    # bug family; specs and collectives have their own operators.
    if not isinstance(node, ast.Call) or _callee(node) in COLLECTIVES or _spec_like(node, ctx):
        return []
    out = []
    for i in range(len(node.args) - 1):
        pair = node.args[i:i + 2]
        if ast.dump(pair[0]) == ast.dump(pair[1]) or any(isinstance(a, ast.Starred) for a in pair):
            continue
        new = copy.deepcopy(node)
        new.args[i], new.args[i + 1] = new.args[i + 1], new.args[i]
        out.append((ast.unparse(new), new))
    return out


def op_return_swap(node, ctx: Ctx) -> list[Replacement]:
    if not (isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple) and len(node.value.elts) > 1):
        return []
    out = []
    for i in range(len(node.value.elts) - 1):
        new = copy.deepcopy(node)
        e = new.value.elts
        e[i], e[i + 1] = e[i + 1], e[i]
        out.append((ast.unparse(new), new))
    return out


def _pair(node: ast.AST) -> bool:
    return isinstance(node, ast.Tuple) and len(node.elts) == 2


def op_perm(node, ctx: Ctx) -> list[Replacement]:
    # ppermute permutations: a list (comprehension) of (source, destination) pairs; reversing
    # every pair sends the blocks around the ring the other way.
    # Dropping the pair of source 0 leaves one device receiving zeros (a shift, not a ring).
    if isinstance(node, ast.ListComp) and _pair(node.elt):
        out = []
        new = _with(node, elt=ast.Tuple(list(reversed(copy.deepcopy(node.elt).elts)), ast.Load()))
        out.append((ast.unparse(new), new))
        gen = node.generators[0]
        if len(node.generators) == 1 and isinstance(gen.target, ast.Name):
            new = copy.deepcopy(node)
            new.generators[0].ifs.append(ast.Compare(ast.Name(gen.target.id, ast.Load()), [ast.NotEq()], [ast.Constant(0)]))
            out.append((ast.unparse(new), new))
        return out
    if isinstance(node, ast.List) and node.elts and all(_pair(e) for e in node.elts):
        new = ast.List([ast.Tuple(list(reversed(copy.deepcopy(e).elts)), ast.Load()) for e in node.elts], ast.Load())
        return [(ast.unparse(new), new)]
    return []


def _spec_like(node: ast.AST, ctx: Ctx) -> bool:
    """A call whose positional arguments read as a PartitionSpec: P(...), or a helper such as
    `shard(t, None, TP)` that passes mesh axes and Nones on to one."""
    if _callee(node) in ("P", "PartitionSpec"):
        return bool(node.args)
    if not isinstance(node, ast.Call) or _callee(node) in COLLECTIVES | {"axis_index"}:
        return False
    return any(isinstance(a, ast.Constant) and a.value is None for a in node.args) and any(
        _resolve_axes(a, ctx) for a in node.args)


def op_spec(node, ctx: Ctx) -> list[Replacement]:
    if not _spec_like(node, ctx):
        return []
    spec_call = _callee(node) in ("P", "PartitionSpec")
    out = []
    for i, arg in enumerate(node.args):
        is_none = isinstance(arg, ast.Constant) and arg.value is None
        if isinstance(arg, ast.Starred) or not (spec_call or is_none or _resolve_axes(arg, ctx)):
            continue
        used = {a for other in node.args if other is not arg for a in (_resolve_axes(other, ctx) or ())}
        free = [ast.Constant(a) for a in ctx.axes if a not in used]  # an axis used twice is a JAX error
        for value in (free if is_none else [ast.Constant(None)]):
            new = copy.deepcopy(node)
            new.args[i] = value
            out.append((ast.unparse(new), new))
    first = 0 if spec_call else 1  # shard(t, *spec): the value is not part of the spec
    for i in range(first, len(node.args) - 1):
        pair = node.args[i:i + 2]
        if ast.dump(pair[0]) != ast.dump(pair[1]) and not any(isinstance(a, ast.Starred) for a in pair):
            new = copy.deepcopy(node)
            new.args[i], new.args[i + 1] = new.args[i + 1], new.args[i]
            out.append((ast.unparse(new), new))
    return out


OPERATORS: dict[str, Callable[[ast.AST, Ctx], list[Replacement]]] = {
    "int+-1": op_int_pm1,
    "arith-swap": op_arith,
    "operand-swap": op_operands,
    "compare": op_compare,
    "drop-collective": op_drop_collective,
    "collective-kind": op_collective_kind,
    "axis-name": op_axis_name,
    "kwarg": op_kwarg,
    "slice-start": op_slice_start,
    "axis-index": op_axis_index,
    "concat-swap": op_concat_swap,
    "arg-swap": op_arg_swap,
    "return-swap": op_return_swap,
    "perm": op_perm,
    "partition-spec": op_spec,
}
# A mutant that JAX's replication (vma) check rejects is retried with the check turned off,
# which is how such a bug ships in real code (zoo: mesh2d-psum-wrong-axis).
NOCHECK_MARK = "+check_vma=False"


# --- the distributed code, isolated from the reference ---------------------------------------------


def _top_functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _called_names(fn: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def isolate(tree: ast.Module, dist: str) -> list[ast.FunctionDef]:
    """Clone every module-level function reachable from `dist` (in place, right after its original)
    and point `dist` and the clones at the clones. Returns [dist, clones...]: the code a mutant may
    change without changing the reference, even when both call the same helper."""
    funcs = _top_functions(tree)
    if dist not in funcs:
        raise KeyError(f"no top-level function {dist!r}")
    reach, todo = [], [dist]
    while todo:
        name = todo.pop(0)
        for callee in sorted(_called_names(funcs[name]) & funcs.keys()):
            if callee != dist and callee not in reach:
                reach.append(callee)
                todo.append(callee)
    clones = {}
    for name in reach:
        clone = copy.deepcopy(funcs[name])
        clone.name = name + CLONE_SUFFIX
        clones[name] = clone
        tree.body.insert(tree.body.index(funcs[name]) + 1, clone)
    targets = [funcs[dist], *clones.values()]
    for fn in targets:
        for n in ast.walk(fn):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in clones:
                n.id += CLONE_SUFFIX
    return targets


def _module_consts(tree: ast.Module) -> dict[str, str]:
    """Module-level string constants: `TP = "tp"` and `DP, TP = "dp", "tp"`."""
    out = {}
    for n in tree.body:
        if not isinstance(n, ast.Assign):
            continue
        for t in n.targets:
            pairs = [(t, n.value)]
            if isinstance(t, ast.Tuple) and isinstance(n.value, ast.Tuple) and len(t.elts) == len(n.value.elts):
                pairs = list(zip(t.elts, n.value.elts))
            for name, value in pairs:
                if isinstance(name, ast.Name) and isinstance(value, ast.Constant) and isinstance(value.value, str):
                    out[name.id] = value.value
    return out


def _ctx(tree: ast.Module, fn: ast.AST, axes: tuple[str, ...]) -> Ctx:
    kw_values = frozenset(id(k.value) for n in ast.walk(fn) if isinstance(n, ast.Call) for k in n.keywords)
    return Ctx(axes, _module_consts(tree), kw_values)


def _replace(root: ast.AST, old: ast.AST, new: ast.AST) -> None:
    for parent in ast.walk(root):
        for field, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, field, new)
                return
            if isinstance(value, list) and any(item is old for item in value):
                value[[i for i, item in enumerate(value) if item is old][0]] = new
                return
    raise ValueError("node not found under its function")


def _disable_vma_check(targets: Iterable[ast.FunctionDef]) -> None:
    for fn in targets:
        for n in ast.walk(fn):
            if _callee(n) == "shard_map":
                n.keywords = [k for k in n.keywords if k.arg not in ("check_vma", "check_rep")]
                n.keywords.append(ast.keyword("check_vma", ast.Constant(False)))


@dataclasses.dataclass(frozen=True)
class Site:
    op: str
    func: str  # the (cloned) function holding the node
    node_index: int  # position in ast.walk(func)
    variant: int
    line: int  # of the node, in the original file
    change: str  # "before -> after", for the table


def mutant_source(source: str, dist: str, axes: tuple[str, ...], site: Site | None, nocheck: bool = False) -> str:
    """The module with its distributed code isolated and (if `site`) one mutation applied."""
    tree = ast.parse(source)
    targets = isolate(tree, dist)
    if site is not None:
        fn = next(t for t in targets if t.name == site.func)
        node = list(ast.walk(fn))[site.node_index]
        _, new = OPERATORS[site.op](node, _ctx(tree, fn, axes))[site.variant]
        _replace(fn, node, new)
    if nocheck:
        _disable_vma_check(targets)
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def _short(text: str, n: int = 70) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _change(before: str, after: str, context: int = 12) -> str:
    """`before -> after` cut down to the part that differs, with a little context."""
    p = 0
    while p < min(len(before), len(after)) and before[p] == after[p]:
        p += 1
    s = 0
    while s < min(len(before), len(after)) - p and before[-1 - s] == after[-1 - s]:
        s += 1
    lo = max(0, p - context)

    def cut(t: str) -> str:
        hi = min(len(t), len(t) - s + context)
        return ("..." if lo else "") + t[lo:hi] + ("..." if hi < len(t) else "")

    return f"{cut(before)} -> {cut(after)}"


def enumerate_sites(source: str, dist: str, axes: tuple[str, ...]) -> list[Site]:
    """Every mutation of the distributed code, without duplicates (two sites giving the same
    module text keep the first)."""
    tree = ast.parse(source)
    baseline = mutant_source(source, dist, axes, None)
    out, seen = [], {baseline}
    for fn in isolate(tree, dist):
        ctx = _ctx(tree, fn, axes)
        for idx, node in enumerate(ast.walk(fn)):
            for op, fun in OPERATORS.items():
                for v, (after, _) in enumerate(fun(node, ctx)):
                    site = Site(op, fn.name, idx, v, getattr(node, "lineno", 0),
                                _change(ast.unparse(node), after))
                    text = mutant_source(source, dist, axes, site)
                    if text not in seen:
                        seen.add(text)
                        out.append(site)
    return out


def sample_sites(sites: list[Site], cap: int, seed: str) -> list[Site]:
    """Up to `cap` sites, deterministic for `seed`, spread over the operators (round robin over
    shuffled per-operator lists) so that rare operators are not crowded out by `int+-1`."""
    rng = random.Random(seed)
    by_op: dict[str, list[Site]] = collections.defaultdict(list)
    for s in sites:
        by_op[s.op].append(s)
    queues = []
    for op in sorted(by_op):
        group = by_op[op][:]
        rng.shuffle(group)
        queues.append(group)
    rng.shuffle(queues)
    picked = []
    while len(picked) < cap and any(queues):
        for q in queues:
            if q and len(picked) < cap:
                picked.append(q.pop())
    return picked


# --- a workspace: mutant files next to a copy of the examples, one manifest -------------------------


@dataclasses.dataclass
class Mutant:
    name: str  # manifest model name
    base: str  # the correct model it mutates
    site: Site | None  # None: the control (isolated, unmutated)
    dist_file: Path  # absolute, in the workspace
    source: str
    baseline: str  # the isolated, unmutated module (for the diff)
    nocheck: bool = False
    oracle: NumericComparison | None = None
    oracle_error: str = ""
    status: str = ""  # the tool's verdict, "" if not run
    finding: str = ""

    @property
    def op(self) -> str:
        return "(control)" if self.site is None else self.site.op + (NOCHECK_MARK if self.nocheck else "")

    @property
    def oracle_verdict(self) -> str:
        if self.oracle is None:
            return "fail"
        return "equal" if self.oracle.equal else "different"

    def diff(self) -> str:
        rel = self.dist_file.name
        lines = difflib.unified_diff(self.baseline.splitlines(), self.source.splitlines(), rel, rel + " (mutant)", n=1, lineterm="")
        return "\n".join(lines)


def correct_cases(models: list[str] | None) -> list[Case]:
    chosen = [c for c in cases(CORRECT_MANIFESTS) if c.verdict == "equivalent"]
    if models:
        unknown = set(models) - {c.name for c in chosen}
        if unknown:
            raise SystemExit(f"mutants: no correct model named {', '.join(sorted(unknown))}; "
                             f"choose from {', '.join(c.name for c in chosen)}")
        chosen = [c for c in chosen if c.name in models]
    return chosen


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in text)


def build_mutants(case: Case, work: Path, cap: int, seed: int) -> list[Mutant]:
    """The control and up to `cap` mutants of one model, in the sampled order."""
    dist = case.model.distributed
    src_file = dist.file
    source = src_file.read_text()
    axes = tuple(name for name, _ in case.model.mesh)
    folder = work / src_file.parent.relative_to(REPO)
    baseline = mutant_source(source, dist.function, axes, None)
    sites = sample_sites(enumerate_sites(source, dist.function, axes), cap, f"{seed}:{case.name}")
    out = []
    for k, site in enumerate([None, *sites]):
        name = f"{case.name}.m{k:02d}" if site else f"{case.name}.control"
        path = folder / f"_mut_{_slug(name)}.py"
        text = mutant_source(source, dist.function, axes, site)
        out.append(Mutant(name, case.name, site, path, text, baseline))
    return out


def write_workspace(work: Path, muts: list[Mutant], by_base: dict[str, Case]) -> Path:
    """Write the mutant files and a manifest whose reference and inputs are the untouched
    originals (copied along with the examples) and whose distributed entrypoints are the mutants."""
    models = []
    for m in muts:
        m.dist_file.write_text(m.source)
        spec = by_base[m.base].model

        def rel(path: Path) -> str:
            return path.relative_to(REPO).as_posix()

        models.append({
            "name": m.name,
            "reference": f"{rel(spec.reference.file)}:{spec.reference.function}",
            "distributed": f"{m.dist_file.relative_to(work).as_posix()}:{spec.distributed.function}",
            "inputs": f"{rel(spec.inputs.file)}:{spec.inputs.function}",
            "mesh": dict(spec.mesh),
        })
    manifest = work / "mutants.yaml"
    manifest.write_text(yaml.safe_dump({"version": 1, "models": models}, sort_keys=False))
    return manifest


# --- running the oracle and the verifier -------------------------------------------------------------


def _is_vma_rejection(message: str) -> bool:
    text = message.lower()
    return "vma" in text or "check_rep" in text or "varying" in text or "replicat" in text


def run_oracle(manifest: Path, muts: list[Mutant], seeds=SEEDS, timeout: float = 600, workers: int = SHARDS) -> None:
    """Oracle verdicts, one child per base model (`workers` at once); a batch whose child dies or
    times out is rerun one mutant per child, so one runaway mutant does not hide the others."""
    groups: dict[str, list] = collections.defaultdict(list)
    for m in muts:
        groups[m.base].append(m)

    def judge_group(group: list) -> None:
        res = compare_many_in_child(manifest, [m.name for m in group], seeds, timeout)
        for m in group:
            r = res[m.name]
            if isinstance(r, EquivciError) and "numeric check" in str(r) and len(group) > 1:
                r = compare_many_in_child(manifest, [m.name], seeds, timeout / 4)[m.name]
            if isinstance(r, NumericComparison):
                m.oracle, m.oracle_error = r, ""
            else:
                m.oracle, m.oracle_error = None, str(r)

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:  # each group is a JAX child process
        list(pool.map(judge_group, groups.values()))


def run_verifier(manifest: Path, muts: list[Mutant], verify_timeout: float, batch: int = 16) -> None:
    """`equivci verify` on the mutants, `batch` at a time, each batch in parallel shards."""
    env = dict(os.environ, EQUIVCI_VERIFY_TIMEOUT=str(verify_timeout))
    env.setdefault("EQUIVCI_VERIFY_MEMORY", str(6 * 2**30))  # the machine is shared
    for start in range(0, len(muts), batch):
        chunk = muts[start:start + batch]
        try:
            run = verify_json(manifest, [m.name for m in chunk], cwd=manifest.parent, env=env, args=["--no-cache"],
                              timeout=verify_timeout * len(chunk) + 120)
        except subprocess.TimeoutExpired as exc:
            for m in chunk:
                m.status, m.finding = "crash", f"equivci verify produced no report: {type(exc).__name__}"
            continue
        for m in chunk:
            r = run.models.get(m.name)
            if r is None:
                m.status, m.finding = "crash", f"missing from the report: {_short(run.stderr.strip()[-400:], 200)}"
                continue
            m.status = r["status"]
            errors = [f for f in r["findings"] if f.get("severity") == "error"]
            m.finding = _short(errors[0]["message"], 200) if errors else ""


def keep_runnable(muts: list[Mutant], cap: int) -> list[Mutant]:
    """Per model, in the sampled order: the control, then mutants until `cap` of them run under
    JAX (the ones that do not, up to that point, are kept and counted as no-run)."""
    out, ran = [], collections.Counter()
    for m in muts:
        if m.site is None or ran[m.base] < cap:
            out.append(m)
            ran[m.base] += m.site is not None and m.oracle is not None
    return out


def sweep(models: list[str] | None, max_per_model: int, seed: int, work: Path, verify_timeout: float,
          log=print) -> list[Mutant]:
    """Build, oracle-check and verify the mutants; returns them with their verdicts."""
    chosen = correct_cases(models)
    by_base = {c.name: c for c in chosen}
    shutil.copytree(REPO / "examples", work / "examples", dirs_exist_ok=True)
    # About half of the mutants do not run under JAX (shape and type errors); over-generate, so
    # that each model keeps up to `max_per_model` mutants that do.
    muts = [m for c in chosen for m in build_mutants(c, work, CANDIDATES_PER_KEPT * max_per_model, seed)]
    manifest = write_workspace(work, muts, by_base)
    t0 = time.perf_counter()
    run_oracle(manifest, muts)
    retry = [m for m in muts if m.oracle is None and _is_vma_rejection(m.oracle_error) and m.site is not None]
    first_try = {m.name: (m.source, m.oracle_error) for m in retry}
    for m in retry:
        case = by_base[m.base]
        axes = tuple(n for n, _ in case.model.mesh)
        m.nocheck = True
        m.source = mutant_source(case.model.distributed.file.read_text(), case.model.distributed.function, axes, m.site, nocheck=True)
    if retry:
        write_workspace(work, muts, by_base)
        run_oracle(manifest, retry)
    for m in retry:
        if m.oracle is None:  # still rejected without the check: it is the first error that counts
            m.nocheck = False
            m.source, m.oracle_error = first_try[m.name]
    built = len(muts)
    muts = keep_runnable(muts, max_per_model)
    log(f"mutants: {built} built over {len(chosen)} models, oracle in {time.perf_counter() - t0:.0f} s "
        f"({len(retry)} retried with check_vma=False); {len(muts)} kept")
    t0 = time.perf_counter()
    runnable = [m for m in muts if m.oracle is not None]
    run_verifier(manifest, runnable, verify_timeout)
    log(f"mutants: {len(runnable)} verified with equivci in {time.perf_counter() - t0:.0f} s")
    return muts


# --- figures ---------------------------------------------------------------------------------------------

COLUMNS = ("n", "no-run", "or-diff", "or-eq", "verified", "mismatch", "unproven", "error", "UNSOUND", "eq-gap", "false-mm")


def is_unsound(m: Mutant) -> bool:
    return m.oracle_verdict == "different" and m.status == "verified"


def row(muts: list[Mutant]) -> dict[str, int]:
    run = [m for m in muts if m.oracle is not None]
    return {
        "n": len(muts),
        "no-run": len(muts) - len(run),
        "or-diff": sum(m.oracle_verdict == "different" for m in run),
        "or-eq": sum(m.oracle_verdict == "equal" for m in run),
        "verified": sum(m.status == "verified" for m in run),
        "mismatch": sum(m.status == "mismatch" for m in run),
        "unproven": sum(m.status == "unproven" for m in run),
        "error": sum(m.status in ("error", "crash") for m in run),
        "UNSOUND": sum(is_unsound(m) for m in run),
        "eq-gap": sum(m.oracle_verdict == "equal" and m.status != "verified" for m in run),
        "false-mm": sum(m.oracle_verdict == "equal" and m.status == "mismatch" for m in run),
    }


def table(muts: list[Mutant]) -> str:
    ops: dict[str, list[Mutant]] = collections.defaultdict(list)
    for m in muts:
        ops[m.op].append(m)
    width = max([len(k) for k in ops] + [10])
    lines = [f"{'operator':<{width}} " + " ".join(f"{c:>8}" for c in COLUMNS)]
    for name in sorted(ops) + ["ALL (no control)"]:
        group = ops[name] if name in ops else [m for m in muts if m.site is not None]
        r = row(group)
        lines.append(f"{name:<{width}} " + " ".join(f"{r[c]:>8}" for c in COLUMNS))
    return "\n".join(lines)


def describe(m: Mutant) -> str:
    where = f"{m.base}: {m.site.op} at line {m.site.line} of the original, {m.site.change}" if m.site else f"{m.base}: control"
    oracle = m.oracle.describe() if m.oracle else m.oracle_error
    return f"{m.name} [{m.status or 'not run'}] {where}\n    oracle: {_short(oracle, 160)}" + (
        f"\n    equivci: {m.finding}" if m.finding else "")


def report(muts: list[Mutant], out=print, verbose: bool = False) -> int:
    out(table(muts))
    unsound = [m for m in muts if is_unsound(m)]
    checked = sum(m.oracle_verdict == "different" and m.status not in ("", "crash") for m in muts)
    out("")
    if unsound:
        out(f"UNSOUND: {len(unsound)} oracle-different mutants reported verified")
        for m in unsound:
            out(describe(m))
            out(m.diff())
    else:
        out(f"UNSOUND: none found, {checked} oracle-different mutants checked")
    sections = [
        ("controls not verified (harness problem)", lambda m: m.site is None and m.status != "verified"),
        ("oracle-equal but reported mismatch (a mismatch needs a counterexample)",
         lambda m: m.oracle_verdict == "equal" and m.status == "mismatch"),
        ("oracle-equal but not verified (completeness)", lambda m: m.oracle_verdict == "equal" and m.status not in ("verified", "mismatch")),
        ("runs under JAX but equivci errors or crashes", lambda m: m.oracle is not None and m.status in ("error", "crash")),
    ]
    if verbose:
        sections.append(("oracle-equal and verified", lambda m: m.oracle_verdict == "equal" and m.status == "verified"))
        sections.append(("JAX rejects (skipped)", lambda m: m.oracle is None))
    for title, pred in sections:
        chosen = [m for m in muts if pred(m)]
        if chosen:
            out(f"\n{title}: {len(chosen)}")
            for m in chosen:
                out(describe(m))
    return 1 if unsound else 0


# --- hand-written probes: differences the oracle cannot see -----------------------------------------

PROBES = REPO / "configs" / "probes.yaml"
PROBES_EQUIVALENT = {"loop-dp"}  # the control; every other probe differs from its reference


@dataclasses.dataclass
class Probe:
    name: str
    base: str = "probes"  # one oracle child for all of them
    oracle: NumericComparison | None = None
    oracle_error: str = ""
    status: str = ""
    finding: str = ""

    @property
    def unsound(self) -> bool:
        return self.status == "verified" and self.name not in PROBES_EQUIVALENT


def run_probes(verify_timeout: float, manifest: Path = PROBES, oracle: bool = True) -> list[Probe]:
    """`oracle`: also label each probe with the numeric oracle's verdict (the report's column only:
    the verdicts, and whether a probe is unsound, never depend on it)."""
    probes = [Probe(m["name"]) for m in yaml.safe_load(manifest.read_text())["models"]]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # both at once
        labels = pool.submit(run_oracle, manifest, probes) if oracle else None
        run_verifier(manifest, probes, verify_timeout)
        if labels is not None:
            labels.result()
    return probes


def probe_report(probes: list[Probe], out=print) -> int:
    out(f"{'probe':<40} {'oracle':>9} {'equivci':>9}  (only {', '.join(sorted(PROBES_EQUIVALENT))} may be verified)")
    for p in probes:
        oracle = ("fail" if p.oracle_error else "-") if p.oracle is None else "equal" if p.oracle.equal else "different"
        out(f"{p.name:<40} {oracle:>9} {p.status:>9}{'  UNSOUND' if p.unsound else ''}")
    return 1 if any(p.unsound for p in probes) else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", help="comma-separated correct model names (default: all of zoo.yaml and equivci.yaml)")
    p.add_argument("--max-per-model", type=int, default=10, help="mutants per model that run under JAX")
    p.add_argument("--seed", type=int, default=0, help="picks which mutants of each model are run")
    p.add_argument("--verify-timeout", type=float, default=120, help="EQUIVCI_VERIFY_TIMEOUT per model")
    p.add_argument("--keep", type=Path, help="write the workspace here (kept) instead of a temporary folder")
    p.add_argument("--json", type=Path, help="also write every mutant's verdicts here")
    p.add_argument("--verbose", action="store_true", help="also list verified oracle-equal and skipped mutants")
    p.add_argument("--probes", action="store_true", help=f"also run the hand-written probes of {PROBES.relative_to(REPO)}")
    p.add_argument("--only-probes", action="store_true", help="run the probes, no mutants")
    opts = p.parse_args(argv)
    t0 = time.perf_counter()
    status, muts = 0, []
    if not opts.only_probes:
        models = [s for s in opts.models.split(",") if s] if opts.models else None
        with tempfile.TemporaryDirectory(prefix="equivci-mutants-") as tmp:
            work = opts.keep or Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            muts = sweep(models, opts.max_per_model, opts.seed, work, opts.verify_timeout)
        status = report(muts, verbose=opts.verbose)
    if opts.probes or opts.only_probes:
        print()
        status |= probe_report(run_probes(opts.verify_timeout))
    if opts.json:
        opts.json.write_text(json.dumps([{
            "name": m.name, "base": m.base, "op": m.op, "change": m.site.change if m.site else None,
            "line": m.site.line if m.site else None, "oracle": m.oracle_verdict,
            "oracle_detail": m.oracle.describe() if m.oracle else m.oracle_error,
            "status": m.status, "finding": m.finding,
        } for m in muts], indent=1))
    print(f"\nwall time {time.perf_counter() - t0:.0f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
