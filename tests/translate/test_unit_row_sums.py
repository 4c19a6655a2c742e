"""A reduction over a size-1 dim among others is also stated as written, over every dim
(reductions.over_unit_dims): a data shard of one row reduced to a scalar and all-reduced is the sum
(or max) of the devices' reductions of adjacent windows of the reduced dim, which merge into the
reference's reduction only where each device's value is known as a reduction over that dim. A
masked token mean on one row per device, in three styles, verifies; the mean of the per-device
masked means (devices hold different numbers of unmasked tokens) is a counterexample."""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest

from equivci.hlo.ir import Shape
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.builder import Builder
from equivci.translate.reductions import over_unit_dims, reduction

MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, S = 4, 8  # one row per device on {data: 4}


    def inputs():
        return jax.ShapeDtypeStruct((B, S), jnp.float32), jax.ShapeDtypeStruct((B, S), jnp.bool_)


    def masked_mean(y, mask):
        return jnp.where(mask, y, 0.0).sum() / jnp.maximum(mask.sum(), 1)


    def _sharded(local, y, mask, mesh):
        return jax.shard_map(local, mesh=mesh, in_specs=(P("data"), P("data")), out_specs=P(), check_vma=False)(
            y, mask)


    def masked_mean_psums(y, mask, *, mesh):  # the sum and the count reduced separately, then divided
        def local(y, mask):
            total = lax.psum(jnp.sum(jnp.where(mask, y, 0.0)), "data")
            return total / jnp.maximum(lax.psum(jnp.sum(mask.astype(jnp.int32)), "data"), 1)

        return _sharded(local, y, mask, mesh)


    def masked_mean_product(y, mask, *, mesh):  # the mask as a float factor, one psum of the pair
        def local(y, mask):
            total, count = lax.psum((jnp.sum(y * mask.astype(jnp.float32)), jnp.sum(mask)), "data")
            return total / jnp.maximum(count, 1)

        return _sharded(local, y, mask, mesh)


    def masked_mean_of_means(y, mask, *, mesh):
        def local(y, mask):
            return lax.pmean(jnp.where(mask, y, 0.0).sum() / jnp.maximum(mask.sum(), 1), "data")  # MARK:means

        return _sharded(local, y, mask, mesh)


    def row_max(y, mask):
        return jnp.max(y)


    def row_max_dp(y, mask, *, mesh):
        return _sharded(lambda y, mask: lax.pmax(jnp.max(y), "data"), y, mask, mesh)
    """
)

CASES = [
    ("psums", "masked_mean", "masked_mean_psums"),
    ("product", "masked_mean", "masked_mean_product"),
    ("means", "masked_mean", "masked_mean_of_means"),
    ("max", "row_max", "row_max_dp"),
]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    text = model_package.manifest_text(CASES, "{data: 4}")
    return model_package.write_package(tmp_path_factory.mktemp("unit_rows"), "model.py", MODELS, text)


@pytest.mark.parametrize("name", ["psums", "product", "max"])
def test_one_row_per_device_reduced_and_all_reduced_verifies(manifest, name):
    result = model_package.verify_named(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


def test_the_mean_of_per_device_masked_means_is_a_mismatch(manifest):
    result = model_package.verify_named(manifest, "means")
    assert result.status is Status.MISMATCH, result.findings


def test_the_written_reduction_is_the_normal_form_numerically():
    ev = Builder(None, TermTable(), 1)  # type: ignore[arg-type]
    x = ev.table.make("param", (0,), (), (1, 8), "f32")
    out = Shape("f32", ())
    term = reduction(ev, "add", x, (0, 1), out)
    written = over_unit_dims(ev, "add", x, (0, 1), out)
    assert written is not None and written is not term and written.op == "reduce"
    assert [term, written] in ev.equal_terms
    values = {0: np.random.default_rng(3).standard_normal((1, 8)).astype(np.float32)}
    np.testing.assert_allclose(evaluate(term, values), evaluate(written, values), rtol=1e-6)
    np.testing.assert_allclose(evaluate(written, values), values[0].sum(), rtol=1e-6)
    # no size-1 reduced dim: nothing to state
    assert over_unit_dims(ev, "add", ev.table.make("param", (1,), (), (2, 8), "f32"), (0, 1), out) is None
