"""The caller's choice: where a helper's behaviour is set by a static argument of its call.

A helper parameterized by a plain Python value (an axis name, a flag, a callback, a reduction)
computes what its caller asks for. When the op where the programs part depends on such a parameter
and another call of the same helper passes a different value, the reviewer's line is the call that
passes this one: the helper's body runs as written for both calls. The search follows the names the
op's statement reads back through assignments and parameters, up the calls seen on the op stacks.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from equivci.diagnose.frames import in_repository
from equivci.diagnose.localize import _assigned_at, _call_argument, _callee, _module_ast, _parameters, _statement
from equivci.hlo.ir import Instruction
from equivci.translate.evaluator import Event

MAX_NAMES = 40  # names followed back from the op's statement, over every level
MAX_CALLS = 4  # calls followed up from the op's function


@dataclasses.dataclass(frozen=True)
class Choice:
    """`text` is passed at file:line as `parameter` of `function`; `others` are other calls of it
    (file, line, what they pass)."""

    file: str
    line: int
    text: str
    parameter: str
    function: str
    others: tuple[tuple[str, int, str], ...]


def passed_choice(inst: Instruction, events: list[Event], repo_root: str) -> Choice | None:
    """The static argument the op depends on, passed where another call of its helper passes another."""
    root = Path(repo_root).resolve()
    loc = next((f for f in inst.stack if in_repository(f, root)), None)
    found = _statement(loc.file, loc.line) if loc is not None else None
    if loc is None or found is None:
        return None
    budget = [MAX_NAMES]
    return _search(loc.file, loc.line, [found[0]], events, budget, MAX_CALLS)


def _search(file: str, line: int, exprs: list[ast.AST], events: list[Event], budget: list[int], calls: int):
    found = _statement(file, line)
    if found is None:
        return None
    funcs = found[1]
    queue, seen = _names(exprs), set[str]()
    while queue and budget[0] > 0:
        name, at = queue.pop(0)
        if name in seen:
            continue
        seen.add(name)
        budget[0] -= 1
        for func in reversed(funcs):
            assigned = _assigned_at(func, name, at)
            if assigned is not None:
                bound = _statement(file, assigned)
                value = getattr(bound[0], "value", None) if bound else None
                queue.extend((n, assigned) for n, _ in _names([value] if value is not None else []))
                break
            if name in _parameters(func):
                site = _call_argument(file, func, name, events)
                if site is not None:
                    choice = _choice(site[0], site[1], func, name, file)
                    if choice is not None:
                        return choice
                    if calls > 0:
                        deeper = _search(site[0], site[1].lineno, [site[1]], events, budget, calls - 1)
                        if deeper is not None:
                            return deeper
                break
            if _defines(func, name):
                break
    return None


def _names(exprs: list[ast.AST]) -> list[tuple[str, int]]:
    """The names read in `exprs`, in source order, with the line they are read at."""
    found = [n for e in exprs for n in ast.walk(e) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
    return [(n.id, n.lineno) for n in sorted(found, key=lambda n: (n.lineno, n.col_offset))]


def _defines(func: ast.AST, name: str) -> bool:
    """`name` is local to `func` without a plain assignment (a nested def, a loop or with target)."""
    for node in ast.walk(func):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store):
            return True
    return False


def _choice(file: str, arg: ast.expr, func: ast.FunctionDef | ast.AsyncFunctionDef, name: str, func_file: str):
    """A Choice when `arg`, passed at `file` for parameter `name` of `func`, is a static value and
    another call of `func` passes a different one."""
    if not _static(file, arg):
        return None
    mine = ast.dump(arg)
    others = []
    for other_file, line, other in _other_arguments(func, name, func_file, file):
        if other is not None and ast.dump(other) != mine and line != arg.lineno:
            others.append((other_file, line, ast.unparse(other)))
    if not others:
        return None
    return Choice(file, arg.lineno, ast.unparse(arg), name, func.name, tuple(others))


def _static(file: str, arg: ast.expr) -> bool:
    """A value fixed when the program is written: a literal, a lambda, or built from module-level
    names (a function, a constant) and literals, not from the caller's local values."""
    if isinstance(arg, (ast.Constant, ast.Lambda)):
        return True
    if isinstance(arg, ast.Attribute):
        return _static(file, arg.value)
    if isinstance(arg, ast.Name):
        found = _statement(file, arg.lineno)
        funcs = found[1] if found else []
        return not any(_defines(f, arg.id) or arg.id in _parameters(f) for f in funcs) and not (
            found is not None and _lambda_parameter(found[0], arg)
        )
    if isinstance(arg, ast.UnaryOp):
        return _static(file, arg.operand)
    if isinstance(arg, ast.BinOp):
        return _static(file, arg.left) and _static(file, arg.right)
    if isinstance(arg, (ast.Tuple, ast.List)):
        return all(_static(file, e) for e in arg.elts)
    return False


def _lambda_parameter(stmt: ast.stmt, name: ast.Name) -> bool:
    """`name` is a parameter of a lambda in `stmt` that contains it: a value each call of the
    lambda receives, not one fixed when the program is written."""
    return any(
        isinstance(node, ast.Lambda)
        and name.id in {a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs}
        and any(inner is name for inner in ast.walk(node.body))
        for node in ast.walk(stmt)
    )


def _other_arguments(func: ast.FunctionDef | ast.AsyncFunctionDef, name: str, *files: str):
    """(file, line, argument) for parameter `name` at every call of `func` (direct, or bound by
    functools.partial) in `files`; a call that leaves it out passes the default."""
    positional = [a.arg for a in func.args.posonlyargs + func.args.args]
    defaults = dict(zip(positional[len(positional) - len(func.args.defaults) :], func.args.defaults))
    defaults.update({a.arg: d for a, d in zip(func.args.kwonlyargs, func.args.kw_defaults) if d is not None})
    for file in dict.fromkeys(files):
        tree = _module_ast(file)
        for node in ast.walk(tree) if tree is not None else ():
            if not isinstance(node, ast.Call):
                continue
            args = node.args
            partial = _callee(node) == "partial" and bool(args) and getattr(args[0], "id", None) == func.name
            if partial:
                args = args[1:]  # a partial that leaves the parameter out binds nothing
            elif _callee(node) != func.name:
                continue
            keyword = next((k.value for k in node.keywords if k.arg == name), None)
            k = positional.index(name) if name in positional else len(args)
            if any(isinstance(a, ast.Starred) for a in args[: k + 1]):
                continue
            default = None if partial else defaults.get(name)
            value = keyword if keyword is not None else args[k] if k < len(args) else default
            yield file, node.lineno, value
