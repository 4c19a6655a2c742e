"""Means over a count with an odd part, summed over devices (translate/builder.py,
`Builder.quotient_scale`): a mean over rows x 6 outputs is (1/32 * sum) / 3 in the reference and
(1/8 * sum_d) / 3 on each of 4 data shards; psummed and divided by the devices, the quotients by one
count are the quotient of their sum, sum_d (a * x_d) / c = (a * sum_d x_d) / c, and a constant
factor joins a quotient's, k * ((a * x) / c) = ((k * a) * x) / c (exact over the reals). Three
styles: a pmean-ed loss of a momentum step on FSDP shards (its gradients reduce-scattered); a
loss accumulated over Python-unrolled microbatches of 3 classes each, divided by their count, then
psummed; a global-norm clip whose squared norm is a psum of per-shard sums, beside the mean loss.
Near misses: the loss psummed without the division by the devices; the clip's norm taken over the
device's shard only (mismatch both)."""

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

    N, DI, DO, C, KMB = 16, 8, 6, 3, 2


    def inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
        return f(DI, DO), f(DI, DO), f(N, DI), f(N, DO)


    def _mse(w, x, y):
        return jnp.mean(jnp.square(jnp.tanh(x @ w) - y))


    def mse_step(w, m, x, y):
        loss, g = jax.value_and_grad(_mse)(w, x, y)
        m = 0.9 * m + g
        return (w - 0.1 * m, m), loss


    def _fsdp(w, m, x, y, mesh, divided):
        def local(w, m, x, y):
            loss, g = jax.value_and_grad(_mse)(lax.all_gather(w, "d", tiled=True), x, y)
            g = lax.psum_scatter(g, "d", tiled=True) / 4
            m = 0.9 * m + g
            loss = lax.psum(loss, "d")
            return (w - 0.1 * m, m), loss / 4 if divided else loss

        rows = P("d")
        return jax.shard_map(local, mesh=mesh, in_specs=(rows, rows, rows, rows), out_specs=((rows, rows), P()),
                             check_vma=False)(w, m, x, y)


    def mse_fsdp(w, m, x, y, *, mesh):
        return _fsdp(w, m, x, y, mesh, True)


    def mse_fsdp_undivided(w, m, x, y, *, mesh):
        return _fsdp(w, m, x, y, mesh, False)


    def _classes(w, x, y):
        return jnp.mean(jnp.square(x @ w[:, :C] - y[:, :C]))


    def class_loss(w, m, x, y):
        return _classes(w, x, y)


    def class_loss_micro(w, m, x, y, *, mesh):
        def local(w, x, y):
            mb = x.shape[0] // KMB
            total = sum(_classes(w, x[i * mb:(i + 1) * mb], y[i * mb:(i + 1) * mb]) for i in range(KMB))
            return lax.psum(total / KMB, "d") / lax.axis_size("d")

        rows = P("d")
        return jax.shard_map(local, mesh=mesh, in_specs=(P(), rows, rows), out_specs=P(), check_vma=False)(w, x, y)


    def clipped_step(w, m, x, y):
        loss, g = jax.value_and_grad(_mse)(w, x, y)
        norm = jnp.sqrt(jnp.sum(jnp.square(g)))
        g = g * jnp.minimum(1.0, 0.5 / (norm + 1e-6))
        return w - 0.1 * g, (loss, norm)


    def _clipped(w, m, x, y, mesh, over_shards):
        def local(w, x, y):
            loss, g = jax.value_and_grad(_mse)(lax.all_gather(w, "d", tiled=True), x, y)
            g = lax.psum_scatter(g, "d", tiled=True) / 4
            squares = jnp.sum(jnp.square(g))
            norm = jnp.sqrt(lax.psum(squares, "d") if over_shards else squares)
            g = g * jnp.minimum(1.0, 0.5 / (norm + 1e-6))
            return w - 0.1 * g, (lax.pmean(loss, "d"), norm)

        rows = P("d")
        return jax.shard_map(local, mesh=mesh, in_specs=(rows, rows, rows), out_specs=(rows, (P(), P())),
                             check_vma=False)(w, x, y)


    def clipped_fsdp(w, m, x, y, *, mesh):
        return _clipped(w, m, x, y, mesh, True)


    def clipped_fsdp_shard_norm(w, m, x, y, *, mesh):
        return _clipped(w, m, x, y, mesh, False)
    """
)

CASES = {
    "mse-fsdp": ("mse_step", "mse_fsdp", Status.VERIFIED),
    "mse-fsdp-undivided": ("mse_step", "mse_fsdp_undivided", Status.MISMATCH),
    "class-loss-micro": ("class_loss", "class_loss_micro", Status.VERIFIED),
    "clipped-fsdp": ("clipped_step", "clipped_fsdp", Status.VERIFIED),
    "clipped-fsdp-shard-norm": ("clipped_step", "clipped_fsdp_shard_norm", Status.MISMATCH),
}


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    text = model_package.manifest_text([(name, ref, dist) for name, (ref, dist, _) in CASES.items()], "{d: 4}")
    return model_package.write_package(tmp_path_factory.mktemp("odd_count_means"), "model.py", MODELS, text)


# one style and its near miss by default, the other styles slow (each verifies a training step: ~20 s)
SLOW = ("class-loss-micro", "clipped-fsdp", "clipped-fsdp-shard-norm")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in CASES])
def test_means_over_odd_counts_summed_over_devices(manifest, name):
    result = _verify(manifest, name)
    assert result.status is CASES[name][2], (result.status, result.findings)
