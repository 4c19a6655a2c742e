"""The complement of a range test (equivci.translate.masks.outside_of): not(w), or by De Morgan's
law (x < lo) | (x >= hi) (LE / GT accepted), each one-sided test negated into the other direction.
A lookup masked by it, where(outside, 0, rows) with rows looked up at where(outside, 0, ids - lo),
is the lookup masked by the window.

Checked exhaustively over every value of x in a range around the window (the test p and the
window found must disagree everywhere), and end to end on a vocabulary-parallel embedding in a
style unlike the blind dataclass one (a plain function under shard_map, `jnp.take` with the index
clipped, the complement written with `jnp.logical_or` and `>`) beside its near misses (one with an
end off by one, one that ands the two tests).
"""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify

from equivci.hlo.ir import Shape
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.terms.spec import compare_text
from equivci.translate.bounds import bound_select
from equivci.translate.evaluator import Evaluator
from equivci.translate.masks import outside_of, window_of

XS = np.arange(-3, 12, dtype=np.int32)


def _build(text: str):
    """A pred term over x (s32, unbounded) from a tiny expression: 'LT 2 | GE 6', 'not GE 2 & LT 6'."""
    ev = Evaluator(None, TermTable(), 1)
    x = ev.table.make("param", (0,), (), XS.shape, "s32")
    pred = Shape("pred", XS.shape)

    def test(direction: str, k: str):
        return ev.mk(
            "binary", (compare_text(direction, "s32"),), [x, ev.const(np.full(XS.shape, int(k), np.int32), "s32")], pred
        )

    def joined(part: str, op: str):
        sides = [test(*side.split()) for side in part.split(f" {'|' if op == 'or' else '&'} ")]
        term = sides[0]
        for side in sides[1:]:
            term = ev.mk("binary", (op,), [term, side], pred)
        return term

    negate = text.startswith("not ")
    body = text.removeprefix("not ")
    term = joined(body, "or" if "|" in body else "and")
    if negate:
        term = ev.mk("unary", ("not",), [term], pred)
    return ev, x, term


@pytest.mark.parametrize(
    "text",
    ["LT 2 | GE 6", "GE 6 | LT 2", "LE 1 | GT 5", "LT 2 | GT 5", "LT 2", "GE 6", "not GE 2 & LT 6", "not GT 1 & LE 5"],
)
def test_the_complement_of_a_window_test_is_found(text) -> None:
    ev, x, p = _build(text)
    w = outside_of(ev, p)
    assert w is not None and w.x is x
    holds = evaluate(p, {0: XS}).astype(bool)
    inside = (XS >= w.lo) & (XS < w.hi)
    np.testing.assert_array_equal(holds, ~inside)


@pytest.mark.parametrize("text", ["LT 2 & GE 6", "GE 2 & LT 6", "not LT 2 | GE 6"])
def test_a_test_that_is_no_complement_of_a_window_is_refused(text) -> None:
    # (x < 2) & (x >= 6) never holds; (x >= 2) & (x < 6) is the window itself; not(x < 2 | x >= 6)
    # is a window, not its complement
    ev, _, p = _build(text)
    assert outside_of(ev, p) is None


def test_a_window_test_is_not_read_as_its_complement() -> None:
    ev, x, p = _build("GE 2 & LT 6")
    w = window_of(ev, p)
    assert w is not None and (w.x, w.lo, w.hi) == (x, 2, 6)



def test_the_branch_chosen_outside_a_window_is_bounded_by_the_complement() -> None:
    """select(outside [2, 6), 0, x - 2) lies in [0, 4), for ids x in [0, 1000): too many values to
    enumerate (bounds.enumerated), so only the complement's reading of the else branch gives it."""
    ev, x, p = _build("LT 2 | GE 6")
    ev._set_bounds(x, 0, 999)
    shape = Shape("s32", XS.shape)
    shifted = ev.mk("binary", ("subtract",), [x, ev.const(np.full(XS.shape, 2, np.int32), "s32")], shape)
    zero = ev.const(np.zeros(XS.shape, np.int32), "s32")
    chosen = ev.mk("ternary", ("select",), [p, zero, shifted], shape)
    bound_select(ev, chosen, p, zero, shifted)
    assert ev.bounds_of(chosen) == (0, 3)


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    V, D, T = 16, 4, 6


    def inputs():
        return (jax.ShapeDtypeStruct((T,), jnp.int32), jax.ShapeDtypeStruct((V, D), jnp.float32))


    def lookup(tokens, emb):
        return jnp.take(emb, tokens, axis=0) * 2.0


    def _sharded(tokens, emb, mesh, outside_of):
        def shard(tokens, emb):
            n = emb.shape[0]
            first = lax.axis_index("v") * n
            away = outside_of(tokens, first, first + n - 1)
            picked = jnp.take(emb, jnp.clip(tokens - first, 0, n - 1), axis=0)
            return lax.psum(lax.select(jnp.broadcast_to(away[:, None], picked.shape),
                                       jnp.zeros_like(picked), picked), "v") * 2.0

        return jax.shard_map(shard, mesh=mesh, in_specs=(P(), P("v", None)), out_specs=P())(tokens, emb)


    def lookup_vp(tokens, emb, *, mesh):
        return _sharded(tokens, emb, mesh, lambda t, first, last: jnp.logical_or(t < first, t > last))


    def lookup_vp_last_out(tokens, emb, *, mesh):
        return _sharded(tokens, emb, mesh, lambda t, first, last: jnp.logical_or(t < first, t >= last))  # MARK:bug


    def lookup_vp_and(tokens, emb, *, mesh):
        return _sharded(tokens, emb, mesh, lambda t, first, last: jnp.logical_and(t < first, t > last))
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: vp, reference: m.py:lookup, distributed: m.py:lookup_vp, inputs: m.py:inputs, mesh: {v: 4}}
      - {name: vp-last-out, reference: m.py:lookup, distributed: m.py:lookup_vp_last_out, inputs: m.py:inputs,
         mesh: {v: 4}}
      - {name: vp-and, reference: m.py:lookup, distributed: m.py:lookup_vp_and, inputs: m.py:inputs, mesh: {v: 4}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("outside"), "m.py", MODELS, MANIFEST)


def test_a_lookup_masked_by_the_complement_of_its_window_verifies(manifest) -> None:
    result = _verify(manifest, "vp")
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["vp-last-out", "vp-and"])
def test_complements_off_by_one_or_anded_are_mismatches(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
