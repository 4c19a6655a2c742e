"""Reading the user's source: the statement at an op's line, its enclosing functions, the
assignments and call arguments a name goes back to. Shared by the localizer and the search for
the caller's choice (equivci.diagnose.arguments)."""

from __future__ import annotations

import ast
import builtins
import functools
from pathlib import Path

from equivci.hlo.ir import SourceLoc
from equivci.translate.evaluator import Event


@functools.lru_cache(maxsize=64)
def module_ast(file: str) -> ast.Module | None:
    try:
        return ast.parse(Path(file).read_text())
    except (OSError, SyntaxError, ValueError):
        return None


@functools.lru_cache(maxsize=1024)
def calls_in(tree: ast.AST) -> tuple[ast.Call, ...]:
    """Every call under `tree` (a module's, a function's), in `ast.walk` order. Cached by the node
    itself (ASTs hash by identity): the searches for a caller's choice asked for a module's calls
    once per name they followed, 26 s of a 51 s mismatch."""
    return tuple(n for n in ast.walk(tree) if isinstance(n, ast.Call))


Function = ast.FunctionDef | ast.AsyncFunctionDef


def statement(file: str, line: int) -> tuple[ast.stmt, list[Function]] | None:
    """The innermost simple statement spanning `line`, with its enclosing function chain."""
    tree = module_ast(file)
    if tree is None:
        return None
    best: ast.stmt | None = None
    chain: list[Function] = []

    def visit(node: ast.AST, funcs: list[Function]) -> None:
        nonlocal best, chain
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, ast.stmt) or not (child.lineno <= line <= (child.end_lineno or child.lineno)):
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, funcs + [child])
            elif hasattr(child, "body") and isinstance(getattr(child, "body"), list):
                visit(child, funcs)
            else:
                best, chain = child, funcs

    visit(tree, [])
    return (best, chain) if best is not None else None


def callee(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


# Transformations that return the function they are given, wrapped: calling what they return at
# once calls that function with the same arguments, bound to the same parameters.
WRAPPERS = {"shard_map", "jit", "checkpoint", "remat", "vmap"}


def calls_function(call: ast.Call, name: str) -> bool:
    """`call` calls function `name`: by its name, or through a transformation applied to it and
    called at once (`jax.shard_map(body, mesh=mesh, ...)(w, x)`)."""
    inner = call.func
    return callee(call) == name or (
        isinstance(inner, ast.Call)
        and callee(inner) in WRAPPERS
        and bool(inner.args)
        and isinstance(inner.args[0], ast.Name)
        and inner.args[0].id == name
    )


def parameters(func: Function) -> list[str]:
    args = func.args
    return [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]


def positional_arguments(func: Function, call: ast.Call, skip: int = 0) -> dict[str, ast.expr]:
    """The positional arguments of `call` by the parameter of `func` they bind (the first `skip`
    parameters passed otherwise, as `self`). After a starred argument only a call that must bind each
    parameter exactly once tells: where `func` has no defaults and no `*args`, the arguments after the
    last starred one bind the last parameters the keywords leave (`lambda *a: body(*a, axis)`)."""
    names = [a.arg for a in func.args.posonlyargs + func.args.args][skip:]
    args = call.args
    starred = [k for k, a in enumerate(args) if isinstance(a, ast.Starred)]
    if not starred:
        return dict(zip(names, args))
    bound = dict(zip(names, args[: starred[0]]))
    if func.args.defaults or func.args.vararg is not None:
        return bound
    keywords = {k.arg for k in call.keywords}
    if None in keywords:
        return bound  # a `**kwargs` may bind any of them
    filled = [n for n in names if n not in keywords]
    trailing = args[starred[-1] + 1 :]
    if len(trailing) > len(filled):
        return bound
    bound.update(zip(filled[len(filled) - len(trailing) :], trailing))
    return bound


def assigned_at(scope: ast.AST, name: str, before: int) -> int | None:
    """The last line before `before` that assigns `name` inside `scope`."""
    lines = [
        node.lineno
        for node in ast.walk(scope)
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign))
        and node.lineno < before
        and any(
            isinstance(t, ast.Name) and t.id == name
            for tgt in (node.targets if isinstance(node, ast.Assign) else [node.target])
            for t in ast.walk(tgt)
        )
    ]
    return max(lines) if lines else None


def calls_of(found: tuple[ast.stmt, list[Function]], name: str) -> list[ast.Call]:
    """The calls of function `name` in a statement: by its name, else (the function passed in as an
    argument) through a parameter of the statement's function, when that is the only such call."""
    stmt, funcs = found
    calls = [n for n in ast.walk(stmt) if isinstance(n, ast.Call)]
    direct = [n for n in calls if calls_function(n, name)]
    params = {p for f in funcs for p in parameters(f)}
    passed = [n for n in calls if isinstance(n.func, ast.Name) and n.func.id in params]
    return direct or (passed if len(passed) == 1 else [])


def call_argument(
    file: str, func: Function, name: str, events: list[Event], stack: tuple[SourceLoc, ...] = ()
) -> tuple[str, ast.expr] | None:
    """The argument passed for parameter `name` of `func` at a call site seen in the op stacks,
    the one on `stack` (the op's own call chain) first."""

    def calls_from(frames) -> list[tuple[str, int]]:
        return [
            (outer.file, outer.line)
            for inner, outer in zip(frames, frames[1:])
            if inner.file == file
            and inner.function.split(".")[-1] == func.name
            and func.lineno <= inner.line <= (func.end_lineno or func.lineno)
        ]

    own = calls_from(stack)
    others = {site for event in events for site in calls_from(event.inst.stack)} - set(own)
    sites = [(site, False) for site in own + sorted(others)] + [(site, True) for site in _maker(file, func, events)]
    for (cfile, cline), made in sites:
        found = statement(cfile, cline)
        if found is None:
            continue
        calls = _direct_calls(found[0], func.name) if made else calls_of(found, func.name)
        skip = 0
        if not calls and func.name == "__call__":
            # An instance runs its `__call__` when called itself (`blk.attn(x, reduce=r)`), `self` unpassed.
            calls, skip = _instance_calls(found[0], cfile), 1
        for call in calls:
            keyword = next((k.value for k in call.keywords if k.arg == name), None)
            if keyword is not None:
                return cfile, keyword
            if skip and len(calls) > 1:
                continue  # several instances called: no position tells which one runs this `__call__`
            passed = positional_arguments(func, call, skip).get(name)
            if passed is not None:
                return cfile, passed
    return None


def _instance_calls(stmt: ast.stmt, file: str) -> list[ast.Call]:
    """The calls in `stmt` that may call an instance: not of a function or class the file defines at
    module level, nor of a builtin."""
    tree = module_ast(file)
    defined = {
        n.name
        for n in (tree.body if tree is not None else [])
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }
    return [
        n
        for n in ast.walk(stmt)
        if isinstance(n, ast.Call)
        and not (isinstance(n.func, ast.Name) and (n.func.id in defined or n.func.id in dir(builtins)))
    ]


def _maker(file: str, func: Function, events: list[Event]) -> list[tuple[str, int]]:
    """The one statement on the op stacks that calls `func` by name, when `func` made a closure
    that ran (a step built by a factory and run later by shard_map or a loop): the call that made it
    is on no stack of the closure's ops, which end at the closure."""
    closure = f"{func.name}.<locals>."
    end = func.end_lineno or func.lineno
    frames = {(loc.file, loc.line, loc.function) for event in events for loc in event.inst.stack}
    if not any(f == file and closure in name and func.lineno <= line <= end for f, line, name in frames):
        return []
    sites = []
    for f, line, _ in sorted(frames):
        found = statement(f, line)
        if found and _direct_calls(found[0], func.name):
            sites.append((f, found[0].lineno))
    unique = sorted(set(sites))
    return unique if len(unique) == 1 else []


def _direct_calls(stmt: ast.stmt, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(stmt) if isinstance(n, ast.Call) and calls_function(n, name)]
