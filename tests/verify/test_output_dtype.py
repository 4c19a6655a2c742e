"""An output whose dtype differs from the reference's is a different function (the contract): the
model is `mismatch` with the finding on the line that casts, not a usage `error`; the same model
without the cast is `verified`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from equivci.capture.entrypoints import check_same_outputs

MODEL = '''\
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P


def inputs():
    return (jax.ShapeDtypeStruct((4, 8), jnp.float32), jax.ShapeDtypeStruct((8, 6), jnp.float32))


def reference(x, w):
    return x @ w


def _local(x, w):
    return jax.lax.psum(x @ w, "tp")


def distributed(x, w, mesh):
    f = jax.shard_map(_local, mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)), out_specs=P())
    return f(x, w)


def distributed_bf16(x, w, mesh):
    y = distributed(x, w, mesh)
    return y.astype(jnp.bfloat16)  # the changed dtype
'''


def test_a_dtype_difference_is_not_a_usage_error():
    import jax
    import jax.numpy as jnp

    ref = (jax.ShapeDtypeStruct((4,), jnp.float32),)
    check_same_outputs(ref, (jax.ShapeDtypeStruct((4,), jnp.bfloat16),), "m")


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("repo")
    (root / "model.py").write_text(MODEL)
    (root / "equivci.yaml").write_text(textwrap.dedent("""\
        version: 1
        models:
          - {name: same, reference: model.py:reference, distributed: model.py:distributed, inputs: model.py:inputs, mesh: {tp: 2}}
          - {name: cast, reference: model.py:reference, distributed: model.py:distributed_bf16, inputs: model.py:inputs, mesh: {tp: 2}}
        """))
    proc = subprocess.run([sys.executable, "-m", "equivci", "verify", "--format", "json", "--no-cache"], cwd=root,
                          capture_output=True, text=True, timeout=600, env={**os.environ})
    assert proc.returncode == 1, proc.stderr[-3000:]
    return {m["name"]: m for m in json.loads(proc.stdout)["models"]}


def test_the_same_dtype_is_verified(results):
    assert results["same"]["status"] == "verified", results["same"]


def test_a_changed_output_dtype_is_a_mismatch_at_the_cast(results):
    result = results["cast"]
    assert result["status"] == "mismatch", result
    first = result["findings"][0]
    line = next(k for k, text in enumerate(MODEL.splitlines(), 1) if "the changed dtype" in text)
    assert (first["path"], first["line"]) == ("model.py", line), first
    assert "bf16" in first["message"] and "f32" in first["message"], first

