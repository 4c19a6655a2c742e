"""A flag that picks an `if` branch: the statement in the branch that the differing op's chain runs
through is the code written for this call, and the line to change, not a choice of another
parameter of the same helper that other calls pass otherwise (a start offset one entry computes
another way) nor the call that passes the flag (kept as a note). Two styles of passing the flag:
a keyword the entry passes down through a lambda, and functools.partial on the shard_map body.
Near misses: the entries without the flag are never `mismatch`; a function passed by name that
picks a branch still leads in its own body."""

from __future__ import annotations

import textwrap

import pytest
from model_package import line_of, verify_named, write_package

from equivci.results import Status

MODEL = textwrap.dedent(
    """
    import functools

    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    T, K = 8, 3


    def inputs():
        return jax.ShapeDtypeStruct((T, T), jnp.float32), jax.ShapeDtypeStruct((2 * K + 1,), jnp.float32)


    def _biased(x, table, dist):
        return x * table[jnp.clip(dist, -K, K) + K]


    def biased(x, table):
        t = jnp.arange(T)
        return _biased(x, table, t[None, :] - t[:, None])


    def _start(c):
        return lax.axis_index("sp") * c


    def _start_from_size(c):
        return lax.axis_index("sp") * (T // lax.axis_size("sp"))


    def _local(x, table, start, mirrored):
        q = start(x.shape[0]) + jnp.arange(x.shape[0])
        if mirrored:
            return _biased(x, table, q[:, None] - jnp.arange(T)[None, :])  # MARK:lambda
        return _biased(x, table, jnp.arange(T)[None, :] - q[:, None])


    def _run(x, table, mesh, start=_start, mirrored=False):
        local = lambda x, table: _local(x, table, start, mirrored)
        return jax.shard_map(local, mesh=mesh, in_specs=(P("sp"), P()), out_specs=P("sp"))(x, table)


    def biased_sp(x, table, mesh):
        return _run(x, table, mesh)


    def biased_sp_sized(x, table, mesh):
        return _run(x, table, mesh, start=_start_from_size)


    def biased_sp_mirrored(x, table, mesh):
        return _run(x, table, mesh, mirrored=True)


    def _body(x, table, *, start, transposed):
        q = start(x.shape[0]) + jnp.arange(x.shape[0])
        if transposed:
            dist = (q[None, :] - jnp.arange(T)[:, None]).T
            return _biased(x, table, dist)  # MARK:partial
        return _biased(x, table, jnp.arange(T)[None, :] - q[:, None])


    def _run_partial(x, table, mesh, start, transposed):
        body = functools.partial(_body, start=start, transposed=transposed)
        return jax.shard_map(body, mesh=mesh, in_specs=(P("sp"), P()), out_specs=P("sp"))(x, table)


    def biased_sp_partial(x, table, mesh):
        return _run_partial(x, table, mesh, _start, False)


    def biased_sp_partial_sized(x, table, mesh):
        return _run_partial(x, table, mesh, _start_from_size, False)


    def biased_sp_partial_transposed(x, table, mesh):
        return _run_partial(x, table, mesh, _start, True)


    def _no_shift(n):
        return 0


    def _shift_one(n):
        return 1  # MARK:callable


    def _shifted(x, table, *, shift):
        q = _start(x.shape[0]) + jnp.arange(x.shape[0])
        s = shift(T)
        if s >= 0:
            return _biased(x, table, jnp.arange(T)[None, :] - q[:, None] - s)
        return x


    def _run_shifted(x, table, mesh, shift):
        body = functools.partial(_shifted, shift=shift)
        return jax.shard_map(body, mesh=mesh, in_specs=(P("sp"), P()), out_specs=P("sp"))(x, table)


    def biased_sp_unshifted(x, table, mesh):
        return _run_shifted(x, table, mesh, _no_shift)


    def biased_sp_shifted(x, table, mesh):
        return _run_shifted(x, table, mesh, _shift_one)
    """
).lstrip()

MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {name}, reference: model.py:biased, distributed: model.py:{func}, inputs: model.py:inputs, "
    "mesh: {sp: 4}}\n"
    for name, func in [
        ("sp", "biased_sp"),
        ("sp-mirrored", "biased_sp_mirrored"),
        ("partial", "biased_sp_partial"),
        ("partial-transposed", "biased_sp_partial_transposed"),
        ("shifted", "biased_sp_shifted"),
    ]
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("branch_flag"), "model.py", MODEL, MANIFEST)


@pytest.mark.parametrize("name", ["sp", "partial"])
def test_near_miss_without_the_flag_no_mismatch(manifest, name):
    assert verify_named(manifest, name).status != Status.MISMATCH


@pytest.mark.parametrize(("name", "mark"), [("sp-mirrored", "lambda"), ("partial-transposed", "partial")])
def test_the_branch_the_flag_picks_leads(manifest, name, mark):
    result = verify_named(manifest, name)
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("model.py", line_of(MODEL, mark)), result.findings
    assert "picks its branch" in lead.message, lead.message


def test_a_function_passed_for_the_branch_leads_in_its_own_body(manifest):
    """A function passed by name that also picks a branch is written in its own body: the lead is
    where it departs from the function another call passes, not the branch it picks."""
    result = verify_named(manifest, "shifted")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("model.py", line_of(MODEL, "callable")), result.findings
