"""Copies of a value side by side, however written, as the concatenation of the copies (tiles.py), and
a broadcast that only inserts size-1 dims as the reshape it is (shapes.broadcast_term).

    reshape(bcast(y)) = concat([reshape(y)] * r, d)   when the copy dim comes just before d (a tile)
    bcast(y) with only size-1 new dims = reshape(y)   (the elements keep their row-major order)

A repeat (`jnp.repeat`: the copy dim after d, each element copied r times in a row) is no such
concatenation and stays a broadcast. Checked against XLA on four styles of tile (`jnp.tile`, a
`broadcast_to` of a new leading dim merged by a reshape, an einops-style helper that puts the copy
dim before the last dim, `jnp.tile` with reps on two dims) and end to end: a reference that writes a
rotary table as `concatenate([c, c])` against devices that tile it (verified), or repeat it
(mismatch); KV heads repeated for their query heads outside a shard_map with one or two query heads
per device, written with `jnp.repeat` or with `broadcast_to` + reshape (verified: a device's heads
are one KV group's copies, its window aligned with the copies), or tiled where the reference repeats
(mismatch). With two query heads a device's kernel is its KV head twice, and its keys are the dot of
those copies (reductions.dot_of_copies):

    dot(x, concat([y] * r; f)) = concat([dot(x, y)] * r; o)   for a free dim f (output dim o)

"""

from __future__ import annotations

import textwrap

import jax.numpy as jnp
import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify
from one_device import op_names as _ops
from one_device import programs as _programs

from equivci.hlo.ir import Shape
from equivci.results import Status
from equivci.terms.ir import Term, TermTable
from equivci.terms.semantics import TermEvalError, evaluate
from equivci.terms.spec import DotSpec
from equivci.translate.evaluator import Evaluator
from equivci.translate.reductions import dot_of_copies
from equivci.translate.shapes import broadcast_term
from equivci.translate.tiles import tile_dims

Y = np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32)


def _einops_tile(y, r):  # einops.repeat(y, "s d -> s (r d)", r=r)
    return jnp.broadcast_to(y[:, None, :], (y.shape[0], r, y.shape[1])).reshape(y.shape[0], r * y.shape[1])


STYLES = {
    "tile-last": lambda y: jnp.tile(jnp.sin(y), 2),
    "tile-two-dims": lambda y: jnp.tile(jnp.sin(y), (2, 3)),
    "broadcast-to-leading": lambda y: jnp.broadcast_to(jnp.sin(y)[None], (3, *y.shape)).reshape(9, 4),
    "einops-style": lambda y: _einops_tile(jnp.sin(y), 2),
}


def _checked(fn, args=(Y,)) -> Term:
    """fn's output term, after checking it and every group stated equal against XLA."""
    programs, want, _ = _programs(fn, args)
    values, inputs = programs.evaluator.values, dict(enumerate(args))
    out = programs.reference_outputs[0]
    np.testing.assert_allclose(evaluate(out, inputs, values), want, rtol=1e-5)  # numpy's sin and XLA's
    for group in programs.evaluator.equal_terms:
        first = evaluate(group[0], inputs, values)
        for other in group[1:]:
            np.testing.assert_allclose(evaluate(other, inputs, values), first, rtol=1e-5, atol=1e-6)
    return out


@pytest.mark.parametrize("style", STYLES)
def test_a_tile_is_its_copies_concatenated_and_computes_what_xla_computes(style) -> None:
    """The written tile stays the term (the facts the builder reads see the broadcast); its copies
    concatenated are stated equal to it (and checked against XLA by `_checked`)."""
    out = _checked(STYLES[style])
    programs, _, _ = _programs(STYLES[style], (Y,))
    copies = list(programs.evaluator.tiled.values())
    assert copies and all("concat" in _ops(c) and "bcast" not in _ops(c) for c in copies)
    assert "bcast" in _ops(out)


def test_a_repeat_is_no_concatenation_of_copies() -> None:
    out = _checked(lambda y: jnp.repeat(jnp.sin(y), 2, axis=-1))
    programs, _, _ = _programs(lambda y: jnp.repeat(jnp.sin(y), 2, axis=-1), (Y,))
    assert "concat" not in _ops(out) and "bcast" in _ops(out) and not programs.evaluator.tiled


def test_a_dot_of_copies_is_stated_as_the_copies_of_the_dot_and_computes_what_xla_computes() -> None:
    rng = np.random.default_rng(6)
    x, w = rng.standard_normal((4, 16)).astype(np.float32), rng.standard_normal((16, 1, 8)).astype(np.float32)
    for expand in (lambda w: jnp.repeat(w, 2, axis=1), lambda w: jnp.concatenate([w, w], axis=1)):
        programs, _, _ = _programs(lambda x, w: jnp.einsum("sd,dhk->shk", x, expand(w)), (x, w))
        _checked(lambda x, w: jnp.einsum("sd,dhk->shk", x, expand(w)), (x, w))
        out = programs.reference_outputs[0]
        assert any(out in g and any(t.op == "concat" and t.args[0].op == "dot" for t in g)
                   for g in programs.evaluator.equal_terms)


def test_a_dot_summing_or_batching_over_copies_is_not_split() -> None:
    ev = Evaluator(None, TermTable(), 1)  # type: ignore[arg-type]  # no module: terms only
    x = ev.table.make("param", (0,), (), (4, 2), "f32")
    y = ev.table.make("param", (1,), (), (2, 1, 8), "f32")
    copies = ev.concat([y, y], 1)
    summed = DotSpec((), (), (1,), (1,), 2, 3, ("f32", "f32"))  # contracts the copy dim
    assert dot_of_copies(ev, summed, x, copies, Shape("f32", (4, 2, 8))) is None
    x2 = ev.table.make("param", (2,), (), (2, 4), "f32")
    batched = DotSpec((0,), (1,), (), (), 2, 3, ("f32", "f32"))  # batch over the copy dim
    assert dot_of_copies(ev, batched, x2, copies, Shape("f32", (2, 4, 2, 8))) is None
    free = DotSpec((), (), (1,), (0,), 2, 3, ("f32", "f32"))
    term = dot_of_copies(ev, free, x, copies, Shape("f32", (4, 2, 8)))
    xv, yv = np.ones((4, 2), np.float32), np.arange(16, dtype=np.float32).reshape(2, 1, 8)
    np.testing.assert_array_equal(_value(term, xv, yv), np.einsum("sd,dhk->shk", xv, np.concatenate([yv, yv], 1)))
    last = ev.concat([ev.table.make("param", (1,), (), (2, 8, 1), "f32")] * 2, 2)  # copies along the second free dim
    term = dot_of_copies(ev, free, x, last, Shape("f32", (4, 8, 2)))
    yv = yv.reshape(2, 8, 1)
    np.testing.assert_array_equal(_value(term, xv, yv), np.einsum("sd,dkh->skh", xv, np.concatenate([yv, yv], 2)))


def _value(term: Term | None, *args: np.ndarray) -> np.ndarray:
    assert term is not None
    try:
        return evaluate(term, dict(enumerate(args)))
    except TermEvalError as err:  # a term whose dims do not fit is a wrong statement of the dot
        raise AssertionError(f"ill-typed term: {err}") from err


def _bcast(shape: tuple[int, ...], spec: str, out: tuple[int, ...]) -> Term:
    table = TermTable()
    return table.make("bcast", (spec,), (table.make("param", (0,), (), shape, "f32"),), out, "f32")


@pytest.mark.parametrize("spec, out, reshaped, found", [
    ("n2,i0,i1", (2, 3, 4), (6, 4), [(0, 2)]),  # copies first: a tile along rows
    ("i0,n2,i1", (3, 2, 4), (3, 8), [(1, 2)]),  # copies before the columns: a tile along columns
    ("n2,i0,n3,i1", (2, 3, 3, 4), (6, 12), [(0, 2), (1, 3)]),  # both
    ("n2,i0,i1", (2, 3, 4), (2, 12), [(0, 2)]),  # a stack of copies is a tile along the new dim
    ("i0,i1,n2", (3, 4, 2), (3, 8), None),  # copies after the columns: a repeat
    ("i0,n2,i1", (3, 2, 4), (6, 4), None),  # copies after the rows: a repeat of rows
    ("n2,i1,i0", (2, 4, 3), (8, 3), None),  # copies of the transpose
])
def test_tile_dims_reads_the_copies_on_labels(spec, out, reshaped, found) -> None:
    term = _bcast((3, 4), spec, out)
    assert tile_dims(term, reshaped, 1 << 20) == found
    if found is not None:
        part = list(reshaped)
        for d, r in found:
            part[d] //= r
        want = Y.reshape(part)
        for d, r in reversed(found):
            want = np.concatenate([want] * r, axis=d)
        np.testing.assert_array_equal(evaluate(term, {0: Y}).reshape(reshaped), want)


def test_a_broadcast_inserting_only_size_one_dims_is_a_reshape() -> None:
    ev = Evaluator(None, TermTable(), 1)  # type: ignore[arg-type]  # no module: terms only
    x = ev.table.make("param", (0,), (), (2, 1, 8), "f32")
    term = broadcast_term(ev, x, Shape("f32", (2, 1, 1, 8)), (0, 1, 3))
    assert term.op == "reshape" and term.args[0] is x
    value = np.random.default_rng(0).standard_normal((2, 1, 8)).astype(np.float32)
    np.testing.assert_array_equal(evaluate(term, {0: value}), value.reshape(2, 1, 1, 8))
    assert broadcast_term(ev, x, Shape("f32", (2, 1, 3, 8)), (0, 1, 3)).op == "bcast"


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    S, H, KV, HD, D = 4, 4, 2, 8, 16


    def rope_inputs():
        return jax.ShapeDtypeStruct((S, H, HD), jnp.float32), jax.ShapeDtypeStruct((S, HD // 2), jnp.float32)


    def rope(x, ang):
        c = jnp.cos(ang)
        return x * jnp.concatenate([c, c], axis=-1)[:, None, :]


    def _rope_tp(table):
        def run(x, ang, *, mesh):
            body = lambda x, ang: x * table(jnp.cos(ang))[:, None, :]
            return jax.shard_map(body, mesh=mesh, in_specs=(P(None, "tp"), P()), out_specs=P(None, "tp"))(x, ang)
        return run


    rope_tiled = _rope_tp(lambda c: jnp.tile(c, 2))
    rope_broadcast = _rope_tp(lambda c: jnp.broadcast_to(c[:, None, :], (S, 2, HD // 2)).reshape(S, HD))
    rope_repeated = _rope_tp(lambda c: jnp.repeat(c, 2, axis=-1))


    def gqa_inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
        return f(S, D), f(D, H, HD), f(D, KV, HD)


    def gqa(x, wq, wk):
        q = jnp.einsum("sd,dhk->shk", x, wq)
        k = jnp.repeat(jnp.einsum("sd,dgk->sgk", x, wk), H // KV, axis=1)
        return jnp.einsum("shk,thk->hst", q, k)


    def _gqa_tp(expand):
        def run(x, wq, wk, *, mesh):
            body = lambda x, wq, wk: jnp.einsum("shk,thk->hst", jnp.einsum("sd,dhk->shk", x, wq),
                                                jnp.einsum("sd,dgk->sgk", x, wk))
            specs = (P(), P(None, "tp"), P(None, "tp"))
            return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P("tp"))(x, wq, expand(wk))
        return run


    gqa_repeated = _gqa_tp(lambda w: jnp.repeat(w, H // KV, axis=1))
    gqa_broadcast = _gqa_tp(lambda w: jnp.broadcast_to(w[:, :, None], (D, KV, H // KV, HD)).reshape(D, H, HD))
    gqa_tiled = _gqa_tp(lambda w: jnp.concatenate([w] * (H // KV), axis=1))
    """
)


def _entry(name: str, ref: str, dist: str, inputs: str, tp: int) -> str:
    return (f"  - {{name: {name}, reference: m.py:{ref}, distributed: m.py:{dist}, inputs: m.py:{inputs},"
            f" mesh: {{tp: {tp}}}}}\n")


MANIFEST = "version: 1\nmodels:\n" + "".join([
    _entry("rope-tiled", "rope", "rope_tiled", "rope_inputs", 4),
    _entry("rope-broadcast", "rope", "rope_broadcast", "rope_inputs", 2),
    _entry("rope-repeated", "rope", "rope_repeated", "rope_inputs", 4),
    _entry("gqa-repeated-4", "gqa", "gqa_repeated", "gqa_inputs", 4),
    _entry("gqa-repeated-2", "gqa", "gqa_repeated", "gqa_inputs", 2),
    _entry("gqa-broadcast-4", "gqa", "gqa_broadcast", "gqa_inputs", 4),
    _entry("gqa-tiled-4", "gqa", "gqa_tiled", "gqa_inputs", 4),
    _entry("gqa-tiled-2", "gqa", "gqa_tiled", "gqa_inputs", 2),
])


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("tiles"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["rope-tiled", "rope-broadcast", "gqa-repeated-4", "gqa-repeated-2", "gqa-broadcast-4"])
def test_copies_written_another_way_verify(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["rope-repeated", "gqa-tiled-4", "gqa-tiled-2"])
def test_near_miss_copies_interleaved_otherwise_are_mismatches(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
