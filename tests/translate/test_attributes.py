"""What decides an instruction's meaning (equivci/translate/attributes.py): a called computation
counts by its content, never by its name (the two programs name their computations independently);
and which init values leave a reduce unchanged (equivci/translate/arrays.py: is_identity)."""

from __future__ import annotations

import numpy as np
import pytest

from equivci.hlo.parser import parse_module
from equivci.translate.arrays import is_identity
from equivci.translate.attributes import semantic_attrs


def _module(region: str, op: str, key: str = "to_apply") -> str:
    return f"""HloModule m

{region} {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = f32[] {op}(a, b)
}}

ENTRY main {{
  x = f32[8]{{0}} parameter(0)
  c = f32[] constant(0)
  ROOT w = f32[4]{{0}} reduce-window(x, c), window={{size=2 stride=2}}, {key}={region}
}}
"""


def _attrs(region: str, op: str, key: str = "to_apply") -> dict[str, str]:
    module = parse_module(_module(region, op, key))
    return semantic_attrs(module.entry.root, module)


@pytest.mark.parametrize("key", ["to_apply", "body", "condition", "calls", "comparator"])
def test_a_called_computation_counts_by_its_content_not_its_name(key):
    summed = _attrs("region_0", "add", key)
    assert summed == _attrs("other.7", "add", key)  # renamed: the same meaning
    # near miss: the same name for another reducer in the other program is another meaning
    assert summed != _attrs("region_0", "maximum", key)
    assert "region_0" not in summed.values()


# The init values JAX writes for its reductions (jnp.sum, prod, max, min, all, any) in each dtype.
IDENTITIES = [
    ("add", np.float32(0)),
    ("add", np.int32(0)),
    ("multiply", np.float32(1)),
    ("multiply", np.int32(1)),
    ("maximum", np.float32(-np.inf)),
    ("maximum", np.int32(np.iinfo(np.int32).min)),
    ("minimum", np.float32(np.inf)),
    ("minimum", np.int32(np.iinfo(np.int32).max)),
    ("minimum", np.uint32(np.iinfo(np.uint32).max)),
    ("maximum", np.int8(-128)),
    ("maximum", np.uint32(0)),
    ("maximum", np.int64(np.iinfo(np.int64).min)),
    ("and", np.bool_(True)),
    ("or", np.bool_(False)),
]
# near misses: one step inside the range, or another reducer's identity
NOT_IDENTITIES = [
    ("add", np.float32(1)),
    ("multiply", np.int32(0)),
    ("maximum", np.int32(np.iinfo(np.int32).min + 1)),
    ("maximum", np.float32(0)),
    ("minimum", np.int32(np.iinfo(np.int32).max - 1)),
    ("minimum", np.float32(3e38)),
    ("and", np.bool_(False)),
    ("or", np.bool_(True)),
    # a fixed width's bound is not another width's: int64 holds values below -2**31
    ("maximum", np.int64(-(2**31))),
    ("minimum", np.int64(2**31 - 1)),
    ("maximum", np.uint32(1)),
    # bitwise reductions of integers: 1 is not `and`'s identity (x & 1 clears bits), and the terms
    # read and/or as logical ops, so no integer init is taken as one
    ("and", np.int32(1)),
    ("and", np.int32(-1)),
    ("or", np.int32(0)),
]


@pytest.mark.parametrize(("reducer", "value"), IDENTITIES)
def test_the_init_values_of_jax_reductions_are_identities(reducer, value):
    assert is_identity(reducer, np.asarray(value))


@pytest.mark.parametrize(("reducer", "value"), NOT_IDENTITIES)
def test_near_miss_a_value_next_to_the_identity_is_not_one(reducer, value):
    assert not is_identity(reducer, np.asarray(value))


def test_shardings_and_metadata_do_not_change_an_instructions_meaning():
    """The distributed program annotates its ops with shardings and both carry metadata: an op
    that differs only there computes the same (its opaque term must be the reference's)."""
    plain = _attrs("region_0", "add")
    text = _module("region_0", "add").replace(
        "to_apply=region_0", 'to_apply=region_0, sharding={replicated}, metadata={op_name="jit(f)/w"}'
    )
    module = parse_module(text)
    assert semantic_attrs(module.entry.root, module) == plain
