"""A size-1 dim a broadcast keeps is a new dim of size 1 (equivci.translate.shapes.broadcast_term).

A device holding one head broadcasts its per-position table, [s, 1, d] after jnp's implicit
expansion, along batch only; the reference broadcasts its [s, d] table along batch and all heads.
Both are broadcasts of the table with the head dim new, so the device's is a window of the
reference's. Checked on the terms (the normal form against numpy), on a JAX program in a style
unlike the blind RoPE case (the table is an input stored as [1, s, 1, d] and sharded by in_specs
over the sequence axis of a cp x tp mesh, not a constant sliced at axis_index), and on its near miss (the table sharded over
the head axis instead).
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
from equivci.translate.evaluator import Evaluator
from equivci.translate.shapes import broadcast_term


def test_a_kept_unit_dim_becomes_a_new_dim_and_the_value_is_unchanged() -> None:
    ev = Evaluator(None, TermTable(), 1)
    table = ev.table.make("param", (0,), (), (5, 1, 3), "f32")
    term = broadcast_term(ev, table, Shape("f32", (2, 5, 1, 3)), (1, 2, 3))
    assert term.op == "bcast" and term.args[0].shape == (5, 3)
    value = np.random.default_rng(0).standard_normal((5, 1, 3)).astype(np.float32)
    np.testing.assert_array_equal(evaluate(term, {0: value}), np.broadcast_to(value[None], (2, 5, 1, 3)))


def test_a_broadcast_that_adds_only_unit_dims_keeps_its_operand() -> None:
    ev = Evaluator(None, TermTable(), 1)
    x = ev.table.make("param", (0,), (), (5, 1), "f32")
    assert broadcast_term(ev, x, Shape("f32", (5, 1)), (0, 1)) is x


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    B, S, H, D = 2, 8, 4, 4


    def scaled_inputs():
        return (jax.ShapeDtypeStruct((B, S, H, D), jnp.float32), jax.ShapeDtypeStruct((1, S, 1, D), jnp.float32))


    def scaled(x, table):  # the table stored laid out for broadcasting: [1, S, 1, D]
        return jnp.sin(x) * table


    def _sharded(x, table, mesh, table_axis):
        body = lambda x, t: jnp.sin(x) * t
        return jax.shard_map(body, mesh=mesh, in_specs=(P(None, "cp", "tp", None), P(None, table_axis, None, None)),
                             out_specs=P(None, "cp", "tp", None))(x, table)


    def scaled_cp_tp(x, table, *, mesh):
        return _sharded(x, table, mesh, "cp")


    def scaled_table_over_tp(x, table, *, mesh):
        return _sharded(x, table, mesh, "tp")  # MARK:wrong_axis
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: table-cp-tp, reference: m.py:scaled, distributed: m.py:scaled_cp_tp, inputs: m.py:scaled_inputs,
         mesh: {cp: 2, tp: 4}}
      - {name: table-over-tp, reference: m.py:scaled, distributed: m.py:scaled_table_over_tp,
         inputs: m.py:scaled_inputs, mesh: {cp: 2, tp: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("unit_bcasts"), "m.py", MODELS, MANIFEST)


def test_a_per_position_table_on_one_head_per_device_verifies(manifest) -> None:
    result = _verify(manifest, "table-cp-tp")
    assert result.status is Status.VERIFIED, result.findings


def test_the_table_sharded_over_the_head_axis_is_a_mismatch(manifest) -> None:
    result = _verify(manifest, "table-over-tp")
    assert result.status is Status.MISMATCH, (result.status, result.findings)
