"""A shard_map body bound by functools.partial inside a helper the entrypoint calls: the body's ops
end their stacks at the body, so the partial is on no stack; the choice it binds is found in the
functions the entrypoint reaches (equivci.diagnose.arguments), and the call that passes the value
leads, as it does when the partial sits in the entrypoint itself."""

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


    def inputs():
        return jax.ShapeDtypeStruct((16, 16), jnp.float32), jax.ShapeDtypeStruct((16, 16), jnp.float32)


    def strictly_lower(x, w):
        return jnp.where(jnp.triu(jnp.ones((16, 16), dtype=bool), k=1), 0.0, x @ w)


    def _local(x, w, *, diag):
        n = x.shape[0]
        rows = lax.axis_index("data") * n + jnp.arange(n)
        masked = jnp.arange(w.shape[1])[None, :] >= rows[:, None] + diag
        return jnp.where(masked, 0.0, x @ w)


    def _sharded(x, w, mesh, diag):
        body = functools.partial(_local, diag=diag)
        return jax.shard_map(body, mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data"))(x, w)


    def lower_dp(x, w, *, mesh):
        return _sharded(x, w, mesh, 1)


    def lower_dp_diagonal(x, w, *, mesh):
        return _sharded(x, w, mesh, 0)  # MARK:diag


    def _first(n):
        return lax.axis_index("data") * n


    def _first_late(n):
        return lax.axis_index("data") * n + 1  # MARK:late


    def _rows_local(x, w, *, first):
        n = x.shape[0]
        rows = first(n) + jnp.arange(n)
        masked = jnp.arange(w.shape[1])[None, :] >= rows[:, None] + 1
        return jnp.where(masked, 0.0, x @ w)


    def _run(x, w, mesh, first):
        body = functools.partial(_rows_local, first=first)
        return jax.shard_map(body, mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data"))(x, w)


    def lower_rows(x, w, *, mesh):
        return _run(x, w, mesh, _first)


    def lower_rows_late(x, w, *, mesh):
        return _run(x, w, mesh, _first_late)  # MARK:late-call
    """
).lstrip()

MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {name}, reference: masks.py:strictly_lower, distributed: masks.py:{func}, "
    "inputs: masks.py:inputs, mesh: {data: 2}}\n"
    for name, func in [
        ("diagonal", "lower_dp_diagonal"),
        ("diagonal-ok", "lower_dp"),
        ("late", "lower_rows_late"),
        ("late-ok", "lower_rows"),
    ]
)


@pytest.fixture(scope="module")
def masks(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("partial_in_helper"), "masks.py", MODEL, MANIFEST)


@pytest.mark.parametrize(
    ("name", "lead", "says"),
    [
        # A static number bound by the partial: the entrypoint's call that passes it leads.
        ("diagonal", "diag", "`0` is passed here as `diag` of `_sharded`"),
        # A function bound by the partial: its body leads where it departs from the other one.
        ("late", "late", "`_first_late`, passed at masks.py:"),
    ],
)
def test_the_choice_bound_by_a_partial_in_a_helper_leads(masks, name, lead, says):
    result = verify_named(masks, name)
    assert result.status == Status.MISMATCH
    first = result.findings[0]
    assert (first.path, first.line, first.severity) == ("masks.py", line_of(MODEL, lead), "error"), first.message
    assert says in first.message


@pytest.mark.parametrize("name", ["diagonal-ok", "late-ok"])
def test_the_calls_that_pass_the_right_value_verify(masks, name):
    assert verify_named(masks, name).status == Status.VERIFIED
