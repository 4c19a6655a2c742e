"""Where a helper passed by name departs from the one another call passes in its place.

When one call passes `_route_raw` where another passes `_route`, the two functions answer the same
call; the statements they share compute the same, so the change that makes this call's result differ
is at the first statement of its body that the other lacks or writes otherwise (a division left out
shows as the `return` that should carry it). Of several others, the one whose body shares the most
statements is compared. Bodies of more than one statement that share none say nothing about each
other: no line.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
from collections.abc import Iterator

from equivci.diagnose.source import Function, module_ast


@dataclasses.dataclass(frozen=True)
class Departure:
    """`function`'s body (in `file`) departs at `line` from `sibling`'s, defined at `sibling_file`:`sibling_line`."""

    file: str
    line: int
    function: str
    sibling: str
    sibling_file: str
    sibling_line: int


def departure(file: str, name: str, others: tuple[tuple[str, int, str], ...]) -> Departure | None:
    """The first statement of module-level function `name` (passed in `file`) that the best-matching
    function among `others` ((file, line, text) passed by the other calls) does not share."""
    own = _module_function(file, name)
    if own is None:
        return None
    mine = _statements(own)
    best: tuple[float, int, str, str, Function] | None = None
    for other_file, _, text in others:
        other = _module_function(other_file, text) if text.isidentifier() and text != name else None
        if other is None:
            continue
        theirs = _statements(other)
        matcher = difflib.SequenceMatcher(None, [k for k, _ in mine], [k for k, _ in theirs], autojunk=False)
        shared = sum(block.size for block in matcher.get_matching_blocks())
        if shared == 0 and max(len(mine), len(theirs)) > 1:
            continue
        line = _first_change(matcher, mine)
        if line is not None and (best is None or matcher.ratio() > best[0]):
            best = (matcher.ratio(), line, other_file, text, other)
    if best is None:
        return None
    _, line, other_file, text, other = best
    return Departure(file, line, name, text, other_file, other.lineno)


def returns_its_argument(file: str, name: str) -> bool:
    """Module-level function `name` returns its one parameter unchanged: it does no work, so no
    statement of it is the change; choosing it (over the function another call passes) is."""
    own = _module_function(file, name)
    if own is None:
        return False
    args = own.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    body = own.body[1:] if ast.get_docstring(own) is not None else own.body
    return (
        len(names) == 1
        and args.vararg is None
        and args.kwarg is None
        and len(body) == 1
        and isinstance(body[0], ast.Return)
        and isinstance(body[0].value, ast.Name)
        and body[0].value.id == names[0]
    )


def one_statement(file: str, name: str) -> int | None:
    """The line of module-level function `name`'s body when that is one `return` (its docstring
    aside): all the function computes is written on that line, whatever op of it a use reads."""
    own = _module_function(file, name)
    if own is None:
        return None
    body = own.body[1:] if ast.get_docstring(own) is not None else own.body
    return body[0].lineno if len(body) == 1 and isinstance(body[0], ast.Return) else None


def _first_change(matcher: difflib.SequenceMatcher, mine: list[tuple[str, int]]) -> int | None:
    """The line of the first statement of `mine` in a differing stretch; a stretch only the other
    function has (work this one lacks) lands on the statement that follows it here, or on the last
    statement when it is at the end."""
    for tag, i1, _, _, _ in matcher.get_opcodes():
        if tag != "equal" and mine:
            return mine[min(i1, len(mine) - 1)][1]
    return None


def _module_function(file: str, name: str) -> Function | None:
    tree = module_ast(file)
    for node in tree.body if tree is not None else ():
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None


def _statements(func: Function) -> list[tuple[str, int]]:
    """The body's statements in source order, each as (its text without line numbers, its line); a
    compound statement stands for its header, its body's statements follow it. The docstring is left out."""
    return list(_walk(func.body[1:] if ast.get_docstring(func) is not None else func.body))


def _walk(body: list[ast.stmt]) -> Iterator[tuple[str, int]]:
    for stmt in body:
        nested = [field for field in ("body", "orelse", "finalbody") if isinstance(getattr(stmt, field, None), list)]
        if not nested:
            yield ast.dump(stmt), stmt.lineno
            continue
        yield (
            type(stmt).__name__
            + ":"
            + "|".join(
                ast.dump(value)
                for field, value in ast.iter_fields(stmt)
                if field not in nested and isinstance(value, ast.AST)
            ),
            stmt.lineno,
        )
        for field in nested:
            yield from _walk(getattr(stmt, field))
