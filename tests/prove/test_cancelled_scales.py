"""A scaling by a power of two undone (rule elementwise/cancel_power_of_two): x * c = y * c gives
x = y for c a nonzero float power of two, exact in floats away from the ends of the exponent
range. The builder puts a product's power of two in front (a label-smoothed loss is 2^-23 times
its terms); a value proved equal to the reference only with that factor in front is then equal
without it, as the sum of its rows over the data shards (its mean over the batch) needs.

The guard, on the e-graph: a factor of 3, of 0, of infinity, or of an integer 2 (which wraps)
concludes nothing. End to end: a vocabulary-parallel, label-smoothed loss on {data: 2, vocab: 2}
whose batch mean is pmean-ed over `data` (style 1) or psum-ed and divided by the global count
(style 2); near miss: the local mean never reduced over `data` (mismatch)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import model_package
import pytest
from egglog import EGraph, union
from model_package import verify_named as _verify

from equivci.prove.saturate import _run, proved_equal
from equivci.results import Status
from equivci.terms.load import Loader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "terms"))
from test_rules_numeric import B  # noqa: E402  (term builders that compute shapes as the evaluator does)


def _concluded(value: float, dtype: str = "f32") -> bool:
    """Whether p * c = q * c, stated, makes the rewrites prove p = q (two distinct inputs)."""
    b = B()
    p, q = b.param(0, (3, 4), dtype), b.param(1, (3, 4), dtype)
    c = b.splat(value, (3, 4), dtype)
    egraph = EGraph()
    loader = Loader(egraph)
    x, y = loader.expr(p), loader.expr(q)
    loader.facts.append(union(loader.expr(b.bi("multiply", p, c))).with_(loader.expr(b.bi("multiply", q, c))))
    loader.flush()
    _run(egraph, 6)
    return proved_equal(egraph, x, y)


@pytest.mark.parametrize("value", [0.25, -8.0, 2.0**-23, 1.0])
def test_a_power_of_two_factor_cancels(value):
    assert _concluded(value)


@pytest.mark.parametrize(
    ("value", "dtype"),
    [(3.0, "f32"), (0.1, "f32"), (0.0, "f32"), (float("inf"), "f32"), (2.0, "s32")],
)
def test_near_miss_other_factors_cancel_nothing(value, dtype):
    """3 and 0.1 round (3x = 3y in f32 for neighbouring x, y), 0 and inf erase x, integers wrap."""
    assert not _concluded(value, dtype)


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, T, V, D = 4, 4, 16, 8
    EPS = 0.1


    def inputs():
        f = jnp.float32
        return (jax.ShapeDtypeStruct((V, D), f), jax.ShapeDtypeStruct((B, T, D), f),
                jax.ShapeDtypeStruct((B, T), jnp.int32))


    def smoothed(table, h, targets):
        logp = jax.nn.log_softmax(h @ table.T, axis=-1)
        nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
        per_token = (1.0 - EPS) * nll - EPS * logp.mean(axis=-1)
        return per_token, per_token.mean()


    def _local(table, h, targets, reduce_mean):
        n = table.shape[0]
        start = lax.axis_index("vocab") * n
        logits = h @ table.T
        m = lax.pmax(lax.stop_gradient(logits.max(axis=-1)), "vocab")
        lse = jnp.log(lax.psum(jnp.sum(jnp.exp(logits - m[..., None]), axis=-1), "vocab")) + m
        tgt = lax.psum(jnp.sum(jax.nn.one_hot(targets - start, n) * logits, axis=-1), "vocab")
        mean_logit = lax.psum(jnp.sum(logits, axis=-1), "vocab") / V
        per_token = (1.0 - EPS) * (lse - tgt) + EPS * (lse - mean_logit)
        return per_token, reduce_mean(per_token)


    def _run(table, h, targets, mesh, reduce_mean):
        return jax.shard_map(lambda t, h, y: _local(t, h, y, reduce_mean), mesh=mesh,
                             in_specs=(P("vocab"), P("data"), P("data")), out_specs=(P("data"), P()),
                             check_vma=False)(table, h, targets)


    def pmean_of_mean(table, h, targets, *, mesh):
        return _run(table, h, targets, mesh, lambda l: lax.pmean(l.mean(), "data"))


    def psum_over_count(table, h, targets, *, mesh):
        return _run(table, h, targets, mesh, lambda l: lax.psum(jnp.sum(l), "data") / (B * T))


    def local_mean(table, h, targets, *, mesh):
        return _run(table, h, targets, mesh, lambda l: l.mean())
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: pmean-of-mean, reference: m.py:smoothed, distributed: m.py:pmean_of_mean, inputs: m.py:inputs,
         mesh: {data: 2, vocab: 2}}
      - {name: psum-over-count, reference: m.py:smoothed, distributed: m.py:psum_over_count, inputs: m.py:inputs,
         mesh: {data: 2, vocab: 2}}
      - {name: local-mean, reference: m.py:smoothed, distributed: m.py:local_mean, inputs: m.py:inputs,
         mesh: {data: 2, vocab: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("cancelled_scales"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["pmean-of-mean", "psum-over-count"])
def test_the_batch_mean_of_a_smoothed_vocab_parallel_loss_verifies(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


def test_near_miss_the_local_mean_never_reduced_over_data_is_a_mismatch(manifest):
    result = _verify(manifest, "local-mean")
    assert result.status is Status.MISMATCH, (result.status, result.findings)
