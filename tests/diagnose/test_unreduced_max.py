"""A reduce that keeps the maximum (or minimum, or product) of its lanes is not linear in its
operand: max(a + b) is no max(a) + max(b). Row-parallel logits whose psum is missing, taken by a
max, lead where the partial sum is made (the psum belongs there), with the max as a tied note. A
sum of the same partial logits is linear: its psum after the sum verifies (the near miss)."""

from __future__ import annotations

import textwrap

import pytest
from model_package import line_of, manifest_text, verify_named, write_package

from equivci.results import Status

MODEL = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P


    def inputs():
        f = jnp.float32
        return jax.ShapeDtypeStruct((8, 16), f), jax.ShapeDtypeStruct((16, 32), f)


    def top(x, w):
        return jnp.max(x @ w, axis=-1)


    def total(x, w):
        return jnp.sum(x @ w, axis=-1)


    def _rows(body, x, w, mesh):
        specs = (P(None, "tp"), P("tp", None))
        return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P(), check_vma=False)(x, w)


    def top_tp_unreduced(x, w, *, mesh):
        def body(x, w):
            logits = x @ w  # MARK:partial
            return jnp.max(logits, axis=-1)  # MARK:max

        return _rows(body, x, w, mesh)


    def total_tp_summed_late(x, w, *, mesh):
        def body(x, w):
            logits = x @ w
            return lax.psum(jnp.sum(logits, axis=-1), "tp")

        return _rows(body, x, w, mesh)
    """
).lstrip()

MANIFEST = manifest_text(
    [("top", "top", "top_tp_unreduced"), ("total", "total", "total_tp_summed_late")],
    "{tp: 4}",
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("unreduced_max"), "model.py", MODEL, MANIFEST)


def test_near_miss_a_sum_of_partial_logits_summed_after_verifies(manifest):
    assert verify_named(manifest, "total").status == Status.VERIFIED


def test_a_max_of_partial_logits_leads_where_the_partial_sum_is_made(manifest):
    result = verify_named(manifest, "top")
    assert result.status == Status.MISMATCH
    lead, note = result.findings[0], result.findings[1]
    assert (lead.path, lead.line, lead.severity) == ("model.py", line_of(MODEL, "partial"), "error"), result.findings
    assert "share of a sum over mesh axis 'tp'" in lead.message and "psum (all-reduce)" in lead.message
    assert (note.path, note.line, note.severity, note.tie) == ("model.py", line_of(MODEL, "max"), "note", lead.tie)
