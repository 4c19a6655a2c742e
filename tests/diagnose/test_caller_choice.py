"""A helper parameterized by a static value (here the mesh axis its all-reduce runs over): when the op
where the programs part depends on that parameter and another call of the helper passes another
value, the finding leads at the call that passes it, with the op's own line as a tied note. Without
such another call nothing says the caller chose wrong; but the axis of an all-reduce is its defect,
so the finding leads where that axis is written (here the call again)."""

from __future__ import annotations

import textwrap

import pytest
from model_package import line_of, verify_named, write_package

from equivci.results import Status

MODEL = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P


    def inputs():
        f = jnp.float32
        return jax.ShapeDtypeStruct((8, 16), f), jax.ShapeDtypeStruct((16, 32), f), jax.ShapeDtypeStruct((32, 16), f)


    def mlp(x, w_up, w_down):
        return jax.nn.relu(x @ w_up) @ w_down


    def _down_projection(h, w_down, *, reduce_over):
        return lax.psum(h @ w_down, reduce_over)  # MARK:op


    def _sharded(x, w_up, w_down, mesh, reduce_over):
        def body(x, w_up, w_down):
            return _down_projection(jax.nn.relu(x @ w_up), w_down, reduce_over=reduce_over)

        specs = (P("data", None), P(None, "model"), P("model", None))
        return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P("data", None), check_vma=False)(
            x, w_up, w_down
        )


    def mlp_2d(x, w_up, w_down, *, mesh):
        return _sharded(x, w_up, w_down, mesh, "model")


    def mlp_2d_wrong_axis(x, w_up, w_down, *, mesh):
        return _sharded(x, w_up, w_down, mesh, "data")  # MARK:call
    """
).lstrip()

# The same helper and the same bug, but the only call of `_sharded` is the wrong one.
ALONE = MODEL[: MODEL.index("def mlp_2d(")].rstrip() + "\n\n\n" + textwrap.dedent(
    """
    def mlp_2d_wrong_axis(x, w_up, w_down, *, mesh):
        return _sharded(x, w_up, w_down, mesh, "data")
    """
).lstrip()

MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {name}, reference: {module}.py:mlp, distributed: {module}.py:{func}, inputs: {module}.py:inputs, "
    "mesh: {data: 2, model: 2}}\n"
    for name, module, func in [
        ("ok", "model", "mlp_2d"),
        ("wrong-axis", "model", "mlp_2d_wrong_axis"),
        ("wrong-axis-alone", "alone", "mlp_2d_wrong_axis"),
    ]
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    root = tmp_path_factory.mktemp("caller_choice")
    (root / "alone.py").write_text(ALONE)
    return write_package(root, "model.py", MODEL, MANIFEST)


def test_the_correct_call_verifies(manifest):
    assert verify_named(manifest, "ok").status == Status.VERIFIED


def test_the_call_that_passes_the_wrong_axis_leads(manifest):
    result = verify_named(manifest, "wrong-axis")
    assert result.status == Status.MISMATCH
    lead, note = result.findings[0], result.findings[1]
    assert (lead.path, lead.line, lead.severity) == ("model.py", line_of(MODEL, "call"), "error")
    assert "`'data'` is passed here as `reduce_over` of `_sharded`" in lead.message
    assert "passes `'model'`" in lead.message  # what the other call passes
    assert (note.path, note.line, note.severity, note.tie) == ("model.py", line_of(MODEL, "op"), "note", lead.tie)


def test_without_another_call_the_lead_is_where_the_axis_is_written(manifest):
    # No other call says the caller chose wrong, but the all-reduce's axis is the defect and the
    # call writes it: the line to change is there, with the op's line as a tied note.
    result = verify_named(manifest, "wrong-axis-alone")
    assert result.status == Status.MISMATCH
    lead, note = result.findings[0], result.findings[1]
    call = ALONE.splitlines().index('    return _sharded(x, w_up, w_down, mesh, "data")') + 1
    assert (lead.path, lead.line, lead.severity) == ("alone.py", call, "error"), result.findings
    assert "is passed here" not in lead.message
    assert "the mesh axes ('data') that the `all-reduce` at alone.py:" in lead.message
    assert (note.path, note.line, note.severity, note.tie) == ("alone.py", line_of(MODEL, "op"), "note", lead.tie)


# Choices reached in other ways: a callable passed down into a shard_map body (whose ops' stacks end
# at the body, so the call is found in the entrypoint), a flag bound by functools.partial that an
# `if` tests before the mask it guards, and two static arguments of one call where only one differs
# from what every other call passes.
PATHS = textwrap.dedent(
    """
    import functools

    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    SCALE_A, SCALE_B = 0.5, 2.0


    def inputs():
        f = jnp.float32
        return jax.ShapeDtypeStruct((8, 16), f), jax.ShapeDtypeStruct((16, 32), f), jax.ShapeDtypeStruct((32, 16), f)


    def mlp(x, w_up, w_down):
        return jax.nn.relu(x @ w_up) @ w_down


    def clipped(x, w_up, w_down):
        h = x @ w_up
        return jnp.where((h > 0) & (h < 4), h, 0.0) @ w_down


    def two(x, w_up, w_down):
        return SCALE_A * (x @ w_up[:, :16]) + SCALE_B * (x @ w_up[:, 16:])


    def _relu(h):
        return jax.nn.relu(h)


    def _tanh(h):
        return jnp.tanh(h)  # MARK:tanh


    def _tp(x, w_up, w_down, mesh, act):
        def body(x, w_up, w_down):
            return lax.psum(act(x @ w_up) @ w_down, "model")

        specs = (P(), P(None, "model"), P("model", None))
        return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P(), check_vma=False)(x, w_up, w_down)


    def tp_relu(x, w_up, w_down, *, mesh):
        return _tp(x, w_up, w_down, mesh, _relu)


    def tp_tanh(x, w_up, w_down, *, mesh):
        return _tp(x, w_up, w_down, mesh, _tanh)  # MARK:callable


    def _masked(x, w_up, w_down, *, clip):
        h = x @ w_up
        keep = h > 0
        if clip:
            keep = keep & (h < 4)
        return lax.psum(jnp.where(keep, h, 0.0) @ w_down, "model")


    SPECS = (P(), P(None, "model"), P("model", None))


    def tp_clipped(x, w_up, w_down, *, mesh):
        body = functools.partial(_masked, clip=True)
        return jax.shard_map(body, mesh=mesh, in_specs=SPECS, out_specs=P(), check_vma=False)(x, w_up, w_down)


    def tp_unclipped(x, w_up, w_down, *, mesh):
        body = functools.partial(_masked, clip=False)  # MARK:flag
        return jax.shard_map(body, mesh=mesh, in_specs=SPECS, out_specs=P(), check_vma=False)(x, w_up, w_down)


    def _scaled(x, w, scale, axis):
        return scale * lax.psum(x @ w, axis)


    def _two(x, w_up, mesh, axis_b):
        def body(x, w_up):
            w_a, w_b = w_up[:, :16], w_up[:, 16:]
            a = _scaled(x, w_a, SCALE_A, "model")
            return a + _scaled(x, w_b, SCALE_B, axis_b)

        specs = (P(None, "model"), P("model", None))
        return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P(), check_vma=False)(x, w_up)


    def two_tp(x, w_up, w_down, *, mesh):
        return _two(x, w_up, mesh, "model")


    def two_tp_other_axis(x, w_up, w_down, *, mesh):
        return _two(x, w_up, mesh, "data")  # MARK:axis


    def lookup_inputs():
        return jax.ShapeDtypeStruct((16, 8), jnp.float32), jax.ShapeDtypeStruct((2, 6), jnp.int32)


    def lookup(table, ids):
        return table[ids]


    def _rows(table_shard, ids, in_shard):
        n = table_shard.shape[0]
        local = ids - lax.axis_index("model") * n
        rows = table_shard[jnp.clip(local, 0, n - 1)]
        return lax.psum(jnp.where(in_shard(local, n)[..., None], rows, 0.0), "model")


    def _vocab_parallel(table, ids, mesh, in_shard):
        body = lambda t, i: _rows(t, i, in_shard)  # noqa: E731
        return jax.shard_map(body, mesh=mesh, in_specs=(P("model", None), P()), out_specs=P(), check_vma=False)(
            table, ids
        )


    def lookup_tp(table, ids, *, mesh):
        return _vocab_parallel(table, ids, mesh, lambda local, n: (local >= 0) & (local < n))


    def lookup_tp_no_upper_bound(table, ids, *, mesh):
        return _vocab_parallel(table, ids, mesh, lambda local, n: local >= 0)  # MARK:bound
    """
).lstrip()

PATHS_MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {name}, reference: paths.py:{ref}, distributed: paths.py:{func}, "
    f"inputs: paths.py:{'lookup_inputs' if ref == 'lookup' else 'inputs'}, "
    "mesh: {data: 2, model: 2}}\n"
    for name, ref, func in [
        ("callable", "mlp", "tp_tanh"),
        ("flag", "clipped", "tp_unclipped"),
        ("axis", "two", "two_tp_other_axis"),
        ("flag-ok", "clipped", "tp_clipped"),
        ("bound", "lookup", "lookup_tp_no_upper_bound"),
        ("bound-ok", "lookup", "lookup_tp"),
    ]
)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("caller_paths"), "paths.py", PATHS, PATHS_MANIFEST)


@pytest.mark.parametrize(
    ("name", "mark", "says"),
    [
        # A function passed by name is written in its own body: its line leads, the call is a note.
        ("callable", "tanh", "`_tanh`, passed at paths.py:"),
        ("flag", "flag", "`False` is passed here as `clip` of `_masked`"),
        # `SCALE_B` is passed where the other call passes `SCALE_A`, but so do its weights: the axis
        # alone tells the two `_two` calls apart.
        ("axis", "axis", "`'data'` is passed here as `axis_b` of `_two`"),
        # The ids' shift into the shard is index arithmetic the reference lacks: the bound test its
        # uses make (a callback) is the choice.
        ("bound", "bound", "is passed here as `in_shard` of `_vocab_parallel`"),
    ],
)
def test_the_choice_is_found_through_callables_partials_and_branches(paths, name, mark, says):
    result = verify_named(paths, name)
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line, lead.severity) == ("paths.py", line_of(PATHS, mark), "error")
    assert says in lead.message


def test_a_function_passed_by_name_leads_in_its_body_with_the_call_as_a_tied_note(paths):
    """The judges' labels (blind splits 6 and 9: six of six) put a bug in a helper passed by name in
    the helper's body; the call that names it is a tied note, and so is the op that reads it."""
    findings = verify_named(paths, "callable").findings
    lead, call = findings[0], findings[1]
    assert (lead.line, call.line, call.severity) == (line_of(PATHS, "tanh"), line_of(PATHS, "callable"), "note")
    assert lead.tie is not None and call.tie == lead.tie
    assert "`_tanh` is passed here as `act` of `_tp`" not in lead.message


@pytest.mark.parametrize("name", ["flag-ok", "bound-ok"])
def test_the_calls_that_keep_the_bound_verify(paths, name):
    assert verify_named(paths, name).status == Status.VERIFIED
