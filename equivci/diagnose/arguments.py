"""The caller's choice: where a helper's behaviour is set by a static argument of its call.

A helper parameterized by a plain Python value (an axis name, a flag, a callback, a reduction)
computes what its caller asks for. When the op where the programs part depends on such a parameter
and another call of the same helper passes a different value, the reviewer's line is the call that
passes this one: the helper's body runs as written for both calls. A function passed by name is the
exception: it is written in its own body, where the reviewer changes it (`made_in`; the statement
where it departs from the one another call passes: equivci.diagnose.siblings). The search follows the
names the op's statement reads back through assignments and parameters, up the calls seen on the op
stacks, and into the functions the entrypoint reaches for a call on no stack (a shard_map body bound
by a partial).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from equivci.diagnose.frames import LAYOUT_OPS, in_repository
from equivci.diagnose.source import (
    Function,
    assigned_at,
    call_argument,
    callee,
    calls_function,
    calls_in,
    module_ast,
    parameters,
    positional_arguments,
    statement,
)
from equivci.hlo.ir import Instruction, SourceLoc
from equivci.translate.evaluator import Event

MAX_NAMES = 60  # names followed back from the op's statement, over every level (through shard_map calls too)
MAX_CALLS = 4  # calls followed up from the op's function
MAX_USES = 12  # uses of an index or mask value whose statements are searched too
MAX_READS = 5000  # ops followed back through operands to the helper that made what an op reads
INDEX_TYPES = {"pred", "s8", "s16", "s32", "s64", "u8", "u16", "u32", "u64"}
Bound = dict[str, ast.expr | None]  # a call's argument by parameter


@dataclasses.dataclass(frozen=True)
class Choice:
    """`text` is passed at file:line as `parameter` of `function`; `others` are other calls of it
    (file, line, what they pass). `paired`: another call passes the same for every other parameter.
    `use`: the op that depends on it when that is a use of the op's value (an index, a mask), not the
    op itself."""

    file: str
    line: int
    text: str
    parameter: str
    function: str
    others: tuple[tuple[str, int, str], ...]
    paired: bool = False
    use: Instruction | None = None
    # (file, line) of a statement that runs only under an `if` whose test reads the parameter: the
    # value picks that branch, written there, where the reviewer changes it.
    branch: tuple[str, int] | None = None


def passed_choice(
    inst: Instruction,
    events: list[Event],
    repo_root: str,
    entry: tuple[str, str] | None = None,
    foreign: tuple[tuple[str, str], ...] = (),
    reference_runs: frozenset[str] = frozenset(),
) -> Choice | None:
    """The static argument the op depends on, passed where another call of its helper passes another.

    `entry`: (file, function) of the distributed entrypoint, where the call chain starts when the
    op stacks end below it (a shard_map body's do). `foreign`: (file, function) of the distributed
    entrypoints of models checked against another reference; a call inside one says nothing of this
    model and is no other call, unless it also passes another function than this call where this one
    passes a function the reference runs (`reference_runs`: names of the functions on the reference's
    op stacks): that argument then accounts for the two references' difference, and what else it
    passes otherwise is evidence (a RoPE helper given another rotation, which the references differ
    in, and other positions, which they do not). Of several such arguments, the first one that
    alone tells its call apart from another call leads (a helper called for the cos and the sin
    table on one axis and for the sin table on another: the axis is the slip), else the first."""
    root = Path(repo_root).resolve()
    loc = next((f for f in inst.stack if in_repository(f, root)), None)
    found = statement(loc.file, loc.line) if loc is not None else None
    if loc is None or found is None:
        return None
    search = _Search(events, tuple(inst.stack), entry, foreign, reference_runs, branches=True)
    choices = search.run(loc.file, loc.line, [found[0]], MAX_CALLS)
    for use in [] if choices else _index_uses(inst, events, root):
        # Index and mask arithmetic is only as right as what its uses make of it (a bound test
        # left out, a comparison a callback makes): their choices are the op's too.
        use_loc = next(f for f in use.stack if in_repository(f, root))
        stmt = statement(use_loc.file, use_loc.line)
        if stmt is not None:
            through = _Search(events, tuple(use.stack), entry, foreign, reference_runs).run(
                use_loc.file, use_loc.line, [stmt[0]], MAX_CALLS
            )
            choices += [dataclasses.replace(c, use=use) for c in through]
    return next((c for c in choices if c.paired), choices[0] if choices else None)


def written_callback(
    inst: Instruction,
    events: list[Event],
    repo_root: str,
    foreign: tuple[tuple[str, str], ...] = (),
    reference_runs: frozenset[str] = frozenset(),
) -> Choice | None:
    """The lambda, written as an argument of a call, that the op is made under, on its own line or
    through the function it reaches on the op's call chain, where another call of the same function
    passes another lambda that names that function too (the calls compared): given the same values, what that function
    makes runs alike under both, so what tells the two calls apart (a mean left out around a helper,
    a loop's bounds around its body) is written in the lambda, at the call."""
    root = Path(repo_root).resolve()
    frames = [f for f in inst.stack if in_repository(f, root)]
    for depth, loc in enumerate(frames):
        reached = frames[depth - 1].function.split(".")[-1] if depth else None
        if not loc.function.endswith("<lambda>") or reached == "<lambda>":
            continue
        found = statement(loc.file, loc.line)
        for call in calls_in(found[0]) if found is not None else ():
            func = _module_function(loc.file, callee(call))
            if func is None:
                continue
            bound = {k.arg: k.value for k in call.keywords if k.arg is not None} | positional_arguments(func, call)
            for name, arg in bound.items():
                if not isinstance(arg, ast.Lambda) or not arg.lineno <= loc.line <= (arg.end_lineno or arg.lineno):
                    continue
                if reached is not None and not _reads_name(arg.body, reached):
                    continue
                counts = _Search(events, tuple(inst.stack), None, foreign, reference_runs).counts
                choice = _choice(loc.file, arg, func, name, loc.file, counts)
                alike = (
                    [o for o in choice.others if reached is None or _reads_name(ast.parse(o[2]), reached)]
                    if choice
                    else []
                )
                if choice is not None and alike:
                    return dataclasses.replace(choice, others=tuple(alike))
    return None


def _reads_name(node: ast.AST, name: str) -> bool:
    """`node` reads the plain name `name` (calls it, or passes it on)."""
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))


def _module_function(file: str, name: str) -> Function | None:
    """The module-level function `name` of `file`."""
    tree = module_ast(file)
    found = _definitions(tree).get(name) if tree is not None and name else None
    return found if isinstance(found, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def literal_written(
    inst: Instruction,
    events: list[Event],
    repo_root: str,
    literals: frozenset[str],
    entry: tuple[str, str] | None = None,
) -> tuple[str, int] | None:
    """(file, line) of the first statement, following the names the op's statement reads back through
    assignments and up the calls, that writes one of `literals` as a string constant: where a value the
    op takes from its caller is set (a collective's axis name bound by `functools.partial(lax.psum,
    axis_name="x")` in another function, or passed as an argument). None when the op's own statement
    writes it, or no statement the search reads does."""
    root = Path(repo_root).resolve()
    loc = next((f for f in inst.stack if in_repository(f, root)), None)
    found = statement(loc.file, loc.line) if loc is not None else None
    if loc is None or found is None or _writes(found[0], literals):
        return None
    search = _Search(events, tuple(inst.stack), entry)
    search.run(loc.file, loc.line, [found[0]], MAX_CALLS)
    return next(((file, line) for file, line, exprs in search.read if any(_writes(e, literals) for e in exprs)), None)


def _writes(node: ast.AST, literals: frozenset[str]) -> bool:
    return any(isinstance(n, ast.Constant) and n.value in literals for n in ast.walk(node))


def made_in(function: str, inst: Instruction, events: list[Event], repo_root: str) -> SourceLoc | None:
    """The frame inside the repository function named `function` of `inst`, or else of the op made
    there that `inst` reads (through its operands) latest in program order: where a helper passed
    by that name computes what `inst` depends on. None when nothing `inst` reads is made there."""
    root = Path(repo_root).resolve()
    position = {e.inst.name: k for k, e in enumerate(events)}
    by_name = {e.inst.name: e.inst for e in events}
    queue, seen, found = [inst], {inst.name}, list[tuple[int, SourceLoc]]()
    while queue and len(seen) <= MAX_READS:
        op = queue.pop()
        loc = next((f for f in op.stack if in_repository(f, root) and f.function.split(".")[-1] == function), None)
        if loc is not None:
            if op is inst:
                return loc
            found.append((position.get(op.name, -1), loc))
            continue  # what a helper's op reads is its arguments' business, or the helper's own
        for name in op.operands:
            if name not in seen and name in by_name:
                seen.add(name)
                queue.append(by_name[name])
    return max(found, key=lambda pair: pair[0])[1] if found else None


def _index_uses(inst: Instruction, events: list[Event], root: Path) -> list[Instruction]:
    """The ops that use an integer or predicate value (an index, an offset, a mask) through further
    integer and predicate ops, and the first other op each reaches, in program order; none for a
    value of another type."""
    if getattr(inst.shape, "dtype", None) not in INDEX_TYPES:  # an op without a shape: no value to follow
        return []
    found: list[Instruction] = []
    frontier, seen = {inst.name}, {inst.name}
    for event in events:
        if len(found) >= MAX_USES:
            break
        use = event.inst
        if use.name in seen or not frontier.intersection(use.operands):
            continue
        seen.add(use.name)
        if any(in_repository(f, root) for f in use.stack):
            found.append(use)
        if use.shape.dtype in INDEX_TYPES or use.opcode in LAYOUT_OPS:
            frontier.add(use.name)
    return found


class _Search:
    def __init__(
        self,
        events: list[Event],
        stack: tuple[SourceLoc, ...],
        entry: tuple[str, str] | None,
        foreign: tuple[tuple[str, str], ...] = (),
        reference_runs: frozenset[str] = frozenset(),
        branches: bool = False,
    ):
        self.events, self.stack, self.entry, self.foreign = events, stack, entry, foreign
        self.reference_runs = reference_runs
        self.branches = branches  # a statement's enclosing `if` tests are read too (Choice.branch)
        self.budget = MAX_NAMES
        self.read: list[tuple[str, int, list[ast.AST]]] = []  # (file, line, what is read there), in search order

    def run(self, file: str, line: int, exprs: Sequence[ast.AST], calls: int) -> list[Choice]:
        found = statement(file, line)
        if found is None:
            return []
        choices = self._follow(file, found[1], _names(exprs), calls)
        if self.branches and found[1]:
            # A statement under `if flag:` runs because of the flag: a value passed for it picks
            # the branch, whose statement is the one written for this call.
            tests = _tests_around(found[1][-1], line)
            branch = self._follow(file, found[1], _names(tests), calls) if tests else []
            picked = {
                (c.file, c.line, c.parameter): c if c.branch else dataclasses.replace(c, branch=(file, line))
                for c in branch
            }
            # The same value found through an assignment under the test picks this branch too.
            choices = [picked.pop((c.file, c.line, c.parameter), c) for c in choices] + list(picked.values())
        return choices

    def _follow(self, file: str, funcs: list[Function], queue: list[tuple[str, int]], calls: int) -> list[Choice]:
        choices, seen = list[Choice](), set[tuple[str, int | None]]()
        while queue and self.budget > 0:
            name, at = queue.pop(0)
            # A name is followed once per binding: `w = w[0]` reads the parameter `w`, not itself.
            binding = next((k for f in reversed(funcs) if (k := assigned_at(f, name, at)) is not None), None)
            if (name, binding) in seen:
                continue
            seen.add((name, binding))
            self.budget -= 1
            for func in reversed(funcs):
                assigned = _assignments(func, name, at)
                if assigned:
                    # A value assigned under an `if` depends on its test, taken or not.
                    values = [(k, _read_at(file, func, k)) for k in assigned]
                    self.read += [(file, k, read) for k, read in values]
                    queue.extend((n, k) for k, read in values for n, _ in _names(read))
                    break
                if name in parameters(func):
                    site = self._site(file, func, name)
                    if site is not None:
                        self.read.append((site[0], site[1].lineno, [site[1]]))
                        choice = _choice(site[0], site[1], func, name, file, self.counts)
                        if choice is not None:
                            choices.append(choice)
                        elif calls > 0:
                            # The helper may be a callable passed in: what is passed for it is a choice too.
                            callee_expr = _call_around(site[0], site[1])
                            reads = [site[1]] + ([callee_expr] if callee_expr is not None else [])
                            choices += self.run(site[0], site[1].lineno, reads, calls - 1)
                    break
                if _defines(func, name):
                    break
        return choices

    def counts(self, file: str, line: int, bound: Bound, own: Bound, name: str) -> bool:
        """The call at file:line, passing `bound` where the op's own call passes `own`, is evidence
        about parameter `name`: it is not inside a foreign entrypoint (another model's, checked
        against another reference), or it is and another of its arguments accounts for the two
        references' difference."""
        for entry in self.foreign:
            body = _entry_function(entry)
            if body is not None and file == entry[0] and body.lineno <= line <= (body.end_lineno or body.lineno):
                return any(
                    p != name and self._runs(own.get(p)) and not self._runs(bound.get(p))
                    for p in own.keys() & bound.keys()
                )
        return True

    def _runs(self, value: ast.expr | None) -> bool:
        """`value` names a function the reference runs."""
        return isinstance(value, ast.Name) and value.id in self.reference_runs

    def _site(self, file: str, func: Function, name: str) -> tuple[str, ast.expr] | None:
        """The argument for `name` at the call of `func` on the op's own chain, at a call seen on the
        op stacks, else at the one call (direct or bound by functools.partial) in the entrypoint or
        in a function of its file that the entrypoint calls, directly or through others: a shard_map
        body bound by a partial in a helper the entrypoint calls is on no op stack."""
        site = call_argument(file, func, name, self.events, self.stack)
        if site is not None or self.entry is None:
            return site
        spans = [range(f.lineno, (f.end_lineno or f.lineno) + 1) for f in _reached(self.entry)]
        passed = [
            (f, v)
            for f, node, bound in _calls(func, self.entry[0])
            if any(node.lineno in span for span in spans) and (v := bound.get(name))
        ]
        return passed[0] if len(passed) == 1 else None


def _entry_function(entry: tuple[str, str]) -> ast.stmt | None:
    """The module-level definition of an entrypoint (file, function)."""
    tree = module_ast(entry[0])
    return _definitions(tree).get(entry[1]) if tree is not None else None


@functools.lru_cache(maxsize=64)
def _definitions(tree: ast.Module) -> dict[str, ast.stmt]:
    """A module's top-level statements by the name they define, the first one of each name."""
    found: dict[str, ast.stmt] = {}
    for node in tree.body:
        if (name := getattr(node, "name", None)) is not None:
            found.setdefault(name, node)
    return found


def _reached(entry: tuple[str, str]) -> list[ast.stmt]:
    """The entrypoint's module-level definition and those of the functions of its file it calls by
    name, directly or through each other."""
    tree = module_ast(entry[0])
    defs = {
        n.name: n
        for n in (tree.body if tree is not None else [])
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    order, queue = list[ast.stmt](), [entry[1]]
    while queue:
        name = queue.pop(0)
        func = defs.get(name)
        if func is None or func in order:
            continue
        order.append(func)
        queue += [callee(n) for n in calls_in(func)]
    return order


def _tests_around(func: ast.AST, line: int) -> list[ast.expr]:
    """The tests of the `if` statements of `func` whose body or `else` holds `line` (not the test's own line)."""
    return [
        node.test
        for node in ast.walk(func)
        if isinstance(node, ast.If)
        and node is not func
        and (node.test.end_lineno or node.test.lineno) < line <= (node.end_lineno or node.lineno)
    ]


def _names(exprs: Sequence[ast.AST]) -> list[tuple[str, int]]:
    """The names read in `exprs`, in source order, with the line they are read at."""
    found = [n for e in exprs for n in ast.walk(e) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
    return [(n.id, n.lineno) for n in sorted(found, key=lambda n: (n.lineno, n.col_offset))]


def _assignments(func: ast.AST, name: str, before: int) -> list[int]:
    """The line of the last assignment of `name` before `before` in `func`, with the lines of the
    `if` tests it sits under."""
    line = assigned_at(func, name, before)
    if line is None:
        # A loop's target is bound by what the loop iterates over (`for t in range(ticks(m, n))`).
        return [
            node.lineno
            for node in ast.walk(func)
            if isinstance(node, (ast.For, ast.AsyncFor))
            and node is not func
            and any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node.target))
            and node.lineno < before <= (node.end_lineno or node.lineno)
        ][-1:]
    tests = [
        node.test.lineno
        for node in ast.walk(func)
        if isinstance(node, (ast.If, ast.While))
        and node.test.lineno < line <= (node.end_lineno or node.lineno)
        and node is not func
    ]
    return [line] + tests


def _read_at(file: str, func: ast.AST, line: int) -> list[ast.AST]:
    """What the statement at `line` reads: an assignment's value, an `if` test, or a loop's iterable."""
    for node in ast.walk(func):
        if isinstance(node, (ast.If, ast.While)) and node.test.lineno == line:
            return [node.test]
        if isinstance(node, (ast.For, ast.AsyncFor)) and node.lineno == line:
            return [node.iter]
    bound = statement(file, line)
    value = getattr(bound[0], "value", None) if bound else None
    return [value] if value is not None else []


def _call_around(file: str, arg: ast.expr) -> ast.expr | None:
    """The callee of the call that `arg` is passed to, when it is a plain name (a parameter may hold it)."""
    found = statement(file, arg.lineno)
    for node in ast.walk(found[0]) if found else ():
        if isinstance(node, ast.Call) and (
            any(a is arg for a in node.args) or any(k.value is arg for k in node.keywords)
        ):
            return node.func if isinstance(node.func, ast.Name) else None
    return None


def _defines(func: ast.AST, name: str) -> bool:
    """`name` is local to `func` without a plain assignment (a nested def, a loop or with target)."""
    for node in ast.walk(func):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store):
            return True
    return False


def _choice(
    file: str,
    arg: ast.expr,
    func: Function,
    name: str,
    func_file: str,
    counts: Callable[[str, int, Bound, Bound, str], bool],
):
    """A Choice when `arg`, passed at `file` for parameter `name` of `func`, is a static value and
    another call of `func` that `counts` passes a different one."""
    if not _static(file, arg):
        return None
    calls = list(_calls(func, func_file, file))
    own = next((bound for _, _, bound in calls if any(v is arg for v in bound.values())), None)
    calls = [
        (f, node, bound) for f, node, bound in calls if bound is own or counts(f, node.lineno, bound, own or {}, name)
    ]
    mine = ast.dump(arg)
    others = [
        (other_file, node.lineno, ast.unparse(value))
        for other_file, node, bound in calls
        if bound is not own and (value := bound.get(name)) is not None and ast.dump(value) != mine
    ]
    if not others:
        return None
    # Another call that passes the same for every other parameter: only this value tells them apart.
    paired = own is not None and any(
        bound is not own
        and _dump(bound.get(name)) != mine
        and all(_dump(bound.get(p)) == _dump(own.get(p)) for p in parameters(func) if p != name)
        for _, _, bound in calls
    )
    return Choice(file, arg.lineno, ast.unparse(arg), name, func.name, tuple(others), paired)


def _dump(value: ast.expr | None) -> str | None:
    return ast.dump(value) if value is not None else None


def _static(file: str, arg: ast.expr) -> bool:
    """A value fixed when the program is written: a literal, a lambda, or built from module-level
    names (a function, a constant) and literals, not from the caller's local values."""
    if isinstance(arg, (ast.Constant, ast.Lambda)):
        return True
    if isinstance(arg, ast.Attribute):
        return _static(file, arg.value)
    if isinstance(arg, ast.Name):
        found = statement(file, arg.lineno)
        funcs = found[1] if found else []
        return not any(_defines(f, arg.id) or arg.id in parameters(f) for f in funcs) and not (
            found is not None and _lambda_parameter(found[0], arg)
        )
    if isinstance(arg, ast.UnaryOp):
        return _static(file, arg.operand)
    if isinstance(arg, ast.BinOp):
        return _static(file, arg.left) and _static(file, arg.right)
    if isinstance(arg, (ast.Tuple, ast.List)):
        return all(_static(file, e) for e in arg.elts)
    if isinstance(arg, ast.Subscript):
        # An entry of a module-level table at a fixed key (`SIZES["w1"]`) is fixed as well.
        return _static(file, arg.value) and _static(file, arg.slice)
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


def _calls(func: Function, *files: str) -> Iterator[tuple[str, ast.Call, Bound]]:
    """(file, call, argument by parameter) at every call of `func` (direct, or bound by
    functools.partial) in `files`; a call that leaves a parameter out passes its default, a partial
    binds nothing for it (None), and a parameter after a starred argument is unknown (left out) unless
    the call must bind every parameter once (equivci.diagnose.source.positional_arguments)."""
    positional = [a.arg for a in func.args.posonlyargs + func.args.args]
    defaults = dict(zip(positional[len(positional) - len(func.args.defaults) :], func.args.defaults))
    defaults.update({a.arg: d for a, d in zip(func.args.kwonlyargs, func.args.kw_defaults) if d is not None})
    names = positional + [a.arg for a in func.args.kwonlyargs]
    for file in dict.fromkeys(files):
        tree = module_ast(file)
        for node in calls_in(tree) if tree is not None else ():
            args = node.args
            partial = callee(node) == "partial" and bool(args) and getattr(args[0], "id", None) == func.name
            if partial:
                args = args[1:]
            elif not calls_function(node, func.name):
                continue
            keywords = {k.arg: k.value for k in node.keywords if k.arg is not None}
            starred = next((k for k, a in enumerate(args) if isinstance(a, ast.Starred)), len(args))
            # A partial binds a prefix only: what follows its starred argument binds no known parameter.
            placed = {} if partial else positional_arguments(func, node)
            bound: Bound = {}
            for name in names:
                k = positional.index(name) if name in positional else len(args)
                if name in keywords:
                    bound[name] = keywords[name]
                elif name in placed:
                    bound[name] = placed[name]
                elif name in positional and starred < len(args) and starred <= k:
                    continue  # the starred argument may fill it
                else:
                    bound[name] = args[k] if k < len(args) else None if partial else defaults.get(name)
            yield file, node, bound
