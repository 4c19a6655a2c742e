"""Every finding names a line: a finding about an output the proof could not relate is placed at the
line of the op that makes that output, behind the copies and sharding annotations XLA wraps it in."""

from __future__ import annotations

import textwrap

from model_package import capture_named, line_of, manifest_text, write_package

from equivci.diagnose.outputs import output_place
from equivci.hlo.parser import parse_module

MODEL = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P


    def inputs():
        return (jax.ShapeDtypeStruct((8, 4), jnp.float32),)


    def scaled(x):
        return jnp.tanh(x) * 2.0


    def scaled_rows(x, mesh):
        def local(x):
            h = jnp.tanh(x)
            return h * 2.0  # MARK:out
        return jax.shard_map(local, mesh=mesh, in_specs=P("dp"), out_specs=P("dp"))(x)
    """
).lstrip()


def test_the_output_is_placed_at_the_op_that_makes_it(tmp_path):
    manifest = write_package(tmp_path, "model.py", MODEL, manifest_text([("rows", "scaled", "scaled_rows")], "{dp: 2}"))
    captured = capture_named(manifest, "rows")
    place = output_place(parse_module(captured.distributed_hlo), 0, captured.repo_root)
    assert place == ("model.py", line_of(MODEL, "out"))
