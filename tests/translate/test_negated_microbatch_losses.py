"""Negated losses accumulated over microbatches (terms/rules/elementwise.py, `negate_add`): the sum
of negations is the negation of the sum, (-x) + (-y) = -(x + y), exact in floats too (rounding to
nearest is symmetric), so that each microbatch's -mean(...) added up on a data shard, then
pmean-ed, meets the reference's one negated mean over the batch. Three styles: a cross entropy
over Python-unrolled microbatches, the same accumulated in a `lax.fori_loop` (dynamic slices), and
a negated mean square accumulated by a `lax.scan` over reshaped microbatches. Near misses: one
microbatch's loss subtracted instead of added; the accumulation divided by the devices only, not
the microbatches (mismatch both)."""

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
    from jax import lax
    from jax.sharding import PartitionSpec as P

    N, D, C, KMB = 16, 8, 8, 2


    def inputs():
        return (jax.ShapeDtypeStruct((D, C), jnp.float32), jax.ShapeDtypeStruct((N, D), jnp.float32),
                jax.ShapeDtypeStruct((N,), jnp.int32))


    def _xent(w, x, y):
        logp = jax.nn.log_softmax(x @ w, -1)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], -1))


    def _neg_square(w, x, y):
        return -jnp.mean(jnp.square(jnp.tanh(x @ w)))


    def xent(w, x, y):
        return _xent(w, x, y)


    def neg_square(w, x, y):
        return _neg_square(w, x, y)


    def _shard(local, w, x, y, mesh):
        rows = P("d")
        return jax.shard_map(local, mesh=mesh, in_specs=(P(), rows, rows), out_specs=P(), check_vma=False)(w, x, y)


    def _unrolled(w, x, y, mesh, sign, count):
        def local(w, x, y):
            mb = x.shape[0] // KMB
            parts = [_xent(w, x[i * mb:(i + 1) * mb], y[i * mb:(i + 1) * mb]) for i in range(KMB)]
            total = parts[0] + sign * sum(parts[1:])
            return lax.pmean(total / count, "d")

        return _shard(local, w, x, y, mesh)


    def xent_unrolled(w, x, y, *, mesh):
        return _unrolled(w, x, y, mesh, 1.0, KMB)


    def xent_unrolled_subtracted(w, x, y, *, mesh):
        return _unrolled(w, x, y, mesh, -1.0, KMB)


    def xent_fori(w, x, y, *, mesh):
        def local(w, x, y):
            mb = x.shape[0] // KMB

            def body(i, acc):
                x_i = lax.dynamic_slice_in_dim(x, i * mb, mb)
                y_i = lax.dynamic_slice_in_dim(y, i * mb, mb)
                return acc + _xent(w, x_i, y_i)

            return lax.pmean(lax.fori_loop(0, KMB, body, jnp.float32(0.0)) / KMB, "d")

        return _shard(local, w, x, y, mesh)


    def _scanned(w, x, y, mesh, count):
        def local(w, x, y):
            xs = x.reshape(KMB, -1, x.shape[-1])

            def step(acc, x_i):
                return acc + _neg_square(w, x_i, None), None

            total, _ = lax.scan(step, jnp.float32(0.0), xs)
            return lax.psum(total, "d") / count

        return _shard(local, w, x, y, mesh)


    def neg_square_scan(w, x, y, *, mesh):
        return _scanned(w, x, y, mesh, 2 * KMB)


    def neg_square_scan_devices_only(w, x, y, *, mesh):
        return _scanned(w, x, y, mesh, 2)
    """
)

CASES = {
    "xent-unrolled": ("xent", "xent_unrolled", Status.VERIFIED),
    "xent-unrolled-subtracted": ("xent", "xent_unrolled_subtracted", Status.MISMATCH),
    "xent-fori": ("xent", "xent_fori", Status.VERIFIED),
    "neg-square-scan": ("neg_square", "neg_square_scan", Status.VERIFIED),
    "neg-square-scan-devices-only": ("neg_square", "neg_square_scan_devices_only", Status.MISMATCH),
}


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    text = model_package.manifest_text([(name, ref, dist) for name, (ref, dist, _) in CASES.items()], "{d: 2}")
    text = text.replace("mesh: {d: 2}}", "mesh: {d: 2}, int_range: [0, 8]}")
    return model_package.write_package(tmp_path_factory.mktemp("negated_microbatch_losses"), "model.py", MODELS, text)


# one style and its near miss by default, the other styles slow (each verifies a training step: ~20 s)
SLOW = ("xent-fori", "neg-square-scan", "neg-square-scan-devices-only")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in CASES])
def test_negated_microbatch_losses_meet_the_negated_mean(manifest, name):
    result = _verify(manifest, name)
    assert result.status is CASES[name][2], (result.status, result.findings)
