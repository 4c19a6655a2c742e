"""A float mask converted before or after its broadcast is one value (rule
`elementwise/unary_bcast_lift`: op(bcast(x)) = bcast(op(x)), an elementwise op reads each element
alone and a broadcast copies elements). Masked mean pooling written `where(valid[..., None], h, 0)`
(read as `h * convert(valid[..., None])`, the select's product form) meets a pooling written as an
einsum with `valid.astype(f32)`, whose product form broadcasts the converted mask (split 14's
padded classifier under `vmap(spmd_axis_name=)`).

The rule's instances are checked numerically in tests/terms/test_rules_numeric.py; here models in
three styles verify (shard_map with an einsum, vmap over one example, a product by the mask
given its unit dim first) and the near misses (`<=` for `<`, the complement mask) are mismatches.
"""

from __future__ import annotations

import textwrap

import model_package
import pytest
from model_package import verify_named as _verify

from equivci.results import Status

MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    B, S, D = 4, 16, 8


    def pool_inputs():
        return (jax.ShapeDtypeStruct((B, S, D), jnp.float32), jax.ShapeDtypeStruct((B,), jnp.int32))


    def pool(x, lengths):
        valid = jnp.arange(S)[None, :] < lengths[:, None]
        return jnp.where(valid[..., None], x, 0.0).sum(axis=1) / lengths[:, None]


    def _shards(body, x, lengths, mesh):
        return jax.shard_map(body, mesh=mesh, in_specs=(P("batch"), P("batch")), out_specs=P("batch"))(x, lengths)


    def pool_einsum(x, lengths, mesh):
        def body(x, lengths):
            valid = (jnp.arange(S)[None, :] < lengths[:, None]).astype(x.dtype)
            return jnp.einsum("bs,bsd->bd", valid, x) / lengths[:, None].astype(x.dtype)
        return _shards(body, x, lengths, mesh)


    def pool_product(x, lengths, mesh):
        def body(x, lengths):
            valid = jnp.arange(S)[None, :] < lengths[:, None]
            return (x * valid[..., None].astype(x.dtype)).sum(1) / lengths.astype(x.dtype)[:, None]
        return _shards(body, x, lengths, mesh)


    def _one(cmp):
        def run(x, length):
            valid = cmp(jnp.arange(S), length)
            return jnp.einsum("s,sd->d", valid.astype(x.dtype), x) / length.astype(x.dtype)
        return run


    def pool_vmapped(x, lengths, mesh):
        return jax.vmap(_one(lambda s, n: s < n), spmd_axis_name="batch")(x, lengths)


    def pool_vmapped_inclusive(x, lengths, mesh):
        return jax.vmap(_one(lambda s, n: s <= n), spmd_axis_name="batch")(x, lengths)


    def pool_vmapped_complement(x, lengths, mesh):
        return jax.vmap(_one(lambda s, n: s >= n), spmd_axis_name="batch")(x, lengths)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: pool-einsum, reference: m.py:pool, distributed: m.py:pool_einsum, inputs: m.py:pool_inputs,
         mesh: {batch: 2}}
      - {name: pool-product, reference: m.py:pool, distributed: m.py:pool_product, inputs: m.py:pool_inputs,
         mesh: {batch: 2}}
      - {name: pool-vmapped, reference: m.py:pool, distributed: m.py:pool_vmapped, inputs: m.py:pool_inputs,
         mesh: {batch: 2}}
      - {name: pool-vmapped-inclusive, reference: m.py:pool, distributed: m.py:pool_vmapped_inclusive,
         inputs: m.py:pool_inputs, mesh: {batch: 2}}
      - {name: pool-vmapped-complement, reference: m.py:pool, distributed: m.py:pool_vmapped_complement,
         inputs: m.py:pool_inputs, mesh: {batch: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("masks"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["pool-einsum", "pool-product", "pool-vmapped"])
def test_pooling_by_a_converted_mask_verifies(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["pool-vmapped-inclusive", "pool-vmapped-complement"])
def test_pooling_by_another_mask_is_a_mismatch(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
