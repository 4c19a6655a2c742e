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
"""

from __future__ import annotations

import textwrap

import model_package
import pytest
from model_package import verify_named as _verify

from equivci.results import Status

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
      - {name: column-taken, reference: m.py:column, distributed: m.py:column_taken, inputs: m.py:rows_inputs,
         mesh: {dp: 2}}
      - {name: column-clamped, reference: m.py:column, distributed: m.py:column_clamped, inputs: m.py:rows_inputs,
         mesh: {dp: 2}}
      - {name: column-before, reference: m.py:column, distributed: m.py:column_before, inputs: m.py:rows_inputs,
         mesh: {dp: 2}}
      - {name: rmsprop-dp, reference: m.py:rmsprop_step, distributed: m.py:rmsprop_step_dp,
         inputs: m.py:step_inputs, mesh: {dp: 2}}
    """
)

EQUIVALENT = ["unit-sum", "column-taken", "column-clamped", "rmsprop-dp"]
NEAR_MISSES = ["pair-sum", "column-before"]


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
