"""A value added to a partial sum inside its all-reduce, `psum(partial + full)`: the all-reduce sums
every term it is handed, so what is added is counted once per device of the axis. The all-reduce
is there; the line to change is the add, where the full value enters the sum, not where the
partial sum is made (whose psum is not missing). Two styles of an expert-parallel dense-gated MoE
(each device weighs its expert's output by its gate column): a shared expert's output added
before the psum, on two lines, and a residual added inside the psum, on one line. Near misses: the
same models with the add after the all-reduce are never `mismatch`, and an add no all-reduce
follows leaves the lead at the partial sum."""

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

    B, D, F, E = 4, 8, 16, 4


    def inputs():
        f = jnp.float32
        return (jax.ShapeDtypeStruct((B, D), f), jax.ShapeDtypeStruct((D, E), f), jax.ShapeDtypeStruct((E, D, F), f),
                jax.ShapeDtypeStruct((E, F, D), f), jax.ShapeDtypeStruct((D, D), f))


    def _expert(x, w1, w2):
        return jax.nn.gelu(x @ w1) @ w2


    def soft_moe(x, router, w1, w2, ws):
        gates = jax.nn.softmax(x @ router, -1)
        every = jax.vmap(lambda a, b: _expert(x, a, b))(w1, w2)
        return jnp.einsum("ebd,be->bd", every, gates) + x @ ws


    def _routed(x, router, w1, w2):
        gates = jax.nn.softmax(x @ router, -1)
        return gates[:, lax.axis_index("ep")][:, None] * _expert(x, w1[0], w2[0])  # MARK:routed


    def _run(local, args, mesh):
        specs = (P(), P(), P("ep"), P("ep"), P())
        return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=P(), check_vma=False)(*args)


    def soft_moe_ep(x, router, w1, w2, ws, mesh):
        def local(x, router, w1, w2, ws):
            return lax.psum(_routed(x, router, w1, w2), "ep") + x @ ws
        return _run(local, (x, router, w1, w2, ws), mesh)


    def soft_moe_ep_shared_inside(x, router, w1, w2, ws, mesh):
        def local(x, router, w1, w2, ws):
            y = _routed(x, router, w1, w2)
            y = y + x @ ws  # MARK:shared
            return lax.psum(y, "ep")
        return _run(local, (x, router, w1, w2, ws), mesh)


    def soft_moe_tanh(x, router, w1, w2, ws):
        return jnp.tanh(soft_moe(x, router, w1, w2, ws))


    def soft_moe_ep_unreduced(x, router, w1, w2, ws, mesh):
        def local(x, router, w1, w2, ws):
            return jnp.tanh(_routed(x, router, w1, w2) + x @ ws)
        return _run(local, (x, router, w1, w2, ws), mesh)


    def residual_moe(x, router, w1, w2, ws):
        return x + soft_moe(x, router, w1, w2, ws * 0.0)


    def residual_moe_ep(x, router, w1, w2, ws, mesh):
        def local(x, router, w1, w2, ws):
            return x + lax.psum(_routed(x, router, w1, w2), "ep") + x @ (ws * 0.0)
        return _run(local, (x, router, w1, w2, ws), mesh)


    def residual_moe_ep_inside(x, router, w1, w2, ws, mesh):
        def local(x, router, w1, w2, ws):
            return lax.psum(x + _routed(x, router, w1, w2), "ep") + x @ (ws * 0.0)  # MARK:residual
        return _run(local, (x, router, w1, w2, ws), mesh)
    """
).lstrip()

MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {name}, reference: model.py:{ref}, distributed: model.py:{func}, inputs: model.py:inputs, "
    "mesh: {ep: 4}}\n"
    for name, ref, func in [
        ("moe", "soft_moe", "soft_moe_ep"),
        ("moe-shared-inside", "soft_moe", "soft_moe_ep_shared_inside"),
        ("moe-unreduced", "soft_moe_tanh", "soft_moe_ep_unreduced"),
        ("residual", "residual_moe", "residual_moe_ep"),
        ("residual-inside", "residual_moe", "residual_moe_ep_inside"),
    ]
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("summed_inside"), "model.py", MODEL, MANIFEST)


@pytest.mark.parametrize("name", ["moe", "residual"])
def test_near_miss_the_add_after_the_all_reduce_is_no_mismatch(manifest, name):
    assert verify_named(manifest, name).status != Status.MISMATCH


@pytest.mark.parametrize(("name", "mark"), [("moe-shared-inside", "shared"), ("residual-inside", "residual")])
def test_the_add_inside_the_all_reduce_leads(manifest, name, mark):
    result = verify_named(manifest, name)
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("model.py", line_of(MODEL, mark)), result.findings
    assert "the all-reduce belongs on the partial sum alone" in lead.message.lower(), lead.message


def test_near_miss_an_add_no_all_reduce_follows_leaves_the_partial_sum_first(manifest):
    """Without an all-reduce after the add (only the add's own use, a tanh), the psum is missing:
    the lead stays where the partial sum is made."""
    result = verify_named(manifest, "moe-unreduced")
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("model.py", line_of(MODEL, "routed")), result.findings
    assert "psum (all-reduce) over that axis is missing" in lead.message, lead.message
