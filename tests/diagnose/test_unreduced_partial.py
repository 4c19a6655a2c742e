"""A partial sum whose all-reduce never comes: the numeric oracle sees it as one (summed over the
devices of a mesh axis it is a reference value, alone it is none) and sees the op that uses it as
the full value differ. The finding leads at the partial sum, where the psum belongs, even where
the proof stopped earlier at a value it could not relate (a softmax normalised after its dot).
Two styles: a sequence-sharded softmax whose denominator is the local key block's sum, and an
RMSNorm over a tensor-sharded hidden dim whose mean square is the local shard's. Near misses: the
same models with the all-reduce are never `mismatch`."""

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

    B, S, D, F = 2, 8, 8, 16


    def inputs():
        f = jnp.float32
        return jax.ShapeDtypeStruct((B, S, D), f), jax.ShapeDtypeStruct((B, S, D), f), jax.ShapeDtypeStruct((B, S, D), f)


    def attention(q, k, v):
        return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(jnp.einsum("bqd,bkd->bqk", q, k), -1), v)


    def _attention_local(reduce_den):
        def local(q, k, v):
            s = jnp.einsum("bqd,bkd->bqk", q, k)
            p = jnp.exp(s - lax.pmax(jnp.max(s, -1, keepdims=True), "cp"))
            num = lax.psum(jnp.einsum("bqk,bkd->bqd", p, v), "cp")
            den = jnp.sum(p, -1, keepdims=True)  # MARK:den
            den = lax.psum(den, "cp") if reduce_den else den
            return num / den
        return local


    def _attention(reduce_den, q, k, v, mesh):
        return jax.shard_map(_attention_local(reduce_den), mesh=mesh, in_specs=(P(), P(None, "cp"), P(None, "cp")),
                             out_specs=P(), check_vma=False)(q, k, v)


    def attention_cp(q, k, v, mesh):
        return _attention(True, q, k, v, mesh)


    def attention_cp_local_den(q, k, v, mesh):
        return _attention(False, q, k, v, mesh)  # MARK:den-call


    def norm_inputs():
        f = jnp.float32
        return jax.ShapeDtypeStruct((B, D), f), jax.ShapeDtypeStruct((D, F), f)


    def up_norm(x, w):
        h = x @ w
        return h * lax.rsqrt(jnp.mean(h * h, -1, keepdims=True) + 1e-6)


    def up_norm_tp(x, w, mesh):
        def local(x, w):
            h = x @ w
            ms = lax.psum(jnp.sum(h * h, -1, keepdims=True), "tp") / F
            return h * lax.rsqrt(ms + 1e-6)
        return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(None, "tp")), out_specs=P(None, "tp"))(x, w)


    def up_norm_tp_local(x, w, mesh):
        def local(x, w):
            h = x @ w
            ms = jnp.sum(h * h, -1, keepdims=True) / F  # MARK:ms
            return h * lax.rsqrt(ms + 1e-6)
        return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(None, "tp")), out_specs=P(None, "tp"))(x, w)
    """
).lstrip()

MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {name}, reference: model.py:{ref}, distributed: model.py:{func}, inputs: model.py:{inputs}, "
    f"mesh: {{{mesh}: 4}}}}\n"
    for name, ref, func, inputs, mesh in [
        ("cp", "attention", "attention_cp", "inputs", "cp"),
        ("cp-local-den", "attention", "attention_cp_local_den", "inputs", "cp"),
        ("norm", "up_norm", "up_norm_tp", "norm_inputs", "tp"),
        ("norm-local", "up_norm", "up_norm_tp_local", "norm_inputs", "tp"),
    ]
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("unreduced_partial"), "model.py", MODEL, MANIFEST)


@pytest.mark.parametrize("name", ["cp", "norm"])
def test_near_miss_the_all_reduced_sum_is_no_mismatch(manifest, name):
    assert verify_named(manifest, name).status != Status.MISMATCH


@pytest.mark.parametrize(("name", "mark"), [("cp-local-den", "den"), ("norm-local", "ms")])
def test_the_partial_sum_without_its_all_reduce_leads(manifest, name, mark):
    result = verify_named(manifest, name)
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("model.py", line_of(MODEL, mark)), result.findings
    assert "partial sum over mesh axis" in lead.message and "psum (all-reduce) over that axis is missing" in lead.message
