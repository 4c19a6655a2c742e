"""An output the proof could not show equal, with every op before it related, is reported at the
line of the op that computes it on the distributed side (verify/engine.py, `_output_finding`): a
finding always names a line, the first op in program order whose value the output is, not the
copies and sharding ops after it."""

from __future__ import annotations

import textwrap
import types

import model_package

from equivci.verify.engine import _output_finding

MODEL = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P


    def inputs():
        return (jax.ShapeDtypeStruct((4, 8), jnp.float32), jax.ShapeDtypeStruct((8, 8), jnp.float32))


    def reference(x, w):
        return jnp.tanh(x @ w)


    def distributed(x, w, mesh):
        y = jax.lax.with_sharding_constraint(x @ w, NamedSharding(mesh, P("data")))
        out = jnp.tanh(y)  # MARK:output
        return jax.lax.with_sharding_constraint(out, NamedSharding(mesh, P()))
    """
)


def test_an_unproved_output_is_reported_at_the_op_that_computes_it(tmp_path):
    text = model_package.manifest_text([("out", "reference", "distributed")], "{data: 2}")
    manifest = model_package.write_package(tmp_path, "model.py", MODEL, text)
    captured = model_package.capture_named(manifest, "out")
    programs = model_package.programs_of(captured)
    proof = types.SimpleNamespace(proved=[[True], [False]])  # as if device 1's output were unproved
    finding = _output_finding(proof, programs, captured)
    assert (finding.path, finding.line) == ("model.py", model_package.line_of(MODEL, "output"))
    assert "output" in finding.message and "device 1" in finding.message
