"""A helper passed by name where another call passes another: the lead is the first statement of its
body that the other's lacks or writes otherwise (equivci.diagnose.siblings), not a statement both
share (the one whose op the failing op reads) and not the call that names it (a note). A function
that returns its one parameter unchanged does no work: the call that passes it leads."""

from __future__ import annotations

import textwrap

import pytest
from model_package import line_of, verify_named, write_package

from equivci.diagnose.siblings import departure, one_statement, returns_its_argument
from equivci.results import Status


def _departure_in(tmp_path, source: str, name: str, *others: str):
    path = tmp_path / "helpers.py"
    path.write_text(textwrap.dedent(source).lstrip())
    found = departure(str(path), name, tuple((str(path), 1, other) for other in others))
    return found.line if found is not None else None


def test_work_left_out_lands_on_the_statement_that_should_carry_it(tmp_path):
    source = """
    def _route(w):
        top = w * 2
        return top / top.sum()

    def _route_raw(w):
        top = w * 2
        return top
    """
    assert _departure_in(tmp_path, source, "_route_raw", "_route") == 7


def test_a_changed_statement_inside_a_loop_and_the_docstring_left_out(tmp_path):
    source = '''
    def _good(xs):
        """Sum of the first two."""
        total = 0
        for x in xs[:2]:
            total = total + x
        return total

    def _bad(xs):
        """Sum of the first two, off by one."""
        total = 0
        for x in xs[:3]:
            total = total + x
        return total
    '''
    assert _departure_in(tmp_path, source, "_bad", "_good") == 11


def test_only_a_function_that_returns_its_one_parameter_unchanged_does_no_work(tmp_path):
    source = textwrap.dedent(
        """
        def _same(h):
            \"\"\"Nothing to do.\"\"\"
            return h

        def _first(order, rows):
            return rows

        def _start(i, mb):
            return i

        def _other(h):
            return -h
        """
    )
    path = tmp_path / "m.py"
    path.write_text(source)
    assert returns_its_argument(str(path), "_same")
    # Near misses: a parameter left unused (the body is where it should be read), work done.
    assert not any(returns_its_argument(str(path), name) for name in ("_first", "_start", "_other", "_missing"))


def test_work_added_at_the_end_lands_on_the_added_statement(tmp_path):
    source = """
    def _plain(h):
        return h

    def _doubled(h):
        h = h * 2
        return h
    """
    assert _departure_in(tmp_path, source, "_doubled", "_plain") == 5


def test_the_closest_sibling_is_compared_and_unrelated_bodies_say_nothing(tmp_path):
    source = """
    def _a(h):
        g = h + 1
        return g * 3

    def _far(h):
        q = h.T
        return q @ q

    def _near(h):
        g = h + 1
        return g * 2
    """
    assert _departure_in(tmp_path, source, "_a", "_far", "_near") == 3
    assert _departure_in(tmp_path, source, "_a", "_far") is None
    # The same function, an unknown name or a lambda text give no sibling.
    assert _departure_in(tmp_path, source, "_a", "_a", "lambda h: h", "_missing") is None


MODEL = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P


    def inputs():
        return jax.ShapeDtypeStruct((8, 16), jnp.float32), jax.ShapeDtypeStruct((16, 32), jnp.float32)


    def normed(x, w):
        h = jax.nn.relu(x @ w) + 1.0
        return (h / jnp.sum(h, axis=-1, keepdims=True)) @ w.T


    def _normalise(h):
        h = jax.nn.relu(h) + 1.0
        return h / jnp.sum(h, axis=-1, keepdims=True)


    def _normalise_raw(h):
        h = jax.nn.relu(h) + 1.0  # MARK:shared
        return h  # MARK:raw


    def _normalise_none(h):
        return h  # MARK:none


    def _dp(x, w, mesh, norm):
        body = lambda x, w: norm(x @ w) @ w.T  # noqa: E731
        return jax.shard_map(body, mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data"))(x, w)


    def dp(x, w, *, mesh):
        return _dp(x, w, mesh, _normalise)


    def dp_raw(x, w, *, mesh):
        return _dp(x, w, mesh, _normalise_raw)  # MARK:raw-call


    def _dp_rows(x, w, mesh, norm):
        return jax.shard_map(
            lambda x, w: jnp.dot(norm(x @ w), w.T), mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data")
        )(x, w)


    def dp_rows(x, w, *, mesh):
        return _dp_rows(x, w, mesh, _normalise)


    def dp_none(x, w, *, mesh):
        return _dp_rows(x, w, mesh, _normalise_none)  # MARK:none-call


    def plain(x, w):
        return x @ w


    def _all_rows(n):
        return n


    def _rows_short(n):
        return n - 1  # MARK:short


    def _kept(x, w, mesh, rows):
        def body(x, w):
            h = x @ w
            index = jnp.arange(h.shape[0])[:, None]
            return jnp.where(index < rows(h.shape[0]), h, 0.0)

        return jax.shard_map(body, mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data"))(x, w)


    def kept(x, w, *, mesh):
        return _kept(x, w, mesh, _all_rows)


    def kept_short(x, w, *, mesh):
        return _kept(x, w, mesh, _rows_short)  # MARK:short-call
    """
).lstrip()

MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {name}, reference: helpers.py:{ref}, distributed: helpers.py:{func}, "
    "inputs: helpers.py:inputs, mesh: {data: 2}}\n"
    for name, ref, func in [
        ("raw", "normed", "dp_raw"),
        ("raw-ok", "normed", "dp"),
        ("none", "normed", "dp_none"),
        ("short", "plain", "kept_short"),
        ("short-ok", "plain", "kept"),
    ]
)


@pytest.fixture(scope="module")
def helpers(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("siblings"), "helpers.py", MODEL, MANIFEST)


@pytest.mark.parametrize(
    ("name", "lead", "call", "made"),
    [
        # The normalisation left out: the op reads what the shared `relu` line makes (a note), the
        # change is the `return`.
        ("raw", "raw", "raw-call", "shared"),
        # A count computed in Python: no op at all in the helper, its one statement is the change.
        ("short", "short", "short-call", None),
    ],
)
def test_the_departing_statement_leads_and_the_call_is_a_tied_note(helpers, name, lead, call, made):
    result = verify_named(helpers, name)
    assert result.status == Status.MISMATCH
    first = result.findings[0]
    assert (first.line, first.severity) == (line_of(MODEL, lead), "error"), first.message
    assert "departs here from" in first.message
    notes = {f.line: f for f in result.findings[1:] if f.tie == first.tie and f.severity == "note"}
    assert line_of(MODEL, call) in notes
    if made is not None:
        read = notes.get(line_of(MODEL, made))
        assert read is not None and "reads is made here" in read.message


def test_a_passed_function_that_returns_its_argument_unchanged_leads_at_the_call(helpers):
    """The normalisation left out as `return h` alone: the function does no work, no statement of it
    is the change; passing it in place of `_normalise` is. (`_normalise_raw` above does work, its
    `return` leads.)"""
    result = verify_named(helpers, "none")
    assert result.status == Status.MISMATCH
    first = result.findings[0]
    assert (first.line, first.severity) == (line_of(MODEL, "none-call"), "error"), first.message
    assert "returns its argument unchanged" in first.message
    assert all(f.line != line_of(MODEL, "none") for f in result.findings)


@pytest.mark.parametrize("name", ["raw-ok", "short-ok"])
def test_the_sibling_calls_verify(helpers, name):
    assert verify_named(helpers, name).status == Status.VERIFIED


def test_a_function_of_one_return_is_written_on_that_line(tmp_path):
    """`_offset` shares no statement with the helper another call passes, yet all it computes is
    its one `return`: that line. Near misses: two statements, or one that is not a `return`."""
    path = tmp_path / "helpers.py"
    path.write_text(
        textwrap.dedent(
            '''
            def _offset(mask):
                """The chunk's start."""
                return mask.shape[1] * 2

            def _counted(mask):
                n = mask.sum()
                return n

            def _looped(mask):
                for m in mask:
                    return m
            '''
        ).lstrip()
    )
    assert one_statement(str(path), "_offset") == 3
    assert one_statement(str(path), "_counted") is None
    assert one_statement(str(path), "_looped") is None
