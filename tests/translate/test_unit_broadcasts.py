"""A size-1 dim a broadcast keeps is a new dim of size 1 (equivci.terms.ir.unit_squeezed, stated by the loader).

A device holding one head broadcasts its per-position table, [s, 1, d] after jnp's implicit
expansion, along batch only; the reference broadcasts its [s, d] table along batch and all heads.
Both are broadcasts of the table with the head dim new, so the device's is a window of the
reference's. Checked on the terms (both forms numerically, and equal once loaded), on a JAX program in a style
unlike the blind RoPE case (the table is an input stored as [1, s, 1, d] and sharded by in_specs
over the sequence axis of a cp x tp mesh, not a constant sliced at axis_index), and on its near miss (the table sharded over
the head axis instead).
"""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest
from egglog import EGraph
from model_package import verify_named as _verify

from equivci.prove.saturate import proved_equal
from equivci.results import Status
from equivci.terms.ir import TermTable, unit_squeezed
from equivci.terms.load import Loader
from equivci.terms.semantics import evaluate
from equivci.terms.spec import reshape_spec


def _table_bcast():
    table = TermTable()
    x = table.make("param", (0,), (), (5, 1, 3), "f32")
    wide = table.make("bcast", ("n2,i0,i1,i2",), (x,), (2, 5, 1, 3), "f32")
    squeezed = table.make("reshape", (reshape_spec((5, 1, 3), (5, 3)),), (x,), (5, 3), "f32")
    return wide, table.make("bcast", ("n2,i0,n1,i1",), (squeezed,), (2, 5, 1, 3), "f32")


def test_a_kept_unit_dim_is_a_new_dim_of_size_one() -> None:
    kept, new = _table_bcast()
    assert unit_squeezed(kept) == (new.attrs[0], new.args[0])
    value = np.random.default_rng(0).standard_normal((5, 1, 3)).astype(np.float32)
    np.testing.assert_array_equal(evaluate(kept, {0: value}), evaluate(new, {0: value}))
    egraph = EGraph()
    loader = Loader(egraph)
    with loader.bulk():
        a, b = loader.expr(kept), loader.expr(new)
    assert proved_equal(egraph, a, b)


def test_a_broadcast_along_unit_dims_only_has_no_other_form() -> None:
    table = TermTable()
    x = table.make("param", (0,), (), (5, 1), "f32")
    assert unit_squeezed(table.make("bcast", ("i0,i1,n1",), (x,), (5, 1, 1), "f32")) is None


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
