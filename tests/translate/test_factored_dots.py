"""A sum of matrix products that share their left factor is the product of the summed right factors
(equivci.translate.factored_dots): s1 · (x @ m1) + s2 · (x @ m2) = s1 · (x @ (m1 + (s2 / s1) · m2)),
with (x @ a) @ b = x @ (a @ b).

The stated pairs are checked numerically on the terms (a LoRA layer with the scale on the product
or on `a`, activations with leading batch dims, two plain kernels, a factor on the first product),
and none is stated for products of different left operands. On JAX programs: LoRA adapters merged
into each device's block of the kernel before the all-gather, the scale on the product or on `a`,
on column and on row blocks. Near misses: the scale dropped, and the adapter block of the next
device.
"""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify
from one_device import evaluated

from equivci.results import Status
from equivci.terms.semantics import evaluate

RNG = np.random.default_rng(11)
X, X3 = RNG.standard_normal((6, 8)).astype(np.float32), RNG.standard_normal((2, 3, 8)).astype(np.float32)
W, V = RNG.standard_normal((8, 5)).astype(np.float32), RNG.standard_normal((8, 5)).astype(np.float32)
A, B = RNG.standard_normal((8, 2)).astype(np.float32), RNG.standard_normal((2, 5)).astype(np.float32)
Y = RNG.standard_normal((6, 8)).astype(np.float32)

FACTORED = {
    "lora, scale on the product": (lambda x, w, a, b: x @ w + 2.0 * (x @ a) @ b, (X, W, A, B)),
    "lora, scale on a": (lambda x, w, a, b: x @ w + (x @ (a * 0.25)) @ b, (X, W, A, B)),
    "lora, batched activations": (lambda x, w, a, b: x @ w + 3.0 * ((x @ a) @ b), (X3, W, A, B)),
    "two kernels": (lambda x, w, v: x @ w + x @ v, (X, W, V)),
    "factor on the first product": (lambda x, w, a, b: 0.5 * (x @ w) + (x @ a) @ b, (X, W, A, B)),
}


def _stated(fn, args):
    """The evaluator of fn's program, its groups stated by factored_dots, and the input values."""
    ev, values = evaluated(fn, args)
    groups = [g for g in ev.equal_terms if any(_merged_product(t) for t in g[1:])]
    return ev, groups, values


def _merged_product(t) -> bool:
    """A product whose right operand is a sum (under a constant factor)."""
    if t.op == "binary" and t.attrs == ("multiply",):
        t = t.args[0]
    return t.op == "dot" and t.args[1].op == "binary" and t.args[1].attrs == ("add",)


@pytest.mark.parametrize("case", sorted(FACTORED))
def test_a_sum_of_products_with_one_left_factor_is_stated_equal_to_the_product_of_the_sum(case):
    ev, groups, values = _stated(*FACTORED[case])
    assert groups, "no merged product stated"
    for group in groups:
        first = evaluate(group[0], values, ev.values)
        for other in group[1:]:
            np.testing.assert_allclose(evaluate(other, values, ev.values), first, rtol=1e-4, atol=1e-4)


NOT_FACTORED = {  # near misses: nothing may be stated for these sums
    "different left operands": (lambda x, y, w, v: x @ w + y @ v, (X, Y, W, V)),
    "a chain of another activation": (lambda x, y, w, a, b: x @ w + (y @ a) @ b, (X, Y, W, A, B)),
}


@pytest.mark.parametrize("case", sorted(NOT_FACTORED))
def test_products_of_different_left_operands_are_not_merged(case):
    _, groups, _ = _stated(*NOT_FACTORED[case])
    assert not groups


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    N, D, F, R = 8, 16, 32, 4
    S = 4.0


    def inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
        return f(N, D), f(D, F), f(D, R), f(R, F)


    def lora(x, w, a, b):
        return jnp.tanh(x @ w + S * (x @ a) @ b)


    def _merged(x, w, a, b, mesh, merge, b_block):
        def body(x, w, a, b):
            return jnp.tanh(x @ lax.all_gather(merge(w, a, b_block(b)), "tp", axis=1, tiled=True))

        specs = (P(), P(None, "tp"), P(), P(None, "tp"))
        return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P(), check_vma=False)(x, w, a, b)


    def merged(x, w, a, b, *, mesh):
        return _merged(x, w, a, b, mesh, lambda w, a, b: w + S * a @ b, lambda b: b)


    def merged_scale_on_a(x, w, a, b, *, mesh):
        return _merged(x, w, a, b, mesh, lambda w, a, b: w + (a * S) @ b, lambda b: b)


    def merged_unscaled(x, w, a, b, *, mesh):
        return _merged(x, w, a, b, mesh, lambda w, a, b: w + a @ b, lambda b: b)


    def merged_next_block(x, w, a, b, *, mesh):
        return _merged(x, w, a, b, mesh, lambda w, a, b: w + S * a @ b, lambda b: lax.ppermute(
            b, "tp", [(k, (k + 1) % 4) for k in range(4)]))


    def lora_rows(x, w, a, b):  # the row-parallel side: w [F, D] merged by row blocks
        return x.T @ w.T + S * (x.T @ b.T) @ a.T


    def inputs_rows():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
        return f(F, N), f(D, F), f(D, R), f(R, F)


    def merged_rows(x, w, a, b, *, mesh):
        def body(x, wt, bt, at):
            return x.T @ lax.all_gather(wt + S * bt @ at, "tp", axis=0, tiled=True)

        specs = (P(None, "dp"), P("tp", None), P("tp", None), P())
        return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P("dp"), check_vma=False)(x, w.T, b.T, a.T)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: merged, reference: m.py:lora, distributed: m.py:merged, inputs: m.py:inputs, mesh: {tp: 4}}
      - {name: merged-scale-on-a, reference: m.py:lora, distributed: m.py:merged_scale_on_a, inputs: m.py:inputs, mesh: {tp: 4}}
      - {name: merged-unscaled, reference: m.py:lora, distributed: m.py:merged_unscaled, inputs: m.py:inputs, mesh: {tp: 4}}
      - {name: merged-next-block, reference: m.py:lora, distributed: m.py:merged_next_block, inputs: m.py:inputs, mesh: {tp: 4}}
      - {name: merged-rows, reference: m.py:lora_rows, distributed: m.py:merged_rows, inputs: m.py:inputs_rows, mesh: {dp: 2, tp: 4}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("factored_dots"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["merged", "merged-scale-on-a", "merged-rows"])
def test_lora_adapters_merged_into_each_devices_kernel_block_verify(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["merged-unscaled", "merged-next-block"])
def test_near_miss_merge_without_the_scale_or_with_the_next_block_is_a_mismatch(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
