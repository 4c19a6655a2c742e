"""A function passed by name whose body is one `return` is written on that line: when no op the
failing op reads is made in it (an offset its caller's statement adds after the op), the lead is
still that line, not the call that passes it. A function of several statements, none shared with
the one another call passes, says nothing about which line: the call leads (near miss)."""

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
        return (jax.ShapeDtypeStruct((16, 4), jnp.float32),)


    def prefix_sums(x):
        return jnp.cumsum(x, axis=0)


    def _before(x):
        me = lax.axis_index("sp")
        sums = lax.all_gather(jnp.sum(x, axis=0), "sp")
        keep = jnp.arange(sums.shape[0]) < me
        return jnp.sum(jnp.where(keep[:, None], sums, 0.0), axis=0)


    def _own_times_index(x):
        return lax.axis_index("sp") * x.shape[0]  # MARK:one-line


    def _own_times_index_long(x):
        n = x.shape[0]
        return lax.axis_index("sp") * n


    def _local(x, offset):
        return jnp.cumsum(x, axis=0) + offset(x)


    def _run(x, mesh, offset):
        return jax.shard_map(lambda x: _local(x, offset), mesh=mesh, in_specs=P("sp"), out_specs=P("sp"))(x)


    def sp(x, *, mesh):
        return _run(x, mesh, _before)


    def sp_one_line(x, *, mesh):
        return _run(x, mesh, _own_times_index)  # MARK:call


    def sp_long(x, *, mesh):
        return _run(x, mesh, _own_times_index_long)  # MARK:long-call
    """
).lstrip()

MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {name}, reference: model.py:prefix_sums, distributed: model.py:{func}, inputs: model.py:inputs, "
    "mesh: {sp: 4}}\n"
    for name, func in [("sp", "sp"), ("one-line", "sp_one_line"), ("long", "sp_long")]
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("passed_one_liner"), "model.py", MODEL, MANIFEST)


def test_the_one_line_of_the_passed_function_leads(manifest):
    result = verify_named(manifest, "one-line")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line, lead.severity) == ("model.py", line_of(MODEL, "one-line"), "error"), lead
    assert any((f.path, f.line) == ("model.py", line_of(MODEL, "call")) for f in result.findings[1:])


def test_near_miss_a_passed_function_of_two_statements_leaves_the_lead_at_the_call(manifest):
    result = verify_named(manifest, "long")
    assert result.status == Status.MISMATCH
    assert (result.findings[0].path, result.findings[0].line) == ("model.py", line_of(MODEL, "long-call"))
