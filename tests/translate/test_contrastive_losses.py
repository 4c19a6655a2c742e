"""Contrastive losses over a data-parallel batch: each device scores its own rows against the whole
batch gathered, labels its rows by their global ids `axis_index * n + arange(n)`, and the shares
are pmean-ed or psum-ed.

Two facts carry them: a transpose of a value scaled by one computed number is the transposed value
scaled (`scaled_dots.transposed_scalar`: CLIP's `logits.T` of `(exp(t) * zi) @ zt.T`, where a device
scores the other direction as `(exp(t) * zt[rows]) @ zi.T`), and a sum over devices of a shared
map of each device's reduction is also the map of the sum of the reductions, and a sum over devices
of two values each is the sum of their sums (`linear_sums`: the temperature's gradient, each
device's reduce over its rows times the shared temperature; a loss's two directions). The stated
pairs are checked numerically; on JAX programs, CLIP's symmetric InfoNCE loss with a learned
temperature, a SigLIP-style sigmoid loss, and the temperature's gradient verify. Near misses: the
labels without the device's offset, the shares psum-ed where they must be averaged, and the
temperature left out of one direction.
"""

from __future__ import annotations

import textwrap

import jax.numpy as jnp
import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify
from one_device import evaluated

from equivci.results import Status
from equivci.terms.semantics import evaluate

RNG = np.random.default_rng(5)
ZI, ZT = RNG.standard_normal((6, 4)).astype(np.float32), RNG.standard_normal((5, 4)).astype(np.float32)
T = np.float32(0.3)

TRANSPOSED = {
    "scaled operand of a dot": lambda zi, zt, t: ((jnp.exp(t) * zi) @ zt.T).T,
    "scaled rhs of a dot": lambda zi, zt, t: (zi @ (zt.T * jnp.exp(t))).T,
    "scaled product": lambda zi, zt, t: (jnp.tanh(zi @ zt.T) * jnp.exp(t)).T,
    "divided operand of a dot": lambda zi, zt, t: ((zi / jnp.exp(t)) @ zt.T).T,
    "divided product": lambda zi, zt, t: (jnp.tanh(zi @ zt.T) / jnp.exp(t)).T,
}


def _groups(fn):
    """The groups the evaluator states for fn's program that hold a transpose, and the input values."""
    args = (ZI, ZT, T)
    ev, values = evaluated(fn, args)
    groups = [g for g in ev.equal_terms if len(g) > 1 and g[0].op == "transpose" and g[1].op == "binary"]
    return ev, groups, values


@pytest.mark.parametrize("case", sorted(TRANSPOSED))
def test_a_transpose_of_a_value_scaled_by_one_number_is_stated_as_the_transposed_value_scaled(case):
    ev, groups, values = _groups(TRANSPOSED[case])
    assert groups, "no transposed scale stated"
    for group in groups:
        first = evaluate(group[0], values, ev.values)
        for other in group[1:]:
            np.testing.assert_allclose(evaluate(other, values, ev.values), first, rtol=1e-5, atol=1e-5)


def test_a_scale_that_varies_along_a_dim_is_not_moved_through_a_transpose():
    _, groups, _ = _groups(lambda zi, zt, t: ((zi * jnp.exp(zi[:, :1] + t)) @ zt.T).T)
    assert not groups


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    N, D, E, DP = 8, 6, 4, 4
    NL = N // DP


    def inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
        return f(D, E), f(D, E), f(), f(), f(N, D), f(N, D)


    def embed(w, x):
        z = x @ w
        return z / jnp.linalg.norm(z, axis=-1, keepdims=True)


    def xent(logits, labels):
        return jax.nn.logsumexp(logits, axis=-1) - jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]


    def clip(wi, wt, t, b, img, txt):
        zi, zt = embed(wi, img), embed(wt, txt)
        logits = jnp.exp(t) * zi @ zt.T
        labels = jnp.arange(N)
        return (xent(logits, labels).mean() + xent(logits.T, labels).mean()) / 2


    def _on_rows(local, out=P()):
        def run(wi, wt, t, b, img, txt, *, mesh):
            specs = (P(), P(), P(), P(), P("dp"), P("dp"))
            return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=out, check_vma=False)(
                wi, wt, t, b, img, txt)
        return run


    def _my_rows():
        return lax.axis_index("dp") * NL + jnp.arange(NL)


    def _clip_rows(rows_fn, scale_t=True):
        def local(wi, wt, t, b, img, txt):
            zi = embed(wi, lax.all_gather(img, "dp", tiled=True))
            zt = embed(wt, lax.all_gather(txt, "dp", tiled=True))
            rows = rows_fn()
            s = jnp.exp(t)
            a = xent(s * zi[rows] @ zt.T, rows).mean()
            c = xent((s if scale_t else 1.0) * zt[rows] @ zi.T, rows).mean()
            return lax.pmean((a + c) / 2, "dp")
        return local


    clip_dp = _on_rows(_clip_rows(_my_rows))
    clip_dp_local_labels = _on_rows(_clip_rows(lambda: jnp.arange(NL)))
    clip_dp_unscaled_texts = _on_rows(_clip_rows(_my_rows, scale_t=False))


    def siglip(wi, wt, t, b, img, txt):
        zi, zt = embed(wi, img), embed(wt, txt)
        logits = jnp.exp(t) * zi @ zt.T + b
        signs = 2 * jnp.eye(N) - 1
        return -jax.nn.log_sigmoid(signs * logits).sum() / N


    def _siglip_local(reduce):
        def local(wi, wt, t, b, img, txt):
            zi = embed(wi, img)
            zt = embed(wt, lax.all_gather(txt, "dp", tiled=True))
            logits = jnp.exp(t) * zi @ zt.T + b
            signs = 2 * (_my_rows()[:, None] == jnp.arange(N)[None, :]).astype(jnp.float32) - 1
            return reduce(-jax.nn.log_sigmoid(signs * logits).sum() / N)
        return local


    siglip_dp = _on_rows(_siglip_local(lambda v: lax.psum(v, "dp")))
    siglip_dp_averaged = _on_rows(_siglip_local(lambda v: lax.pmean(v, "dp")))


    def temperature_grad(wi, wt, t, b, img, txt):
        def loss(t):
            zi, zt = embed(wi, img), embed(wt, txt)
            return xent(jnp.exp(t) * zi @ zt.T, jnp.arange(N)).mean()
        return jax.grad(loss)(t)


    def _temperature_grad_local(reduce):
        def local(wi, wt, t, b, img, txt):
            zi = embed(wi, lax.all_gather(img, "dp", tiled=True))
            zt = embed(wt, lax.all_gather(txt, "dp", tiled=True))
            rows = _my_rows()
            g = jax.grad(lambda t: xent(jnp.exp(t) * zi[rows] @ zt.T, rows).mean())(t)
            return reduce(g)
        return local


    temperature_grad_dp = _on_rows(_temperature_grad_local(lambda g: lax.pmean(g, "dp")))
    temperature_grad_dp_summed = _on_rows(_temperature_grad_local(lambda g: lax.psum(g, "dp")))
    """
)

CASES = [
    ("clip", "clip", "clip_dp"),
    ("clip-local-labels", "clip", "clip_dp_local_labels"),
    ("clip-unscaled-texts", "clip", "clip_dp_unscaled_texts"),
    ("siglip", "siglip", "siglip_dp"),
    ("siglip-averaged", "siglip", "siglip_dp_averaged"),
    ("temperature-grad", "temperature_grad", "temperature_grad_dp"),
    ("temperature-grad-summed", "temperature_grad", "temperature_grad_dp_summed"),
]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(
        tmp_path_factory.mktemp("contrastive"), "model.py", MODELS, model_package.manifest_text(CASES, "{dp: 4}")
    )


@pytest.mark.parametrize("name", ["clip", "siglip", "temperature-grad"])
def test_contrastive_losses_on_gathered_rows_verify(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize(
    "name", ["clip-local-labels", "clip-unscaled-texts", "siglip-averaged", "temperature-grad-summed"]
)
def test_near_miss_labels_without_offset_scale_dropped_or_wrong_reduction_is_a_mismatch(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
