"""Issue 15, item 6: the numeric oracle on models too large to run on random inputs. Without the
manifest's `oracle: {inputs: ...}` the report says the check did not run and why (the model stays
`unproven`); with smaller inputs the entrypoints accept, the counterexample is found."""

from __future__ import annotations

import json
from pathlib import Path

from repos import equivci, make_repo

# A tensor-parallel MLP whose partial sums are never all-reduced, at a width whose inputs hold
# more than the 4M elements the oracle runs on by default.
MODEL = '''
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P


def mlp(x, w1, w2):
    return jnp.tanh(x @ w1) @ w2


def forgot_psum(x, w1, w2, *, mesh):
    def body(x, w1, w2):
        return jnp.tanh(x @ w1) @ w2  # the psum over tp is missing
    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P(),
                         check_vma=False)(x, w1, w2)


def _inputs(d, f):
    return (jax.ShapeDtypeStruct((4, d), jnp.float32), jax.ShapeDtypeStruct((d, f), jnp.float32),
            jax.ShapeDtypeStruct((f, d), jnp.float32))


def inputs():
    return _inputs(1024, 2560)


def small_inputs():
    return _inputs(16, 32)
'''


def _manifest(oracle: str = "") -> str:
    return ("version: 1\nmodels:\n  - name: wide\n    reference: models/wide.py:mlp\n"
            "    distributed: models/wide.py:forgot_psum\n    inputs: models/wide.py:inputs\n"
            f"    mesh: {{tp: 2}}\n{oracle}")


def _model(repo: Path) -> dict:
    run = equivci(["verify", "--format", "json", "--no-cache"], repo)
    assert run.tracebacks == 0 and run.code == 1, run.stdout + run.stderr
    (model,) = json.loads(run.stdout)["models"]
    return model


def test_too_large_for_the_oracle_says_so(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"models/wide.py": MODEL}, manifest=_manifest())
    model = _model(repo)
    assert model["status"] == "unproven"
    notes = [f["message"] for f in model["findings"] if f["severity"] == "note"]
    assert any("the numeric check did not run" in n and "5,246,976 elements" in n and "oracle: {inputs:" in n
               for n in notes), model["findings"]


def test_smaller_oracle_inputs_find_the_counterexample(tmp_path: Path) -> None:
    oracle = "    oracle: {inputs: models/wide.py:small_inputs}\n"
    repo = make_repo(tmp_path / "repo", {"models/wide.py": MODEL}, manifest=_manifest(oracle))
    model = _model(repo)
    assert model["status"] == "mismatch"
    assert any(f["message"].startswith("counterexample:") for f in model["findings"]), model["findings"]
