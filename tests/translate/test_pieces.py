"""Sums of concatenations (equivci/translate/pieces.py) and sums over devices regrouped
(equivci/translate/collectives.py): each normal form and each stated fact is evaluated numerically
against the sum it replaces, and the guards (pieces that overlap, concatenations cut at different
places, device sums of different lengths) keep the plain sum. The end-to-end near misses are
tests/soundness (accum-dp*)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from equivci.capture.types import LeafPlacement
from equivci.hlo.ir import Shape
from equivci.hlo.parser import parse_module
from equivci.prove.programs import build_programs
from equivci.terms.ir import Term, TermTable
from equivci.terms.semantics import evaluate
from equivci.translate import pieces
from equivci.translate.builder import Builder
from equivci.translate.collectives import combine

RNG = np.random.default_rng(11)


def _leaf(path: str, value) -> LeafPlacement:
    value = np.asarray(value)
    return LeafPlacement(path, value.shape, str(value.dtype), (tuple((0, n) for n in value.shape),))


def _translated(fn, *args):
    """fn's one-device translation, checked against what XLA computes; its output term."""
    module = parse_module(jax.jit(fn).lower(*args).as_text(dialect="hlo"))
    want = np.asarray(jax.jit(fn)(*args))
    inputs = tuple(_leaf(f"[{k}]", a) for k, a in enumerate(args))
    programs = build_programs(module, module, inputs, (_leaf("[0]", want),), 1)
    (out,) = programs.reference_outputs
    params = {k: np.asarray(a) for k, a in enumerate(args)}
    np.testing.assert_allclose(evaluate(out, params, programs.evaluator.values), want, rtol=1e-5, atol=1e-5)
    return out


def _unpacked_gradient(flat):  # the gradient of slices of a flat vector: one zero-padded piece per slice
    def loss(v):
        w, b = v[:6].reshape(3, 2), v[6:]
        return jnp.sum(w**2) * 0.5 + jnp.sum(jnp.sin(b))

    return jax.grad(loss)(flat)


def test_zero_padded_pieces_added_are_their_concatenation():
    out = _translated(_unpacked_gradient, RNG.standard_normal(8).astype(np.float32))
    base = out.args[0] if out.op == "binary" and out.attrs == ("multiply",) else out  # a factor in front
    assert base.op == "concat", base.op


def test_overlapping_pieces_stay_a_sum():
    ev = Builder(None, TermTable(), 1)  # type: ignore[arg-type]
    x, y = _param(ev, 0, (6,)), _param(ev, 1, (8,))
    left = ev.concat([x, _zeros(ev, 4)], 0)
    right = ev.concat([_zeros(ev, 2), y], 0)
    assert pieces.padded_sum(ev, left, right) is None  # [0, 6) and [2, 10) overlap
    a, b = (RNG.standard_normal(n).astype(np.float32) for n in (6, 8))
    out = _translated(lambda a, b: jnp.pad(a, (0, 4)) + jnp.pad(b, (2, 0)), a, b)
    assert out.op == "binary" and out.attrs == ("add",)


def _param(ev: Builder, k: int, shape: tuple[int, ...]) -> Term:
    return ev.mk("param", (k,), (), Shape("f32", shape))


def _zeros(ev: Builder, n: int) -> Term:
    return ev.const(np.zeros(n, np.float32), "f32")


def _values(shapes) -> dict[int, np.ndarray]:
    return {k: RNG.standard_normal(s).astype(np.float32) for k, s in enumerate(shapes)}


def test_an_all_reduce_of_values_concatenated_alike_is_the_concatenation_of_the_reduced_pieces():
    ev = Builder(None, TermTable(), 2)  # type: ignore[arg-type]
    shapes = [(2,), (4,), (2,), (4,), (3,), (3,)]
    a0, b0, a1, b1, c0, c1 = (_param(ev, k, s) for k, s in enumerate(shapes))
    params = _values(shapes)
    alike = [ev.concat([a0, b0], 0), ev.concat([a1, b1], 0)]
    summed = combine(ev, "add", alike)
    assert summed.op == "concat"
    unlike = [ev.concat([a0, b0], 0), ev.concat([c0, c1], 0)]  # cut after 2 and after 3
    assert pieces.split_alike(ev, unlike) is None
    for members in (alike, unlike):
        want = sum(evaluate(m, params, ev.values) for m in members)
        np.testing.assert_allclose(evaluate(combine(ev, "add", members), params, ev.values), want, rtol=1e-6)


def _stated(ev: Builder, members: list[Term]) -> list[list[Term]]:
    before = len(ev.equal_terms)
    combine(ev, "add", members)
    return ev.equal_terms[before:]


def test_sums_over_devices_of_each_devices_sums_are_regrouped():
    """sum_d (x_d + y_d) = sum_d x_d + sum_d y_d, and sum_d f * reduce(concat(a_d, b_d)) =
    f * reduce(concat(sum_d a_d, sum_d b_d)); never for device sums of different lengths."""
    ev = Builder(None, TermTable(), 2)  # type: ignore[arg-type]
    shapes = [(3,), (3,), (3,), (3,), (3,), (1,), (2,), (1,), (2,)]
    x0, y0, x1, y1, z1, a0, b0, a1, b1 = (_param(ev, k, s) for k, s in enumerate(shapes))
    params = _values(shapes)
    key = ("add", "1:0")

    def mean(a: Term, b: Term) -> Term:
        total = ev.normal("reduce", key, [ev.concat([a, b], 0)], Shape("f32", ()))
        return ev.binary("multiply", total, ev.const(np.float32(0.25), "f32"))

    cases = {
        "microbatches accumulated": ([ev.binary("add", x0, y0), ev.binary("add", x1, y1)], True),
        "losses stacked": ([mean(a0, b0), mean(a1, b1)], True),
        "sums of different lengths": ([ev.binary("add", x0, y0), ev.binary("add", ev.binary("add", x1, y1), z1)], False),
    }
    for name, (members, regrouped) in cases.items():
        stated = _stated(ev, members)
        assert bool(stated) == regrouped, name
        for group in stated:
            first, *others = (evaluate(t, params, ev.values) for t in group)
            for other in others:
                np.testing.assert_allclose(other, first, rtol=1e-5, atol=1e-6, err_msg=name)


def test_only_zeros_take_any_factor():
    """f * a beside zeros is f * (a beside zeros); beside ones it is not (the ones would be scaled)."""
    x = RNG.standard_normal(4).astype(np.float32)
    for fill in (np.zeros, np.ones):
        out = _translated(lambda x, fill=fill: jnp.concatenate([x * 0.5, fill(3, np.float32)]), x)
        scaled = out.op == "binary" and out.attrs == ("multiply",) and out.args[0].op == "concat"
        assert scaled == (fill is np.zeros) and (scaled or out.op == "concat"), (fill, out.op)
