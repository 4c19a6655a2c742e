"""Losses of training steps summed over devices and microbatches, two general facts.

Means over a count with an odd part (translate/builder.py, `Builder.quotient_scale`): a mean over
16 rows x 6 outputs is (1/32 * sum) / 3 in the reference and (1/16 * sum_d) / 3 on each of 2 data
shards; psummed and divided by the devices, quotients by one count are the quotient of their sum,
sum_d (a * x_d) / c = (a * sum_d x_d) / c, and a constant factor joins a quotient's,
k * ((a * x) / c) = ((k * a) * x) / c (exact over the reals). Styles: a pmean-ed loss of a
momentum step on FSDP shards (gradients reduce-scattered); a loss accumulated over Python-unrolled
microbatches of 3 classes each, divided by their count, then psummed; a global-norm clip whose
squared norm is a psum of per-shard sums. Near misses: the loss psummed without the division by
the devices; the clip's norm over the device's shard only.

Negated losses accumulated over microbatches (terms/rules/elementwise.py, `negate_add`): the sum
of negations is the negation of the sum, (-x) + (-y) = -(x + y), exact in floats too (rounding to
nearest is symmetric), so that each microbatch's -mean(...) added up on a data shard, then
pmean-ed, meets the reference's one negated mean. Styles: a cross entropy over Python-unrolled
microbatches, the same in a `lax.fori_loop` (dynamic slices), a negated mean square in a `lax.scan`
over reshaped microbatches. Near misses: one microbatch's loss subtracted; the accumulation divided
by the devices only, not the microbatches.

Mismatch for every near miss. The first style of each fact runs by default, the others and the
near misses are slow (a near miss's localization: up to a minute)."""

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

    N, DI, DO, C, D, V, KMB = 16, 8, 6, 3, 8, 8, 2


    def fsdp_inputs():
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
            g = lax.psum_scatter(g, "d", tiled=True) / lax.axis_size("d")
            m = 0.9 * m + g
            loss = lax.psum(loss, "d")
            return (w - 0.1 * m, m), loss / lax.axis_size("d") if divided else loss

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
            g = lax.psum_scatter(g, "d", tiled=True) / lax.axis_size("d")
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


    def loss_inputs():
        return (jax.ShapeDtypeStruct((D, V), jnp.float32), jax.ShapeDtypeStruct((N, D), jnp.float32),
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

# name -> (reference, distributed, inputs, expected status)
CASES = {
    "mse-fsdp": ("mse_step", "mse_fsdp", "fsdp_inputs", Status.VERIFIED),
    "mse-fsdp-undivided": ("mse_step", "mse_fsdp_undivided", "fsdp_inputs", Status.MISMATCH),
    "class-loss-micro": ("class_loss", "class_loss_micro", "fsdp_inputs", Status.VERIFIED),
    "clipped-fsdp": ("clipped_step", "clipped_fsdp", "fsdp_inputs", Status.VERIFIED),
    "clipped-fsdp-shard-norm": ("clipped_step", "clipped_fsdp_shard_norm", "fsdp_inputs", Status.MISMATCH),
    "xent-unrolled": ("xent", "xent_unrolled", "loss_inputs", Status.VERIFIED),
    "xent-unrolled-subtracted": ("xent", "xent_unrolled_subtracted", "loss_inputs", Status.MISMATCH),
    "xent-fori": ("xent", "xent_fori", "loss_inputs", Status.VERIFIED),
    "neg-square-scan": ("neg_square", "neg_square_scan", "loss_inputs", Status.VERIFIED),
    "neg-square-scan-devices-only": ("neg_square", "neg_square_scan_devices_only", "loss_inputs", Status.MISMATCH),
}
# (by default the first style of each fact; the near misses' localization takes long)
SLOW = tuple(name for name in CASES if name not in ("mse-fsdp", "xent-unrolled"))


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    text = "version: 1\nmodels:\n" + "".join(
        f"  - {{name: {name}, reference: model.py:{ref}, distributed: model.py:{dist}, inputs: model.py:{inputs}, "
        "mesh: {d: 2}, int_range: [0, 8]}\n"
        for name, (ref, dist, inputs, _) in CASES.items()
    )
    return model_package.write_package(tmp_path_factory.mktemp("training_losses"), "model.py", MODELS, text)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in CASES])
def test_training_losses_over_devices_and_microbatches(manifest, name):
    result = _verify(manifest, name)
    assert result.status is CASES[name][3], (result.status, result.findings)
