"""Facts a training step needs, each on minimal pairs of real JAX programs, with near misses that
differ only where the fact's side condition matters.

- A reduce over dims that all have size 1 is a reshape (a bias's gradient: the transpose of its
  broadcast through a unit dim sums over that dim). A sum over a dim of size 2 is not.
- A gather of one window at a constant start is that static window, the start clamped into the
  operand as HLO clamps it (optax's cross-entropy picks `[..., 0]` with a gather). Another start
  is another window.
- Both in a training step of another style than the corpus's: the gradient taken from outside a
  data-parallel shard_map (jax.grad through the psum of the loss), then an RMSProp update of the
  replicated weights and bias.
- The gradient of a per-row pick (take_along_axis: a classification loss) is a scatter-add of one
  element per row at the row's label, an aligned map of (update, labels) over the rows; the
  gradient of an embedding lookup is a scatter-add of whole rows at the ids, the update contracted
  with the one-hot of the ids. A shard of the rows adds its shard's part; a device that scatters
  with another shard's labels or ids does not. The terms' numpy meaning is checked against JAX.
- Constant factors: the loss's scale (1/rows) sits inside a guarded select and a broadcast, and
  the softmax and one-hot terms carry it with opposite signs; pulled out in front, a shard's
  gradient and the whole batch's meet.
"""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify

from equivci.results import Status
from equivci.terms.semantics import evaluate

MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, D, O = 8, 8, 4
    LR, DECAY, EPS = 0.01, 0.9, 1e-6


    def rows_inputs():
        return (jax.ShapeDtypeStruct((B, D), jnp.float32),)


    def first_half(x):
        return jnp.tanh(x)[:, : D // 2]


    def _rows(body, *, mesh):
        return jax.shard_map(body, mesh=mesh, in_specs=P("dp"), out_specs=P("dp"))


    def unit_sum(x, *, mesh):
        return _rows(lambda x: jnp.sum(jnp.tanh(x)[:, None, : D // 2], axis=1), mesh=mesh)(x)


    def pair_sum(x, *, mesh):
        return _rows(lambda x: jnp.sum(jnp.tanh(x).reshape(-1, 2, D // 2), axis=1), mesh=mesh)(x)  # MARK:pair


    def column(x):
        return jnp.tanh(x)[:, D - 1]


    def _taken(index):
        # a numpy index is a constant of the program: the gather picks one static column
        return lambda x: jnp.take(jnp.tanh(x), np.array([index]), axis=1, mode="clip")[:, 0]


    def column_taken(x, *, mesh):
        return _rows(_taken(D - 1), mesh=mesh)(x)


    def column_clamped(x, *, mesh):
        return _rows(_taken(D + 3), mesh=mesh)(x)


    def column_before(x, *, mesh):
        return _rows(_taken(D - 2), mesh=mesh)(x)  # MARK:before


    def rows_maxed(x, *, mesh):
        # a scatter whose combiner is max, at constant rows: neither an overwrite nor an add
        where = np.array([3, 2, 1, 0])  # rows reversed back: as an overwrite this would be tanh(x)
        return _rows(lambda x: jnp.zeros_like(x).at[where].max(jnp.tanh(x)[::-1])[:, : D // 2], mesh=mesh)(x)  # MARK:max


    def step_inputs():
        f = jnp.float32
        params = {"w": jax.ShapeDtypeStruct((D, O), f), "b": jax.ShapeDtypeStruct((O,), f)}
        return params, params, jax.ShapeDtypeStruct((B, D), f), jax.ShapeDtypeStruct((B, O), f)


    def _loss(params, x, y):
        return jnp.sum((jnp.tanh(x @ params["w"] + params["b"]) - y) ** 2) / B


    def _rmsprop(params, nu, grads):
        nu = jax.tree.map(lambda n, g: DECAY * n + (1 - DECAY) * g * g, nu, grads)
        params = jax.tree.map(lambda p, g, n: p - LR * g / (jnp.sqrt(n) + EPS), params, grads, nu)
        return params, nu


    def rmsprop_step(params, nu, x, y):
        return _rmsprop(params, nu, jax.grad(_loss)(params, x, y))


    def rmsprop_step_dp(params, nu, x, y, *, mesh):
        def loss(params, x, y):
            local = lambda p, x, y: lax.psum(_loss(p, x, y), "dp")
            return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("dp"), P("dp")), out_specs=P())(params, x, y)

        return _rmsprop(params, nu, jax.grad(loss)(params, x, y))


    V = 16


    def cls_inputs():
        f = jnp.float32
        return jax.ShapeDtypeStruct((D, V), f), jax.ShapeDtypeStruct((B, D), f), jax.ShapeDtypeStruct((B,), jnp.int32)


    def _cls_loss(w, x, labels):
        logp = jax.nn.log_softmax(jnp.tanh(x) @ w)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))


    def cls_grad(w, x, labels):
        return jax.grad(_cls_loss)(w, x, labels)


    def _cls_dp(w, x, labels, mesh, pick):
        body = lambda w, x, labels: lax.pmean(jax.grad(_cls_loss)(w, x, pick(labels)), "dp")
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P("dp"), P("dp")), out_specs=P(),
                             check_vma=False)(w, x, labels)


    def cls_grad_dp(w, x, labels, *, mesh):
        return _cls_dp(w, x, labels, mesh, lambda labels: labels)


    def cls_grad_dp_rolled(w, x, labels, *, mesh):
        return _cls_dp(w, x, labels, mesh, lambda labels: lax.ppermute(labels, "dp", [(0, 1), (1, 0)]))  # MARK:cls


    def emb_inputs():
        f = jnp.float32
        return jax.ShapeDtypeStruct((V, D), f), jax.ShapeDtypeStruct((B, 3), jnp.int32), jax.ShapeDtypeStruct((B, 3, D), f)


    def _emb_loss(table, ids, target):
        return jnp.sum((jnp.tanh(table[ids]) - target) ** 2) / B


    def emb_grad(table, ids, target):
        return jax.grad(_emb_loss)(table, ids, target)


    def _emb_dp(table, ids, target, mesh, pick):
        body = lambda t, ids, y: lax.psum(jax.grad(_emb_loss)(t, pick(ids), y), "dp")
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P("dp"), P("dp")), out_specs=P(),
                             check_vma=False)(table, ids, target)


    def emb_grad_dp(table, ids, target, *, mesh):
        return _emb_dp(table, ids, target, mesh, lambda ids: ids)


    def emb_grad_dp_rolled(table, ids, target, *, mesh):
        return _emb_dp(table, ids, target, mesh, lambda ids: lax.ppermute(ids, "dp", [(0, 1), (1, 0)]))  # MARK:emb
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: unit-sum, reference: m.py:first_half, distributed: m.py:unit_sum, inputs: m.py:rows_inputs,
         mesh: {dp: 2}}
      - {name: pair-sum, reference: m.py:first_half, distributed: m.py:pair_sum, inputs: m.py:rows_inputs,
         mesh: {dp: 2}}
      - {name: rows-maxed, reference: m.py:first_half, distributed: m.py:rows_maxed, inputs: m.py:rows_inputs,
         mesh: {dp: 2}}
      - {name: column-taken, reference: m.py:column, distributed: m.py:column_taken, inputs: m.py:rows_inputs,
         mesh: {dp: 2}}
      - {name: column-clamped, reference: m.py:column, distributed: m.py:column_clamped, inputs: m.py:rows_inputs,
         mesh: {dp: 2}}
      - {name: column-before, reference: m.py:column, distributed: m.py:column_before, inputs: m.py:rows_inputs,
         mesh: {dp: 2}}
      - {name: rmsprop-dp, reference: m.py:rmsprop_step, distributed: m.py:rmsprop_step_dp,
         inputs: m.py:step_inputs, mesh: {dp: 2}}
      - {name: cls-grad-dp, reference: m.py:cls_grad, distributed: m.py:cls_grad_dp, inputs: m.py:cls_inputs,
         mesh: {dp: 2}}
      - {name: cls-grad-dp-rolled, reference: m.py:cls_grad, distributed: m.py:cls_grad_dp_rolled,
         inputs: m.py:cls_inputs, mesh: {dp: 2}}
      - {name: emb-grad-dp, reference: m.py:emb_grad, distributed: m.py:emb_grad_dp, inputs: m.py:emb_inputs,
         mesh: {dp: 2}}
      - {name: emb-grad-dp-rolled, reference: m.py:emb_grad, distributed: m.py:emb_grad_dp_rolled,
         inputs: m.py:emb_inputs, mesh: {dp: 2}}
    """
)

EQUIVALENT = ["unit-sum", "column-taken", "column-clamped", "rmsprop-dp", "cls-grad-dp", "emb-grad-dp"]
NEAR_MISSES = ["pair-sum", "rows-maxed", "column-before", "cls-grad-dp-rolled", "emb-grad-dp-rolled"]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("training"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", EQUIVALENT)
def test_equivalent_pairs_verify(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", NEAR_MISSES)
def test_near_misses_are_mismatches(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)


@pytest.mark.parametrize("name", ["cls-grad-dp", "emb-grad-dp"])
def test_scatter_add_terms_compute_what_jax_computes(manifest, name):
    """The reference's gradient as terms (the scatter-adds among them), evaluated in numpy, is the
    gradient JAX computes, on random inputs with valid labels and ids."""
    import importlib.util

    import jax

    captured = model_package.capture_named(manifest, name)
    programs = model_package.programs_of(captured)
    spec = importlib.util.spec_from_file_location("training_m", manifest.path.parent / "m.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    reference = module.cls_grad if name.startswith("cls") else module.emb_grad
    rng = np.random.default_rng(0)
    arrays = [
        rng.integers(0, module.V, leaf.shape).astype(np.int32)
        if "int" in leaf.dtype
        else rng.standard_normal(leaf.shape).astype(np.float32)
        for leaf in captured.inputs
    ]
    (term,) = programs.reference_outputs
    value = evaluate(term, dict(enumerate(arrays)), programs.evaluator.values)
    np.testing.assert_allclose(value, np.asarray(jax.jit(reference)(*arrays)), rtol=1e-4, atol=1e-6)
