"""A reduction left out by the caller's choice: an identity passed where another call all-reduces.

A helper that takes its reduction as a callable (`reduce_grads(grads)`, `x + attn_reduce(out)`)
all-reduces a partial sum only when its caller passes a callable that does. When numerics shows a
value to be a partial sum over a mesh axis that is used as the full value (equivci.diagnose.numeric),
and a statement on the partial sum's or its use's call chain applies a callable parameter, and the
call that sets it passes a function that returns its argument unchanged (`lambda g: g`, a
`def f(t): return t`) where another call of the same helper passes one that all-reduces over that
axis, then no line of the helper is wrong: the reviewer changes the argument of that call. An
identity passed where no other call all-reduces over the partial sum's axis says nothing (a
pipeline stage on a mesh without a tensor axis has nothing to reduce).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from equivci.diagnose.arguments import MAX_CALLS, Choice, search_from
from equivci.diagnose.frames import in_repository
from equivci.diagnose.source import Function, callee, module_ast, parameters, statement
from equivci.hlo.ir import Instruction
from equivci.translate.evaluator import Event

# Collectives that sum over an axis (an all-gather after a reduce-scatter completes it too).
REDUCING = {"psum", "pmean", "psum_scatter", "all_reduce", "reduce_scatter"}


@dataclasses.dataclass(frozen=True)
class SkippedReduce:
    """`choice` passes an identity; `reducing` is what another call passes instead, at file:line."""

    choice: Choice
    reducing: tuple[str, int, str]


def skipped_reduce(
    summed: Instruction,
    use: Instruction,
    axis: str,
    events: list[Event],
    repo_root: str,
    entry: tuple[str, str] | None,
    foreign: tuple[tuple[str, str], ...] = (),
    reference_runs: frozenset[str] = frozenset(),
) -> SkippedReduce | None:
    """The call that passes an identity for a callable applied on `summed`'s or `use`'s call chain,
    where another call of that helper passes one that reduces over `axis` (mesh axes joined by ",")."""
    root = Path(repo_root).resolve()
    axes = set(axis.split(","))
    for inst in (use, summed):
        for loc in (f for f in inst.stack if in_repository(f, root)):
            found = statement(loc.file, loc.line)
            if found is None or not found[1]:
                continue
            stmt, funcs = found
            names = {p for f in funcs for p in parameters(f)}
            applied = [
                n.func
                for n in ast.walk(stmt)
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in names
            ]
            for name in applied:
                for choice in search_from(
                    events, inst.stack, entry, foreign, reference_runs, loc.file, loc.line, [name], MAX_CALLS
                ):
                    if not _identity(choice.file, choice.text):
                        continue
                    reducing = next((other for other in choice.others if _reduces(other[0], other[2], axes)), None)
                    if reducing is not None:
                        return SkippedReduce(choice, reducing)
    return None


def _callable(file: str, text: str) -> ast.Lambda | Function | None:
    """The lambda `text` is, or the module-level function of `file` it names."""
    try:
        expr = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    if isinstance(expr, ast.Lambda):
        return expr
    if isinstance(expr, ast.Name):
        tree = module_ast(file)
        return next(
            (
                n
                for n in (tree.body if tree is not None else [])
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == expr.id
            ),
            None,
        )
    return None


def _identity(file: str, text: str) -> bool:
    """`text` is a callable of one parameter that returns it unchanged."""
    func = _callable(file, text)
    if func is None or len(func.args.args) != 1 or func.args.vararg or func.args.kwonlyargs:
        return False
    name = func.args.args[0].arg
    if isinstance(func, ast.Lambda):
        return isinstance(func.body, ast.Name) and func.body.id == name
    body = func.body[1:] if ast.get_docstring(func) is not None else func.body
    return (
        len(body) == 1
        and isinstance(body[0], ast.Return)
        and isinstance(body[0].value, ast.Name)
        and body[0].value.id == name
    )


def _reduces(file: str, text: str, axes: set[str]) -> bool:
    """`text` is a callable whose body sums over one of `axes` (a literal axis name)."""
    func = _callable(file, text)
    if func is None:
        return False
    return any(
        isinstance(n, ast.Call)
        and callee(n) in REDUCING
        and any(
            isinstance(c, ast.Constant) and c.value in axes
            for a in list(n.args[1:]) + [k.value for k in n.keywords if k.arg in ("axis_name", None)]
            for c in ast.walk(a)
        )
        for n in ast.walk(func)
    )
