"""The caller's choice read from source alone: which arguments count as static choices.

A value a lambda receives at each of its calls (a loop body's carried state) is no choice fixed
when the program is written, even where another call passes another name: the finding stays at
the op. A literal passed where another call passes another literal is one."""

from __future__ import annotations

import textwrap

from equivci.diagnose.arguments import passed_choice
from equivci.hlo.ir import Instruction, Shape, SourceLoc
from equivci.translate.evaluator import Event

SOURCE = textwrap.dedent(
    """
    from jax import lax


    def dense(h, w, scale):
        return lax.tanh(h @ w) * scale


    def plain(x, w):
        return dense(x, w, 2.0)


    def looped(x, w):
        return lax.fori_loop(0, 2, lambda i, h: dense(h, w, 2.0), x)


    def rescaled(x, w):
        return dense(x, w, 3.0)
    """
).lstrip()


def _line(text: str) -> int:
    return next(k for k, line in enumerate(SOURCE.splitlines(), 1) if text in line)


def _op_called_from(path: str, caller: str) -> Event:
    """The multiply inside `dense` as the distributed program made it, called from `caller`'s line."""
    stack = (
        SourceLoc(path, _line("return lax.tanh"), "dense"),
        SourceLoc(path, _line(caller), caller.split("(")[0]),
    )
    return Event(Instruction("multiply.1", "multiply", None, (), {}, stack=stack), [])  # type: ignore[arg-type]


def test_a_lambda_parameter_is_no_static_choice(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(SOURCE.replace("dense(h, w, 2.0)", "dense(h, w, scale=2.0)").replace("* scale", "* 2.0"))
    event = _op_called_from(str(path), "lambda i, h")
    # `h` differs from `x` at the other call, but each run of the lambda receives it: no choice.
    assert passed_choice(event.inst, [event], str(tmp_path)) is None


def test_a_literal_another_call_passes_otherwise_is_a_choice(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(SOURCE)
    event = _op_called_from(str(path), "return dense(x, w, 3.0)")
    choice = passed_choice(event.inst, [event], str(tmp_path))
    assert choice is not None and (choice.line, choice.text, choice.parameter) == (_line("dense(x, w, 3.0)"), "3.0", "scale")


def test_a_call_that_leaves_a_parameter_out_passes_its_default(tmp_path):
    # Only `plain` passes something else than 3.0, and it passes nothing: the default.
    source = (
        SOURCE.replace("def dense(h, w, scale):", "def dense(h, w, scale=2.0):")
        .replace("dense(x, w, 2.0)", "dense(x, w)")
        .replace("dense(h, w, 2.0)", "dense(h, w, 3.0)")
    )
    path = tmp_path / "model.py"
    path.write_text(source)
    lines = source.splitlines()
    op = next(k for k, line in enumerate(lines, 1) if "return lax.tanh" in line)
    call = next(k for k, line in enumerate(lines, 1) if "dense(x, w, 3.0)" in line)
    stack = (SourceLoc(str(path), op, "dense"), SourceLoc(str(path), call, "rescaled"))
    event = Event(Instruction("multiply.1", "multiply", None, (), {}, stack=stack), [])  # type: ignore[arg-type]
    choice = passed_choice(event.inst, [event], str(tmp_path))
    assert choice is not None and (choice.line, choice.text, choice.parameter) == (call, "3.0", "scale")
    assert "2.0" in [text for _, _, text in choice.others]  # what the call that leaves it out passes


def test_a_call_in_the_entrypoint_of_a_model_with_another_reference_is_no_other_call(tmp_path):
    """Another call counts unless it sits in the distributed entrypoint of a model checked against
    another reference: what that model passes says nothing about this one."""
    path = tmp_path / "model.py"
    path.write_text(SOURCE)
    event = _op_called_from(str(path), "return dense(x, w, 3.0)")
    entry = (str(path), "rescaled")
    foreign = ((str(path), "plain"), (str(path), "looped"))  # both pass 2.0
    assert passed_choice(event.inst, [event], str(tmp_path), entry, foreign=foreign) is None
    choice = passed_choice(event.inst, [event], str(tmp_path), entry, foreign=((str(path), "looped"),))
    assert choice is not None and (choice.text, choice.others[0][2]) == ("3.0", "2.0"), choice


FOREIGN_SOURCE = textwrap.dedent(
    """
    from jax import lax


    def rotate_a(x, p):
        return x * p


    def rotate_b(x, p):
        return x - p


    def offset_positions(n):
        return lax.iota("int32", n) + lax.axis_index("cp") * n


    def local_positions(n):
        return lax.iota("int32", n)


    def attend(x, rotate, positions_fn):
        pos = positions_fn(4)
        return rotate(x, pos)


    def attend_a(x):
        return attend(x, rotate_a, offset_positions)


    def attend_b(x):
        return attend(x, rotate_b, local_positions)


    def attend_b_same_positions(x):
        return attend(x, rotate_a, local_positions)
    """
).lstrip()


def _foreign_line(text: str) -> int:
    return next(k for k, line in enumerate(FOREIGN_SOURCE.splitlines(), 1) if text in line)


def test_a_foreign_call_counts_where_another_argument_accounts_for_the_references_difference(tmp_path):
    """The foreign model passes another rotation (the references differ in it: this reference runs
    `rotate_b`) and other positions (which no reference accounts for): the positions are the choice.
    Near miss: where this call passes the rotation the foreign one passes too, nothing accounts for
    the references' difference, and the foreign call stays no evidence."""
    path = tmp_path / "model.py"
    path.write_text(FOREIGN_SOURCE)
    stack = (
        SourceLoc(str(path), _foreign_line("def local_positions") + 1, "local_positions"),
        SourceLoc(str(path), _foreign_line("pos = positions_fn(4)"), "attend"),
    )
    event = Event(Instruction("iota.1", "iota", None, (), {}, stack=stack), [])  # type: ignore[arg-type]
    foreign = ((str(path), "attend_a"),)
    runs = frozenset({"rotate_b", "attend", "local_positions"})
    choice = passed_choice(event.inst, [event], str(tmp_path), (str(path), "attend_b"), foreign, runs)
    assert choice is not None and (choice.text, choice.parameter) == ("local_positions", "positions_fn"), choice
    assert choice.line == _foreign_line("return attend(x, rotate_b, local_positions)")
    assert choice.others[0][2] == "offset_positions"
    # Without the reference running `rotate_b`, the foreign call accounts for nothing.
    assert passed_choice(event.inst, [event], str(tmp_path), (str(path), "attend_b"), foreign, frozenset()) is None
    # Near miss: this call passes the foreign call's rotation; only the positions differ, which the
    # references' difference may be: no evidence.
    same = passed_choice(
        event.inst, [event], str(tmp_path), (str(path), "attend_b_same_positions"), foreign, frozenset({"rotate_a"})
    )
    assert same is None


USE_SOURCE = textwrap.dedent(
    """
    from jax import lax


    def nll(labels, width, upper):
        local = labels - lax.axis_index("v") * width
        owned = (local >= 0) & upper(local, width)
        return owned


    def nll_lt(labels):
        return nll(labels, 8, lambda local, width: local < width)


    def nll_le(labels):
        return nll(labels, 8, lambda local, width: local <= width)
    """
).lstrip()


def test_a_choice_found_through_a_use_of_an_index_names_that_use(tmp_path):
    """The local id is right; the test that uses it applies the lambda the caller passes: the
    choice names that use as what depends on it, not the subtraction."""
    path = tmp_path / "model.py"
    path.write_text(USE_SOURCE)
    lines = USE_SOURCE.splitlines()
    line = {key: next(n for n, text in enumerate(lines, 1) if key in text) for key in ("local =", "owned =", "<= width")}
    caller = SourceLoc(str(path), line["<= width"], "nll_le")
    frame = {key: SourceLoc(str(path), line[key], "nll") for key in ("local =", "owned =")}
    sub = Instruction("sub.1", "subtract", Shape("s32", (4,)), (), {}, stack=(frame["local ="], caller))
    ge = Instruction("ge.1", "compare", Shape("pred", (4,)), ("sub.1",), {}, stack=(frame["owned ="], caller))
    events = [Event(sub, []), Event(ge, [])]  # type: ignore[arg-type]
    choice = passed_choice(sub, events, str(tmp_path))
    assert choice is not None and choice.text == "lambda local, width: local <= width", choice
    assert choice.use is ge
    # Near miss: the choice found from the op's own statement names no use.
    direct = passed_choice(ge, events, str(tmp_path))
    assert direct is not None and direct.use is None


def test_an_entry_of_a_module_table_at_a_fixed_key_is_a_choice(tmp_path):
    """`SIZES["w1"]` is fixed when the program is written, as `2.0` is; near miss: an entry at a
    key the caller computes (`sizes[k]`, a local) is no choice."""
    table = 'SIZES = {"a": 2.0, "b": 3.0}\n\n\n'
    path = tmp_path / "model.py"
    path.write_text(table + SOURCE.replace("dense(x, w, 3.0)", 'dense(x, w, SIZES["b"])'))
    lines = path.read_text().splitlines()
    op = next(k for k, line in enumerate(lines, 1) if "return lax.tanh" in line)
    call = next(k for k, line in enumerate(lines, 1) if 'SIZES["b"]' in line)
    stack = (SourceLoc(str(path), op, "dense"), SourceLoc(str(path), call, "rescaled"))
    event = Event(Instruction("multiply.1", "multiply", None, (), {}, stack=stack), [])  # type: ignore[arg-type]
    choice = passed_choice(event.inst, [event], str(tmp_path))
    assert choice is not None and (choice.line, choice.text, choice.parameter) == (call, "SIZES['b']", "scale")
    local = tmp_path / "local.py"  # the source is read once per file: the near miss is another
    local.write_text(path.read_text().replace('dense(x, w, SIZES["b"])', "dense(x, w, SIZES[x.dtype.name])"))
    stack = tuple(SourceLoc(str(local), f.line, f.function) for f in stack)
    event = Event(Instruction("multiply.1", "multiply", None, (), {}, stack=stack), [])  # type: ignore[arg-type]
    assert passed_choice(event.inst, [event], str(tmp_path)) is None


STARRED_SOURCE = textwrap.dedent(
    """
    import jax
    from jax import lax


    def local(x, w, axis):
        return lax.psum(x @ w, axis)


    def run(x, w, mesh, axis):
        return jax.shard_map(lambda *a: local(*a, axis), mesh=mesh, in_specs=None, out_specs=None)(x, w)


    def summed(x, w, mesh):
        return run(x, w, mesh, "tp")


    def summed_over_data(x, w, mesh):
        return run(x, w, mesh, "dp")
    """
).lstrip()


def test_an_argument_after_a_starred_one_binds_the_last_parameter_where_the_call_must_bind_all(tmp_path):
    """`lambda *a: local(*a, axis)`: a function without defaults or `*args` takes each parameter
    exactly once, so the argument after the starred one is `axis`, and the caller's choice is
    found through it. Near miss: with a default, the starred argument may fill `axis` too."""
    path = tmp_path / "model.py"
    path.write_text(STARRED_SOURCE)
    lines = STARRED_SOURCE.splitlines()

    def line(text: str) -> int:
        return next(k for k, s in enumerate(lines, 1) if text in s)

    stack = (
        SourceLoc(str(path), line("return lax.psum"), "local"),
        SourceLoc(str(path), line("lambda *a"), "run.<locals>.<lambda>"),
        SourceLoc(str(path), line("lambda *a"), "run"),
        SourceLoc(str(path), line('"dp"'), "summed_over_data"),
    )
    event = Event(Instruction("all-reduce.1", "all-reduce", None, (), {}, stack=stack), [])  # type: ignore[arg-type]
    choice = passed_choice(event.inst, [event], str(tmp_path))
    assert choice is not None and (choice.line, choice.text, choice.parameter) == (line('"dp"'), "'dp'", "axis")
    assert [text for _, _, text in choice.others] == ["'tp'"]
    defaulted = tmp_path / "defaulted.py"
    defaulted.write_text(STARRED_SOURCE.replace("def local(x, w, axis):", 'def local(x, w, axis="tp"):'))
    stack = tuple(SourceLoc(str(defaulted), f.line, f.function) for f in stack)
    event = Event(Instruction("all-reduce.1", "all-reduce", None, (), {}, stack=stack), [])  # type: ignore[arg-type]
    assert passed_choice(event.inst, [event], str(tmp_path)) is None


def test_positional_arguments_after_a_starred_one():
    """The arguments after the last starred one bind the last parameters the keywords leave, only
    where the call must bind each parameter once (no defaults, no `*args`, no `**kwargs` passed)."""
    import ast

    from equivci.diagnose.source import positional_arguments

    def bound(definition: str, call: str) -> dict[str, str]:
        func = ast.parse(definition).body[0]
        node = ast.parse(call, mode="eval").body
        assert isinstance(func, ast.FunctionDef) and isinstance(node, ast.Call)
        return {k: ast.unparse(v) for k, v in positional_arguments(func, node).items()}

    assert bound("def f(a, b, c): pass", "f(x, *r, z)") == {"a": "x", "c": "z"}
    assert bound("def f(a, b, c, d): pass", "f(*r, y, d=w)") == {"c": "y"}
    assert bound("def f(a, b, c=1): pass", "f(*r, z)") == {}
    assert bound("def f(a, *rest): pass", "f(*r, z)") == {}
    assert bound("def f(a, b): pass", "f(*r, z, **kw)") == {}
    assert bound("def f(a, b): pass", "f(x, y)") == {"a": "x", "b": "y"}


def test_a_literal_after_a_starred_argument_is_a_choice_against_another_call(tmp_path):
    """Two shard_map bodies bound as `lambda *a: local(*a, "tp")` and `(*a, "dp")`: the literals
    bind `axis` at both calls, so the one on the op's chain is the choice against the other."""
    source = STARRED_SOURCE.replace("local(*a, axis)", 'local(*a, "dp")') + textwrap.dedent(
        """

        def run_tp(x, w, mesh):
            return jax.shard_map(lambda *a: local(*a, "tp"), mesh=mesh, in_specs=None, out_specs=None)(x, w)
        """
    )
    path = tmp_path / "model.py"
    path.write_text(source)
    lines = source.splitlines()
    at = next(k for k, s in enumerate(lines, 1) if 'local(*a, "dp")' in s)
    stack = (
        SourceLoc(str(path), next(k for k, s in enumerate(lines, 1) if "return lax.psum" in s), "local"),
        SourceLoc(str(path), at, "run.<locals>.<lambda>"),
    )
    event = Event(Instruction("all-reduce.1", "all-reduce", None, (), {}, stack=stack), [])  # type: ignore[arg-type]
    choice = passed_choice(event.inst, [event], str(tmp_path))
    assert choice is not None and (choice.line, choice.text, choice.parameter) == (at, "'dp'", "axis"), choice
    assert [text for _, _, text in choice.others] == ["'tp'"]


WRAPPED_SOURCE = textwrap.dedent(
    """
    import jax
    from jax import lax


    def local(w, b, x):
        w, b = w[0], b[0]
        y = x @ w + b
        return lax.psum(y, "tp")


    def run(w, b, x, mesh, fix_bias):
        w, b = w.reshape(2, -1), fix_bias(b)
        return jax.shard_map(local, mesh=mesh, in_specs=None, out_specs=None)(w, b, x)


    def good(w, b, x, mesh):
        return run(w, b, x, mesh, lambda b: b.reshape(2, -1))


    def bad(w, b, x, mesh):
        return run(w, b, x, mesh, lambda b: b)
    """
).lstrip()


def test_a_choice_is_found_through_a_wrapped_call_and_a_name_rebound_from_itself(tmp_path):
    """`shard_map(local, ...)(w, b, x)` calls `local` with those arguments, and `w, b = w[0], b[0]`
    reads the parameters `w` and `b`: the op in `local` depends on what `bad` passes as `fix_bias`.
    Near miss: with the wrapped call written through a partial, no call of `local` binds `b`."""
    path = tmp_path / "model.py"
    path.write_text(WRAPPED_SOURCE)
    lines = WRAPPED_SOURCE.splitlines()
    op = next(k for k, line in enumerate(lines, 1) if "y = x @ w + b" in line)
    call = next(k for k, line in enumerate(lines, 1) if "lambda b: b)" in line)
    stack = (SourceLoc(str(path), op, "local"), SourceLoc(str(path), call, "bad"))
    event = Event(Instruction("add.1", "add", None, (), {}, stack=stack), [])  # type: ignore[arg-type]
    choice = passed_choice(event.inst, [event], str(tmp_path), entry=(str(path), "bad"))
    assert choice is not None and (choice.line, choice.text, choice.parameter) == (call, "lambda b: b", "fix_bias")
    partial = tmp_path / "partial.py"  # the source is read once per file: the near miss is another
    partial.write_text(WRAPPED_SOURCE.replace("jax.shard_map(local,", "jax.shard_map(functools.partial(local),"))
    stack = tuple(SourceLoc(str(partial), f.line, f.function) for f in stack)
    event = Event(Instruction("add.1", "add", None, (), {}, stack=stack), [])  # type: ignore[arg-type]
    assert passed_choice(event.inst, [event], str(tmp_path), entry=(str(partial), "bad")) is None


def test_a_loop_target_is_bound_by_the_iterable(tmp_path):
    """`for t in range(ticks(m))`: an op that reads `t` depends on `ticks`, which the caller passes.
    Near miss: a loop over a fixed range binds `t` to nothing the caller chooses."""
    source = textwrap.dedent(
        """
        def schedule(x, m, ticks):
            out = x
            for t in range(ticks(m)):
                out = out * t
            return out


        def full(x):
            return schedule(x, 4, lambda m: m + 1)


        def short(x):
            return schedule(x, 4, lambda m: m)
        """
    ).lstrip()
    for name, text, expected in (("loop.py", source, "lambda m: m"), ("fixed.py", source.replace("ticks(m)", "5"), None)):
        path = tmp_path / name
        path.write_text(text)
        lines = text.splitlines()
        op = next(k for k, line in enumerate(lines, 1) if "out = out * t" in line)
        call = next(k for k, line in enumerate(lines, 1) if "lambda m: m)" in line)
        stack = (SourceLoc(str(path), op, "schedule"), SourceLoc(str(path), call, "short"))
        event = Event(Instruction("multiply.1", "multiply", None, (), {}, stack=stack), [])  # type: ignore[arg-type]
        choice = passed_choice(event.inst, [event], str(tmp_path))
        assert (choice.text if choice is not None else None) == expected
