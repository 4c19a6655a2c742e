"""A reduction the caller leaves out: a helper takes its all-reduce as a callable, and the call of
this program passes one that returns its argument unchanged where another call of the helper passes
one that all-reduces. Numerics shows the value it is applied to to be a partial sum used as the full
value; the lead is the call that passes the identity, where the reviewer changes it, not a line of
the helper, which both calls run. Two styles: a lambda passed at the entrypoint's call, and a named
function bound by functools.partial. Near misses: the models that pass the all-reduce are never
`mismatch`; an identity whose sibling all-reduces over another axis than the partial sum's is no
skipped reduction."""

from __future__ import annotations

import textwrap

import pytest
from model_package import line_of, manifest_text, verify_named, write_package

from equivci.results import Status

MODEL = textwrap.dedent(
    """
    import functools

    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, D, F = 4, 8, 16


    def inputs():
        f = jnp.float32
        return jax.ShapeDtypeStruct((B, D), f), jax.ShapeDtypeStruct((D, F), f), jax.ShapeDtypeStruct((F, D), f)


    def mlp(x, w1, w2):
        return jnp.tanh(x + jnp.tanh(x @ w1) @ w2)


    SPECS = (P(), P(None, "tp"), P("tp", None))


    def _local(x, w1, w2, reduce):
        return jnp.tanh(x + reduce(jnp.tanh(x @ w1) @ w2))


    def _tp(reduce, x, w1, w2, mesh):
        return jax.shard_map(lambda x, a, b: _local(x, a, b, reduce), mesh=mesh, in_specs=SPECS, out_specs=P(),
                             check_vma=False)(x, w1, w2)


    def mlp_tp(x, w1, w2, mesh):
        return _tp(lambda t: lax.psum(t, "tp"), x, w1, w2, mesh)


    def mlp_tp_unreduced(x, w1, w2, mesh):
        return _tp(lambda t: t, x, w1, w2, mesh)  # MARK:lambda


    def _all_reduce(t):
        return lax.psum(t, "tp")


    def _no_reduce(t):
        return t


    def _local_named(x, w1, w2, reduce_out):
        h = jnp.tanh(x @ w1) @ w2  # MARK:partial
        return jnp.tanh(x + reduce_out(h))


    def _named(local, x, w1, w2, mesh):
        return jax.shard_map(local, mesh=mesh, in_specs=SPECS, out_specs=P(), check_vma=False)(x, w1, w2)


    def mlp_tp_named(x, w1, w2, mesh):
        return _named(functools.partial(_local_named, reduce_out=_all_reduce), x, w1, w2, mesh)


    def mlp_tp_named_unreduced(x, w1, w2, mesh):
        return _named(functools.partial(_local_named, reduce_out=_no_reduce), x, w1, w2, mesh)  # MARK:partial-call


    def _local_other_axis(x, w1, w2, reduce):
        h = jnp.tanh(x @ w1) @ w2  # MARK:other-partial
        return jnp.tanh(x + reduce(h))


    def _other_axis(reduce, x, w1, w2, mesh):
        return jax.shard_map(lambda x, a, b: _local_other_axis(x, a, b, reduce), mesh=mesh, in_specs=SPECS,
                             out_specs=P(), check_vma=False)(x, w1, w2)


    def mlp_dp_sibling(x, w1, w2, mesh):
        return _other_axis(lambda t: lax.psum(t, "dp"), x, w1, w2, mesh)


    def mlp_tp_unreduced_dp_sibling(x, w1, w2, mesh):
        return _other_axis(lambda t: t, x, w1, w2, mesh)
    """
).lstrip()

MANIFEST = manifest_text(
    [
        ("tp", "mlp", "mlp_tp"),
        ("tp-unreduced", "mlp", "mlp_tp_unreduced"),
        ("tp-named", "mlp", "mlp_tp_named"),
        ("tp-named-unreduced", "mlp", "mlp_tp_named_unreduced"),
        ("tp-unreduced-dp-sibling", "mlp", "mlp_tp_unreduced_dp_sibling"),
    ],
    "{tp: 4}",
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("skipped_reduce"), "model.py", MODEL, MANIFEST)


@pytest.mark.parametrize("name", ["tp", "tp-named"])
def test_near_miss_the_all_reducing_callable_is_no_mismatch(manifest, name):
    assert verify_named(manifest, name).status != Status.MISMATCH


@pytest.mark.parametrize(
    ("name", "mark", "passed"),
    [("tp-unreduced", "lambda", "lambda t: t"), ("tp-named-unreduced", "partial-call", "_no_reduce")],
)
def test_the_call_that_passes_the_identity_leads(manifest, name, mark, passed):
    result = verify_named(manifest, name)
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("model.py", line_of(MODEL, mark)), result.findings
    assert f"`{passed}` is passed here" in lead.message and "which all-reduces over 'tp'" in lead.message


def test_near_miss_a_sibling_reducing_over_another_axis_is_no_skipped_reduction(manifest):
    result = verify_named(manifest, "tp-unreduced-dp-sibling")
    assert result.status == Status.MISMATCH
    assert not any("all-reduces over" in f.message for f in result.findings), result.findings
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("model.py", line_of(MODEL, "other-partial")), result.findings
    assert "partial sum over mesh axis 'tp'" in lead.message
