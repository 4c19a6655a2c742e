"""A convolution whose windows tile its input (stride = window, no padding or dilation) is a
patchify followed by a dot (translate/convolutions.py), checked against XLA for several dim layouts,
a window that leaves rows over, and bf16 operands. A dot of a reshape that merges the contracted
dims apart from the free dims is the reshape of the dot (translate/relayouts.py, `_kept_apart`),
so a patch embedding by `conv_general_dilated` meets one written with reshapes and transposes, in
f32 and with the image rounded to bf16 before the convolution or the patches after the patchify.
Near misses: a kernel laid out (kh, kw, c) against patches in (c, kh, kw) order, overlapping
windows (stride 1) and a bf16 convolution against an f32 reference must not verify."""

from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import model_package
import numpy as np
import pytest
from jax import lax

from equivci.hlo.parser import parse_module
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.evaluator import Evaluator

RNG = np.random.default_rng(23)


def _translated(fn, *args):
    module = parse_module(jax.jit(fn).lower(*args).as_text(dialect="hlo"))
    table = TermTable()
    ev = Evaluator(module, table, 1)
    params = [[table.make("param", (k,), (), a.shape, str(a.dtype).replace("float", "f"))] for k, a in enumerate(args)]
    (out,) = ev.run(module.entry, params)
    return out, ev


CASES = {
    # image layout, kernel layout, output layout, image shape, kernel shape, window
    "nchw": (("NCHW", "OIHW", "NCHW"), (2, 3, 8, 8), (5, 3, 2, 2), (2, 2)),
    "nhwc": (("NHWC", "HWIO", "NHWC"), (2, 8, 6, 3), (2, 3, 3, 5), (2, 3)),
    "rows-left-over": (("NCHW", "OIHW", "NHWC"), (1, 2, 7, 9), (4, 2, 2, 4), (2, 4)),
    "one-dim": (("NWC", "WIO", "NCW"), (3, 12, 2), (4, 2, 6), (4,)),
    "pointwise": (("NCHW", "OIHW", "NCHW"), (2, 3, 4, 4), (6, 3, 1, 1), (1, 1)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_convolution_whose_windows_tile_its_input_computes_what_xla_computes(case):
    labels, x_shape, k_shape, window = CASES[case]
    x, k = (RNG.standard_normal(s).astype(np.float32) for s in (x_shape, k_shape))

    def fn(x, k):
        return lax.conv_general_dilated(x, k, window, "VALID", dimension_numbers=labels)

    out, ev = _translated(fn, x, k)
    assert "opaque" not in repr(out)
    got = evaluate(out, {0: x, 1: k}, ev.values)
    np.testing.assert_allclose(got, np.asarray(jax.jit(fn)(x, k)), rtol=1e-5, atol=1e-5)


def test_a_bf16_convolution_accumulated_in_f32_computes_what_xla_computes():
    x = RNG.standard_normal((2, 3, 8, 8)).astype(jnp.bfloat16)
    k = RNG.standard_normal((5, 3, 2, 2)).astype(jnp.bfloat16)

    def fn(x, k):
        return lax.conv_general_dilated(x, k, (2, 2), "VALID", preferred_element_type=jnp.float32)

    out, ev = _translated(fn, x, k)
    assert out.dtype == "f32" and "opaque" not in repr(out)
    got = evaluate(out, {0: x.astype(np.float32), 1: k.astype(np.float32)}, ev.values)
    np.testing.assert_allclose(got, np.asarray(jax.jit(fn)(x, k)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "window, strides, padding, dilation",
    [
        ((2, 2), (1, 1), "VALID", (1, 1)),
        ((1, 1), (2, 2), "VALID", (1, 1)),
        ((2, 2), (2, 2), [(1, 1), (1, 1)], (1, 1)),
        ((3, 3), (3, 3), "VALID", (2, 2)),
    ],
    ids=["overlapping", "subsampling", "padded", "dilated"],
)
def test_other_convolutions_stay_opaque(window, strides, padding, dilation):
    x = RNG.standard_normal((1, 2, 9, 9)).astype(np.float32)
    k = RNG.standard_normal((3, 2, *window)).astype(np.float32)

    def fn(x, k):
        return lax.conv_general_dilated(x, k, strides, padding, rhs_dilation=dilation)

    out, _ = _translated(fn, x, k)
    assert out.op == "opaque"


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    BF, F32 = jnp.bfloat16, jnp.float32
    B, C, IMG, PATCH, D = 4, 3, 8, 2, 16
    G = IMG // PATCH


    def inputs():
        return jax.ShapeDtypeStruct((B, C, IMG, IMG), F32), jax.ShapeDtypeStruct((C * PATCH * PATCH, D), F32)


    def patchify(img):
        x = img.reshape(img.shape[0], C, G, PATCH, G, PATCH).transpose(0, 2, 4, 1, 3, 5)
        return x.reshape(img.shape[0], G * G, C * PATCH * PATCH)


    def embed(img, w):
        return patchify(img) @ w


    def embed_bf16(img, w):
        return jnp.matmul(patchify(img).astype(BF), w.astype(BF), preferred_element_type=F32)


    def _conv(img, w, dtype=F32, kernel=lambda w: w.reshape(C, PATCH, PATCH, D).transpose(3, 0, 1, 2), stride=PATCH):
        y = lax.conv_general_dilated(img.astype(dtype), kernel(w).astype(dtype), (stride, stride), "VALID",
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"), preferred_element_type=F32)
        return y[:, :, :G, :G].reshape(img.shape[0], D, G * G).transpose(0, 2, 1)


    def _on_rows(fn, img, w, mesh):
        return jax.shard_map(fn, mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data"))(img, w)


    def conv_f32(img, w, mesh):
        return _on_rows(_conv, img, w, mesh)


    def conv_bf16(img, w, mesh):
        return _on_rows(lambda i, w: _conv(i, w, BF), img, w, mesh)


    def conv_hwc_kernel(img, w, mesh):
        hwc = lambda w: w.reshape(PATCH, PATCH, C, D).transpose(3, 2, 0, 1)
        return _on_rows(lambda i, w: _conv(i, w, kernel=hwc), img, w, mesh)


    def conv_overlapping(img, w, mesh):
        return _on_rows(lambda i, w: _conv(i, w, stride=1), img, w, mesh)
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    text = model_package.manifest_text(
        [
            ("conv-f32", "embed", "conv_f32"),
            ("conv-bf16", "embed_bf16", "conv_bf16"),
            ("conv-hwc-kernel", "embed", "conv_hwc_kernel"),
            ("conv-overlapping", "embed", "conv_overlapping"),
            ("conv-bf16-f32-reference", "embed", "conv_bf16"),
        ],
        "{data: 2}",
    )
    return model_package.write_package(tmp_path_factory.mktemp("strided_convolutions"), "model.py", MODELS, text)


@pytest.mark.parametrize("name", ["conv-f32", "conv-bf16"])
def test_a_strided_conv_patch_embedding_on_data_shards_verifies(manifest, name):
    result = model_package.verify_named(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["conv-hwc-kernel", "conv-overlapping"])
def test_near_miss_convolutions_are_mismatches(manifest, name):
    result = model_package.verify_named(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)


def test_near_miss_a_conv_in_bf16_against_an_f32_reference_is_not_verified(manifest):
    """The rounding moves into the patches; it does not go away."""
    result = model_package.verify_named(manifest, "conv-bf16-f32-reference")
    assert result.status is not Status.VERIFIED, result.findings
