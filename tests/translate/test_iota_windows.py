"""A device's class ids are a window of the reference's iota, however wide the vocabulary
(equivci/translate/constants.py: `ConstantPool.iota_window`).

`jax.nn.one_hot(labels, V)` compares the labels with `iota(V)`. Past `Budgets.fold_elements` the
reference keeps that iota symbolic (128,256 classes), while a vocabulary-parallel device folds its
own `lo + iota(V / n)`: the fact that relates them is iota(N)[lo : lo + n] = lo + arange(n). Without
it the LM head of an 8B training step proved none of its obligations (bench/STYLES.md, stop 30).
The models run at the real width (128,256 classes on 8 devices) and at 256 classes with a fold
budget below the vocabulary, which takes the same path; near misses: class ids shifted by one (the
last device's window runs past the vocabulary) and the gradient doubled with the forward unchanged.
"""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest
from model_package import capture_named, model_named

from equivci.options import Budgets
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.translate.constants import ConstantPool
from equivci.verify.engine import verify_model


def _pool_with_iota(shape: tuple[int, ...], dim: int, dtype: str = "s32") -> tuple[ConstantPool, object]:
    pool = ConstantPool()
    term = TermTable().make("iota", (dim,), (), shape, dtype)
    pool.add_iota(term)
    return pool, term


def test_a_run_of_consecutive_ids_is_a_window_of_the_iota():
    pool, term = _pool_with_iota((128256,), 0)
    window = pool.iota_window(np.arange(16032, 32064, dtype=np.int32), "s32")
    assert window is not None
    assert (window.source, window.dim, window.start, window.width, window.reshaped) == (term, 0, 16032, 16032, False)


def test_ids_broadcast_along_other_dims_and_with_unit_dims_are_a_window():
    pool, term = _pool_with_iota((1, 64, 1024), 2)
    ids = np.broadcast_to(np.arange(256, 384, dtype=np.int32), (64, 128)).reshape(64, 1, 128)
    window = pool.iota_window(ids, "s32")
    assert window is not None
    assert (window.dim, window.start, window.width, window.reshaped) == (2, 256, 128, True)


def test_float_ids_are_the_iotas_elements_as_the_dtype_rounds_them():
    pool, _ = _pool_with_iota((1 << 25,), 0, "f32")
    lo = (1 << 24) + 2
    window = pool.iota_window(np.arange(lo, lo + 8).astype(np.float32), "f32")
    assert window is not None and window.start == lo


@pytest.mark.parametrize(
    "ids, dtype",
    [
        (np.arange(16033, 32065, dtype=np.int32) - np.eye(1, 16032, 5, dtype=np.int32)[0], "s32"),  # one id off
        (np.arange(0, 32064, 2, dtype=np.int32), "s32"),  # every second id
        (np.arange(120000, 136032, dtype=np.int32), "s32"),  # runs past the vocabulary
        (np.arange(-8, 16024, dtype=np.int32), "s32"),  # starts before it
        (np.arange(16032, 32064, dtype=np.int32)[::-1].copy(), "s32"),  # reversed
        (np.arange(16032, 32064).astype(np.float32), "f32"),  # another dtype than the iota's
        (np.broadcast_to(np.arange(8, dtype=np.int32), (2, 8)).copy(), "s32"),  # a dim the iota lacks
    ],
)
def test_near_miss_ids_are_no_window(ids, dtype):
    pool, _ = _pool_with_iota((128256,), 0)
    assert pool.iota_window(ids, dtype) is None


def test_near_miss_ids_varying_along_a_broadcast_dim_are_no_window():
    pool, _ = _pool_with_iota((4, 1024), 1)
    ids = np.broadcast_to(np.arange(256, 384, dtype=np.int32), (4, 128)).copy()
    ids[3] += 1
    assert pool.iota_window(ids, "s32") is None


MODELS = textwrap.dedent(
    """\
    import functools

    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    D, T = 8, 8


    def inputs(v):
        f = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
        return f(T, D), f(D, v), jax.ShapeDtypeStruct((T,), jnp.int32)


    def one_hot_loss(logits, labels):
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.sum(jax.nn.one_hot(labels, logits.shape[-1]) * log_probs, axis=-1))


    def compared_loss(logits, labels):
        ids = jnp.arange(logits.shape[-1])
        logits = logits - jax.scipy.special.logsumexp(logits, axis=-1, keepdims=True)
        return -jnp.sum(jnp.where(labels[:, None] == ids, logits, 0.0)) / labels.shape[0]


    def shifted_loss(logits, labels):
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        hit = labels[:, None] == jnp.arange(logits.shape[-1]) + 1  # MARK:shifted
        return -jnp.mean(jnp.sum(hit * log_probs, axis=-1))


    def doubled_loss(logits, labels):
        logits = logits + (logits - jax.lax.stop_gradient(logits))  # MARK:doubled
        return one_hot_loss(logits, labels)


    def step(loss, h, w, labels):
        return jax.value_and_grad(lambda h, w: loss(h @ w, labels), argnums=(0, 1))(h, w)


    def step_tp(loss, h, w, labels, *, mesh):
        def logits(h, w):
            return jax.shard_map(lambda h, w: h @ w, mesh=mesh, in_specs=(P(), P(None, "tp")), out_specs=P(None, "tp"))(h, w)

        return jax.value_and_grad(lambda h, w: loss(logits(h, w), labels), argnums=(0, 1))(h, w)


    for v in (256, 128256):
        globals()[f"inputs_{v}"] = functools.partial(inputs, v)
    one_hot, one_hot_tp = functools.partial(step, one_hot_loss), functools.partial(step_tp, one_hot_loss)
    compared, compared_tp = functools.partial(step, compared_loss), functools.partial(step_tp, compared_loss)
    shifted_tp = functools.partial(step_tp, shifted_loss)
    doubled_tp = functools.partial(step_tp, doubled_loss)
    """
)

CASES = {"one_hot": "one_hot", "compared": "compared", "shifted": "one_hot", "doubled": "one_hot"}
MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {name}_{v}, reference: wide.py:{ref}, distributed: wide.py:{name}_tp, inputs: wide.py:inputs_{v},"
    " mesh: {tp: 8}}\n"
    for v in (256, 128256)
    for name, ref in CASES.items()
)
# 256 classes as wide as 128,256 for the builder: the reference's iota is kept symbolic, a
# device's 32 ids are folded
NARROW_FOLD = Budgets(fold_elements=128)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("wide_vocab"), "wide.py", MODELS, MANIFEST)


def _verify(manifest, name: str, budgets: Budgets = Budgets()):
    return verify_model(model_named(manifest, name), manifest, capture_named(manifest, name), budgets=budgets)


@pytest.mark.parametrize("name", ["one_hot_256", "compared_256"])
def test_a_cross_entropy_step_over_a_vocabulary_too_wide_to_fold_verifies(manifest, name):
    result = _verify(manifest, name, NARROW_FOLD)
    assert result.status is Status.VERIFIED, result.findings


def test_an_8b_wide_cross_entropy_step_verifies(manifest):
    result = _verify(manifest, "one_hot_128256")
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["shifted_256", "doubled_256"])
def test_near_misses_over_a_vocabulary_too_wide_to_fold_are_mismatch(manifest, name):
    result = _verify(manifest, name, NARROW_FOLD)
    assert result.status is Status.MISMATCH, result.findings
    # the shifted ids' compare or the product that reads it; the doubled gradient's line
    mark = model_package.line_of(MODELS, name.split("_")[0])
    assert result.findings[0].line in (mark, mark + 1), result.findings


@pytest.mark.slow
@pytest.mark.parametrize("name", ["shifted_128256", "doubled_128256"])
def test_near_misses_at_8b_width_are_mismatch(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, result.findings
