"""Convolutions as the dot of the input's windows with the kernel (translate/convolutions.py),
checked against what XLA computes through the terms' numpy semantics, and the convolutions the
handler does not model left opaque."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from one_device import evaluated, op_names

from equivci.terms.semantics import evaluate


def _root(fn, *shapes):
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    ev, values = evaluated(fn, args)
    return ev.events[-1].values[0], values, np.asarray(jax.jit(fn)(*args))


CASES = [
    # (lhs shape, rhs shape, strides, padding, dimension numbers, rhs dilation)
    ((2, 32, 16), (3, 16, 8), (1,), [(1, 1)], ("NWC", "WIO", "NWC"), (1,)),
    ((2, 32, 16), (3, 16, 8), (2,), [(1, 1)], ("NWC", "WIO", "NWC"), (1,)),
    ((1, 17, 4), (3, 4, 8), (2,), "VALID", ("NWC", "WIO", "NWC"), (1,)),
    ((2, 12, 3), (3, 3, 5), (3,), [(2, 0)], ("NWC", "WIO", "NWC"), (1,)),
    ((2, 10, 3), (3, 3, 5), (1,), [(0, -1)], ("NWC", "WIO", "NWC"), (2,)),
    ((2, 11, 3), (2, 3, 4), (3,), "VALID", ("NWC", "WIO", "NWC"), (1,)),
    ((4, 4, 8, 8), (32, 4, 2, 2), (2, 2), "VALID", ("NCHW", "OIHW", "NCHW"), (1, 1)),
    ((2, 3, 9, 7), (5, 3, 3, 2), (2, 1), [(1, 1), (0, 1)], ("NCHW", "OIHW", "NCHW"), (1, 1)),
    ((2, 9, 7, 3), (3, 2, 3, 5), (1, 2), "SAME", ("NHWC", "HWIO", "NHWC"), (1, 2)),
    ((2, 3, 7, 7), (4, 3, 3, 3), (1, 1), "SAME", ("NCHW", "OIHW", "NCHW"), (1, 1)),
]


@pytest.mark.parametrize("lhs, rhs, strides, padding, numbers, dilation", CASES)
def test_a_convolution_is_the_dot_of_its_windows_with_the_kernel(lhs, rhs, strides, padding, numbers, dilation):
    def conv(x, w):
        return lax.conv_general_dilated(x, w, strides, padding, rhs_dilation=dilation, dimension_numbers=numbers)

    term, values, want = _root(conv, lhs, rhs)
    assert "opaque" not in op_names(term) and "dot" in op_names(term)
    np.testing.assert_allclose(evaluate(term, values), want, rtol=1e-5, atol=1e-5)


def test_a_bf16_convolution_with_f32_accumulation_is_the_f32_dot_of_bf16_operands():
    def conv(x, w):
        return lax.conv_general_dilated(
            x.astype(jnp.bfloat16),
            w.astype(jnp.bfloat16),
            (2,),
            [(1, 1)],
            dimension_numbers=("NWC", "WIO", "NWC"),
            preferred_element_type=jnp.float32,
        )

    term, _, _ = _root(conv, (2, 16, 4), (3, 4, 8))
    dots = [t for t in _subterms(term) if t.op == "dot"]
    assert term.dtype == "f32" and "opaque" not in op_names(term)
    assert [(d.dtype, [a.dtype for a in d.args]) for d in dots] == [("f32", ["bf16", "bf16"])]


def _subterms(t):
    seen, stack = [], [t]
    while stack:
        u = stack.pop()
        seen.append(u)
        stack.extend(u.args)
    return seen


@pytest.mark.parametrize(
    "kwargs",
    [{"feature_group_count": 2}, {"batch_group_count": 2}, {"lhs_dilation": (2,)}],
    ids=["feature-groups", "batch-groups", "input-dilation"],
)
def test_near_miss_grouped_and_input_dilated_convolutions_stay_opaque(kwargs):
    def conv(x, w):
        return lax.conv_general_dilated(x, w, (1,), [(1, 1)], dimension_numbers=("NWC", "WIO", "NWC"), **kwargs)

    term, _, _ = _root(conv, (2, 8, 4), (3, 4 // kwargs.get("feature_group_count", 1), 6))
    assert term.op == "opaque"


def test_a_patchified_dot_is_stated_as_the_dot_of_the_patches_with_the_kernel_split_alike():
    """img.reshape(..).transpose(..).reshape(b, n, c*p*p) @ w merges (c, p, p) on one side only; the
    dot with w split alike, read through the relayouts, is stated equal (reductions.dot_with_facts)."""

    def patchified(img, w):
        x = img.reshape(2, 3, 2, 2, 2, 2).transpose(0, 2, 4, 1, 3, 5).reshape(2, 4, 12)
        return x @ w

    rng = np.random.default_rng(1)
    args = [rng.standard_normal((2, 3, 4, 4)).astype(np.float32), rng.standard_normal((12, 5)).astype(np.float32)]
    ev, values = evaluated(patchified, args)
    root = ev.events[-1].values[0]
    stated = [t for group in ev.equal_terms if root in group for t in group if t is not root]
    assert stated and any(t.op == "reshape" for t in stated)
    for t in stated:
        np.testing.assert_allclose(evaluate(t, values), np.asarray(patchified(*args)), rtol=1e-5, atol=1e-5)


DEPTHWISE = [
    # (lhs shape, rhs shape, strides, padding, dimension numbers, rhs dilation): one group per feature
    ((2, 16, 8), (5, 1, 8), (1,), "SAME", ("NWC", "WIO", "NWC"), (1,)),
    ((2, 16, 8), (4, 1, 8), (1,), [(3, 0)], ("NWC", "WIO", "NWC"), (1,)),
    ((2, 17, 4), (3, 1, 4), (2,), [(1, 1)], ("NWC", "WIO", "NWC"), (2,)),
    ((2, 3, 9, 7), (3, 1, 3, 2), (2, 1), [(1, 1), (0, 1)], ("NCHW", "OIHW", "NCHW"), (1, 1)),
    ((2, 9, 7, 3), (3, 2, 1, 3), (1, 2), "SAME", ("NHWC", "HWIO", "NHWC"), (1, 2)),
]


@pytest.mark.parametrize("lhs, rhs, strides, padding, numbers, dilation", DEPTHWISE)
def test_a_depthwise_convolution_is_the_sum_of_its_windows_times_the_kernel_rows(
    lhs, rhs, strides, padding, numbers, dilation
):
    groups = lhs[numbers[0].index("C")]

    def conv(x, w):
        return lax.conv_general_dilated(
            x, w, strides, padding, rhs_dilation=dilation, dimension_numbers=numbers, feature_group_count=groups
        )

    term, values, want = _root(conv, lhs, rhs)
    assert "opaque" not in op_names(term) and "dot" not in op_names(term)
    np.testing.assert_allclose(evaluate(term, values), want, rtol=1e-5, atol=1e-5)
