"""A window through a reshape that only adds or drops size-1 dims (translate/windows.py,
`_unit_reshape`): reshape(x[a:b along d]) = reshape(x)[a:b along d'], d' the place of d among the
dims of size > 1, which such a reshape keeps in order. A row `logits[0]` of logits sharded over the
vocabulary by jit is then its device's vocabulary window of the reference's row, and the pick XLA's
partitioner makes of `take_along_axis` on it meets the reference's.

Checked on terms built directly (the window's whole evaluates to what the reshape holds there), never
through a reshape that regroups dims of size > 1, and end to end on two devices, with a near miss:
the labels of another row.
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
from equivci.translate import windows
from equivci.translate.evaluator import Evaluator

RNG = np.random.default_rng(29)


def test_a_squeeze_of_a_window_is_the_window_of_the_squeeze():
    ev = Evaluator(None, TermTable(), 1)
    logits = ev.table.make("param", (0,), (), (2, 4, 7, 64), "f32")
    row = ev.slice_term(ev.slice_term(logits, 3, 32, 64), 0, 1, 2)  # a device's vocabulary half of row 1
    squeezed = ev.mk("reshape", ("",), [row], Shape("f32", (4, 7, 32)))
    found = windows.window_along(ev, squeezed, 2)
    assert found is not None and (found.dim, found.start, found.stop) == (2, 32, 64)
    assert found.whole.shape == (4, 7, 64)
    value = {0: RNG.standard_normal((2, 4, 7, 64)).astype(np.float32)}
    np.testing.assert_array_equal(evaluate(found.whole, value)[..., 32:64], value[0][1, :, :, 32:64])


def test_no_window_through_a_reshape_that_regroups_dims():
    ev = Evaluator(None, TermTable(), 1)
    x = ev.slice_term(ev.table.make("param", (0,), (), (4, 16), "f32"), 1, 8, 16)
    for shape in ((8, 4), (32,), (2, 2, 8)):
        assert windows.window_form(ev, ev.mk("reshape", ("",), [x], Shape("f32", shape))) is None


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P

    C, N, T, V = 2, 4, 7, 64


    def inputs():
        return jax.ShapeDtypeStruct((C, N, T, V), jnp.float32), jax.ShapeDtypeStruct((C, N, T), jnp.int32)


    def _picked(logits, labels):
        logp = logits - jax.nn.logsumexp(logits, -1, keepdims=True)
        return jnp.take_along_axis(logp, labels[..., None], -1)[..., 0]


    def first_row(logits, labels):
        return _picked(logits[0], labels[0])


    def _jit(logits, labels, mesh, label_row):
        def run(logits, labels):
            logits = lax.with_sharding_constraint(logits, NamedSharding(mesh, P(None, None, None, "vocab")))
            return _picked(logits[0], labels[label_row])

        return jax.jit(run)(logits, labels)


    def first_row_jit(logits, labels, *, mesh):
        return _jit(logits, labels, mesh, 0)


    def first_row_jit_other_labels(logits, labels, *, mesh):
        return _jit(logits, labels, mesh, 1)
    """
)

CASES = [
    ("first_row_jit", "first_row", "first_row_jit"),
    ("first_row_jit_other_labels", "first_row", "first_row_jit_other_labels"),
]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    text = model_package.manifest_text(CASES, "{vocab: 2}").replace(
        "mesh: {vocab: 2}}", "mesh: {vocab: 2}, int_range: [0, 64]}"
    )
    return model_package.write_package(tmp_path_factory.mktemp("squeezed_windows"), "model.py", MODELS, text)


def test_a_pick_from_a_squeezed_row_of_vocabulary_sharded_logits_verifies(manifest):
    result = _verify(manifest, "first_row_jit")
    assert result.status is Status.VERIFIED, result.findings


def test_the_labels_of_another_row_are_a_mismatch(manifest):
    result = _verify(manifest, "first_row_jit_other_labels")
    assert result.status is Status.MISMATCH, result.findings
