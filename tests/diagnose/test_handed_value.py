"""An op on a line both programs run computes, from the same values, what the reference's does:
when it differs, the value it is handed does. The finding leads where the distributed program's
own code makes that value (a mask built before the shard_map; a predicate passed in as a lambda,
inside the line that combines it), with the shared op and the call as tied notes. When the shared
op is handed an input passed on as it is (tests/diagnose/test_shared_caller.py), or values made
on two lines of the distributed program, the call into the shared code stays the suspect."""

from __future__ import annotations

import textwrap

import pytest
from model_package import line_of, verify_named, write_package

from equivci.diagnose import handed
from equivci.diagnose.handed import handed_origin
from equivci.hlo.ir import Instruction, Shape, SourceLoc
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.translate.evaluator import Event

MODEL = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    B, S, D, W = 4, 8, 16, 3


    def inputs():
        f = jnp.float32
        return jax.ShapeDtypeStruct((B, S, D), f), jax.ShapeDtypeStruct((D, D), f)


    def attend(x, w, allowed):
        s = jnp.where(allowed, jnp.einsum("bqd,de,bke->bqk", x, w, x), -1e9)  # MARK:shared
        return jax.nn.softmax(s, axis=-1) @ x


    def causal(x, w):
        return attend(x, w, jnp.tril(jnp.ones((S, S), bool)))


    def windowed(x, w):
        qp = jnp.arange(S)[:, None]
        kp = jnp.arange(S)[None, :]
        return attend(x, w, (kp <= qp) & (qp - kp < W))


    def _batch(body, x, w, mesh):
        return jax.shard_map(body, mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data"))(x, w)


    def causal_dp(x, w, *, mesh):
        allowed = jnp.tril(jnp.ones((S, S), bool))
        return _batch(lambda x, w: attend(x, w, allowed), x, w, mesh)


    def causal_dp_strict(x, w, *, mesh):
        allowed = jnp.tril(jnp.ones((S, S), bool), k=-1)  # MARK:mask
        return _batch(lambda x, w: attend(x, w, allowed), x, w, mesh)  # MARK:call


    def _windowed_local(keep):
        def body(x, w):
            qp = jnp.arange(S)[:, None]
            kp = jnp.arange(S)[None, :]
            return attend(x, w, (kp <= qp) & keep(qp - kp))  # MARK:combine
        return body


    def windowed_dp(x, w, *, mesh):
        return _batch(_windowed_local(lambda d: d < W), x, w, mesh)


    def windowed_dp_inclusive(x, w, *, mesh):
        return _batch(_windowed_local(lambda d: d <= W), x, w, mesh)  # MARK:lambda
    """
).lstrip()

CASES = [
    ("causal", "causal", "causal_dp"),
    ("causal-strict", "causal", "causal_dp_strict"),
    ("windowed", "windowed", "windowed_dp"),
    ("windowed-inclusive", "windowed", "windowed_dp_inclusive"),
]
MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {name}, reference: model.py:{ref}, distributed: model.py:{func}, inputs: model.py:inputs, "
    "mesh: {data: 2}}\n"
    for name, ref, func in CASES
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("handed_value"), "model.py", MODEL, MANIFEST)


@pytest.mark.parametrize("name", ["causal", "windowed"])
def test_near_miss_the_right_mask_is_no_mismatch(manifest, name):
    assert verify_named(manifest, name).status != Status.MISMATCH


def test_a_mask_made_before_the_shard_map_leads(manifest):
    result = verify_named(manifest, "causal-strict")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line, lead.severity) == ("model.py", line_of(MODEL, "mask"), "error")
    notes = {(f.line, f.tie) for f in result.findings[1:] if f.severity == "note"}
    assert {(line_of(MODEL, "shared"), lead.tie), (line_of(MODEL, "call"), lead.tie)} <= notes


def test_a_predicate_passed_in_leads_inside_the_line_that_combines_it(manifest):
    result = verify_named(manifest, "windowed-inclusive")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line, lead.severity) == ("model.py", line_of(MODEL, "lambda"), "error")
    assert line_of(MODEL, "combine") != lead.line


# -- the walk itself, on hand-made events ------------------------------------------------------------

FILE = "/repo/model.py"
SHARED = 10  # the reference's line too


def _events(*ops: tuple[str, str, tuple[str, ...], tuple[int, ...]]) -> list[Event]:
    """(name, opcode, operands, source lines innermost first) -> events, each with its own term."""
    table, made, out = TermTable(), {}, []
    for name, opcode, operands, lines in ops:
        args = tuple(made[o] for o in operands)
        # A copy hands its operand's term on.
        term = args[0] if opcode == "copy" else table.make(opcode, (name,), args, (2,), "f32")
        made[name] = term
        stack = tuple(SourceLoc(FILE, line) for line in lines)
        out.append(Event(Instruction(name, opcode, Shape("f32", (2,)), operands, {}, stack=stack), [term]))
    return out


def _inst(events: list[Event], name: str) -> Instruction:
    return next(e.inst for e in events if e.inst.name == name)


def _origin(events: list[Event]) -> Instruction | None:
    return handed_origin(events[-1].inst, events, "/repo", frozenset({(FILE, SHARED)}))


def test_one_distributed_line_makes_what_is_handed():
    events = _events(
        ("x", "parameter", (), ()),
        ("m", "compare", ("x",), (30,)),
        ("s", "multiply", ("x", "m"), (SHARED, 40)),
    )
    assert _origin(events) == _inst(events, "m")


def test_an_op_inside_a_call_from_the_other_line_is_more_specific():
    events = _events(
        ("x", "parameter", (), ()),
        ("a", "compare", ("x",), (30,)),
        ("b", "compare", ("x",), (50, 30)),  # a lambda's body, called from line 30
        ("m", "and", ("a", "b"), (30,)),
        ("s", "multiply", ("x", "m"), (SHARED, 40)),
    )
    # "m" is the one distributed op the shared op reads: the walk stops there.
    assert _origin(events) == _inst(events, "m")
    events = _events(
        ("x", "parameter", (), ()),
        ("a", "compare", ("x",), (30,)),
        ("b", "compare", ("x",), (50, 30)),
        ("s", "multiply", ("a", "b"), (SHARED, 40)),
    )
    assert _origin(events) == _inst(events, "b")


def test_near_miss_two_lines_make_what_is_handed():
    events = _events(
        ("x", "parameter", (), ()),
        ("a", "compare", ("x",), (30,)),
        ("b", "compare", ("x",), (31,)),
        ("s", "multiply", ("a", "b"), (SHARED, 40)),
    )
    assert _origin(events) is None


def test_near_miss_an_input_handed_on_as_it_is():
    events = _events(
        ("x", "parameter", (), ()),
        ("c", "copy", ("x",), (40,)),
        ("s", "multiply", ("c", "c"), (SHARED, 40)),
    )
    assert _origin(events) is None


def test_shared_lines_are_walked_through():
    events = _events(
        ("x", "parameter", (), ()),
        ("m", "compare", ("x",), (30,)),
        ("t", "tanh", ("m",), (SHARED, 40)),
        ("s", "multiply", ("x", "t"), (SHARED, 40)),
    )
    assert _origin(events) == _inst(events, "m")


def test_a_walk_past_its_bound_names_nothing(monkeypatch):
    events = _events(
        ("x", "parameter", (), ()),
        ("a", "compare", ("x",), (30,)),
        ("b", "compare", ("x",), (31,)),
        ("t", "tanh", ("b",), (SHARED, 40)),
        ("s", "multiply", ("a", "t"), (SHARED, 40)),
    )
    assert _origin(events) is None  # two lines make what is handed
    monkeypatch.setattr(handed, "MAX_WALKED", 3)
    assert _origin(events) is None  # the walk stops before it reaches "b": "a" alone is no answer
