"""A gather of single rows at a constant index vector (`x[:, order]`, `jnp.take(x, order, axis=0)`)
is the concatenation of the windows its runs of consecutive indices read (equivci/translate/shapes.py,
`rows_at_constants`): a zigzag (load-balanced causal) layout permutes sequence chunks by a static
order, and the partitioner un-permutes a sharded result by a constant gather too.

Against XLA: the zigzag order, a take along another dim, indices past the ends (clamped as HLO
clamps a start), and a shuffle of single rows past `Budgets.taken_runs` (it stays a gather). End to
end: a row-wise layer computed on the zigzag layout and permuted back is no false mismatch; its near
miss, the chunks permuted back in another order, is a mismatch.
"""

from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import model_package
import numpy as np
import pytest
from model_package import capture_named
from model_package import model_named as _model

from equivci.capture.types import LeafPlacement
from equivci.hlo.parser import parse_module
from equivci.layers.segments import program_order
from equivci.options import Budgets
from equivci.prove.programs import build_programs
from equivci.results import Status
from equivci.terms.semantics import evaluate
from equivci.verify.engine import verify_model

RNG = np.random.default_rng(5)
X = RNG.standard_normal((2, 32, 4)).astype(np.float32)


def _zigzag(n_shards: int, seq: int = 32) -> np.ndarray:
    chunks = np.arange(seq).reshape(2 * n_shards, seq // (2 * n_shards))
    return np.concatenate([np.concatenate([chunks[i], chunks[2 * n_shards - 1 - i]]) for i in range(n_shards)])


CASES = {
    "zigzag order along the sequence": (lambda x: x[:, _zigzag(4)], 7),  # chunks 0 7 1 6 2 5 (3 4)
    "permuted back by the inverse order": (lambda x: x[:, _zigzag(4)][:, np.argsort(_zigzag(4))], 1),
    "chunks of rows along the first dim": (lambda x: jnp.take(x, np.array([1, 0]), axis=0), 2),
    "indices past both ends, clamped": (
        lambda x: jnp.take(x, np.array([30, 31, 40, -3, 0, 1]), axis=1, mode="clip"),
        4,  # rows 30-31, 31, 0, 0-1
    ),
}


def _leaf(path: str, value) -> LeafPlacement:
    value = np.asarray(value)
    return LeafPlacement(path, value.shape, str(value.dtype), (tuple((0, n) for n in value.shape),))


def _translated(fn, budgets: Budgets = Budgets()):
    module = parse_module(jax.jit(fn).lower(X).as_text(dialect="hlo"))
    want = np.asarray(jax.jit(fn)(X))
    programs = build_programs(module, module, (_leaf("[0]", X),), (_leaf("[0]", want),), 1, budgets=budgets)
    [term] = programs.reference_outputs
    return term, evaluate(term, {0: X}, programs.evaluator.values), want


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_take_at_constant_indices_is_windows_concatenated_as_xla_computes(case):
    fn, windows = CASES[case]
    term, got, want = _translated(fn)
    np.testing.assert_array_equal(got, want)
    ops = [t.op for t in program_order([term])]
    assert "aligned" not in ops and ops.count("slice") == (windows if windows > 1 else ops.count("slice"))
    if windows == 1:
        assert term.op == "param"  # x permuted and permuted back is x itself


def test_a_shuffle_of_more_runs_than_the_budget_stays_a_gather():
    order = np.array([5, 3, 9, 1, 7, 0])
    term, got, want = _translated(lambda x: x[:, order], Budgets(taken_runs=5))
    np.testing.assert_array_equal(got, want)
    assert "aligned" in {t.op for t in program_order([term])}
    term, got, want = _translated(lambda x: x[:, order], Budgets(taken_runs=6))
    np.testing.assert_array_equal(got, want)
    assert "aligned" not in {t.op for t in program_order([term])}


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import PartitionSpec as P

    S, D = 32, 8


    def inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)  # noqa: E731
        return f(D, D), f(2, S, D)


    def _order(n):
        chunks = np.arange(S).reshape(2 * n, S // (2 * n))
        return np.concatenate([np.concatenate([chunks[i], chunks[2 * n - 1 - i]]) for i in range(n)])


    def layer(w, x):
        return jnp.tanh(x @ w) * x


    def _by_gather(x, order):
        return x[:, order]


    def _zigzag(w, x, mesh, permute, back):
        order = _order(mesh.shape["cp"])
        fn = jax.shard_map(layer, mesh=mesh, in_specs=(P(), P(None, "cp")), out_specs=P(None, "cp"))
        return permute(fn(w, permute(x, order)), back(order))


    def zigzag_gather(w, x, *, mesh):
        return _zigzag(w, x, mesh, _by_gather, np.argsort)


    def zigzag_back_in_order(w, x, *, mesh):
        return _zigzag(w, x, mesh, _by_gather, lambda order: np.argsort(order[::-1]))
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: zigzag-gather, reference: m.py:layer, distributed: m.py:zigzag_gather, inputs: m.py:inputs,
         mesh: {cp: 4}}
      - {name: zigzag-back-in-order, reference: m.py:layer, distributed: m.py:zigzag_back_in_order,
         inputs: m.py:inputs, mesh: {cp: 4}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("constant_takes"), "m.py", MODELS, MANIFEST)


def test_the_zigzag_layout_permuted_back_is_no_false_mismatch_and_its_near_miss_is_one(manifest):
    """The layer on the zigzag layout stays `unproven` (the un-permute's gather reads clamped repeats
    of rows, past the run budget; the style with `jnp.concatenate` of seven slices outgrows memory in
    saturation, with or without this fact: not run here), never `mismatch`; the chunks put back in
    another order are a `mismatch`."""
    correct = verify_model(_model(manifest, "zigzag-gather"), manifest, capture_named(manifest, "zigzag-gather"))
    assert correct.status is not Status.MISMATCH, correct.findings
    buggy = verify_model(_model(manifest, "zigzag-back-in-order"), manifest,
                         capture_named(manifest, "zigzag-back-in-order"))
    assert buggy.status is Status.MISMATCH, buggy.findings
