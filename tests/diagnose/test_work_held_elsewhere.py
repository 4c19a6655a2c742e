"""Work the reference applies before an op, which the distributed program does too but the op does
not read: nothing is missing, the op reads the value from before the work (the sum of all
probabilities where the reference sums the top-k ones). The lead is the op's line, not the line that
made the value it reads (where the missing-work finding, without the held value, put it:
tests/diagnose/test_missing_work.py covers work that is missing)."""

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
        return jax.ShapeDtypeStruct((8, 6), jnp.float32), jax.ShapeDtypeStruct((16, 8), jnp.float32)


    def route(router, x):
        probs = jax.nn.softmax(x @ router, -1)
        top_p, _ = lax.top_k(probs, 2)
        return top_p / jnp.sum(top_p, -1, keepdims=True)


    def _over_all(router, x):
        probs = jax.nn.softmax(x @ router, -1)  # MARK:made
        top_p, _ = lax.top_k(probs, 2)
        return top_p / jnp.sum(probs, -1, keepdims=True)  # MARK:reads


    def dp_over_all(router, x, *, mesh):
        return jax.shard_map(_over_all, mesh=mesh, in_specs=(P(), P("data")), out_specs=P("data"))(router, x)
    """
).lstrip()

MANIFEST = (
    "version: 1\nmodels:\n  - {name: over-all, reference: model.py:route, distributed: model.py:dp_over_all, "
    "inputs: model.py:inputs, mesh: {data: 2}}\n"
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("work_held"), "model.py", MODEL, MANIFEST)


def test_the_op_that_reads_the_value_from_before_the_work_leads(manifest):
    result = verify_named(manifest, "over-all")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line, lead.severity) == ("model.py", line_of(MODEL, "reads"), "error"), lead
    assert f"model.py:{line_of(MODEL, 'made') + 1}" in lead.message  # where the worked value is computed
