"""Capture on real JAX: a child process with fake CPU devices lowers both entrypoints.

Each capture spawns one child (about a second); the captures are shared by module-scoped fixtures.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import model_package
import pytest

from equivci.capture.run import capture_model
from equivci.errors import EquivciError
from equivci.hlo.collectives import parse_groups
from equivci.hlo.parser import parse_module

MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P


    def inputs():
        f = jnp.float32
        return (jax.ShapeDtypeStruct((8, 16), f), jax.ShapeDtypeStruct((16, 16), f), jax.ShapeDtypeStruct((16, 16), f))


    def reference(x, w1, w2):
        return jnp.tanh(x @ w1) @ w2


    def tp(x, w1, w2, *, mesh):
        def body(x, w1, w2):
            h = jnp.tanh(x @ w1)  # MARK:tp-dot1
            return jax.lax.psum(h @ w2, "tp")  # MARK:tp-psum
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P())(x, w1, w2)


    def gspmd(x, w1, w2):
        w1 = jax.lax.with_sharding_constraint(w1, P(None, "tp"))
        w2 = jax.lax.with_sharding_constraint(w2, P("tp", None))
        h = jnp.tanh(x @ w1)
        h = jax.lax.with_sharding_constraint(h, P(None, "tp"))
        y = h @ w2
        return jax.lax.with_sharding_constraint(y, P())


    def broken(x, w1, w2, *, mesh):
        if float(x.sum()) > 0:  # MARK:broken
            return x
        return x @ w1
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: tp, reference: mlp.py:reference, distributed: mlp.py:tp, inputs: mlp.py:inputs, mesh: {tp: 2}}
      - {name: gspmd, reference: mlp.py:reference, distributed: mlp.py:gspmd, inputs: mlp.py:inputs, mesh: {tp: 2}}
      - {name: broken, reference: mlp.py:reference, distributed: mlp.py:broken, inputs: mlp.py:inputs, mesh: {tp: 2}}
    """
)


def line_of(mark: str) -> int:
    return model_package.line_of(MODELS, mark)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("capture_models"), "mlp.py", MODELS, MANIFEST)


def _model(manifest, name):
    return next(m for m in manifest.models if m.name == name)


@pytest.fixture(scope="module")
def tp_capture(manifest):
    return capture_model(_model(manifest, "tp"), manifest)


@pytest.fixture(scope="module")
def gspmd_capture(manifest):
    return capture_model(_model(manifest, "gspmd"), manifest)


def test_tp_reference_is_single_device_global_shapes(tp_capture):
    ref = parse_module(tp_capture.reference_hlo)
    assert [str(p.shape) for p in ref.entry.parameters()] == ["f32[8,16]", "f32[16,16]", "f32[16,16]"]
    assert "num_partitions" not in ref.attrs or ref.attrs["num_partitions"] == "1"
    ops = {i.opcode for c in ref.computations.values() for i in c.instructions}
    assert not ops & {"all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all"}


def test_tp_distributed_is_per_device_with_all_reduce(tp_capture):
    assert tp_capture.mesh == (("tp", 2),)
    assert tp_capture.num_devices == 2
    dist = parse_module(tp_capture.distributed_hlo)
    assert dist.attrs.get("num_partitions") == "2"
    # local shapes: x replicated, w1 column-sharded, w2 row-sharded
    assert [str(p.shape) for p in dist.entry.parameters()] == ["f32[8,16]", "f32[16,8]", "f32[8,16]"]
    assert str(dist.entry.root.shape) == "f32[8,16]"
    reduces = [i for c in dist.computations.values() for i in c.instructions if i.opcode == "all-reduce"]
    assert len(reduces) == 1
    assert parse_groups(reduces[0].attrs.get("replica_groups"), 2) == [[0, 1]]
    dots = [i for c in dist.computations.values() for i in c.instructions if i.opcode == "dot"]
    assert sorted(str(d.shape) for d in dots) == ["f32[8,16]", "f32[8,8]"]


def test_tp_input_placements_match_in_specs(tp_capture):
    x, w1, w2 = tp_capture.inputs
    assert [leaf.path for leaf in tp_capture.inputs] == ["[0]", "[1]", "[2]"]
    assert (x.shape, w1.shape, w2.shape) == ((8, 16), (16, 16), (16, 16))
    assert x.dtype == "float32"
    # P(): every device holds everything
    assert x.device_slices == (((0, 8), (0, 16)), ((0, 8), (0, 16)))
    # P(None, "tp"): columns split in device order
    assert w1.device_slices == (((0, 16), (0, 8)), ((0, 16), (8, 16)))
    # P("tp", None): rows split in device order
    assert w2.device_slices == (((0, 8), (0, 16)), ((8, 16), (0, 16)))
    (out,) = tp_capture.outputs
    assert out.shape == (8, 16)
    assert out.device_slices == (((0, 8), (0, 16)), ((0, 8), (0, 16)))


def test_tp_source_stack_points_at_user_line(tp_capture, manifest):
    dist = parse_module(tp_capture.distributed_hlo)
    user_file = str((manifest.root / "mlp.py").resolve())
    dots = [i for c in dist.computations.values() for i in c.instructions if i.opcode == "dot"]
    first = min(dots, key=lambda d: d.shape.dims[1])  # the x @ w1 shard: f32[8,8]
    assert str(first.shape) == "f32[8,8]"
    user_frames = [s for s in first.stack if Path(s.file).resolve() == Path(user_file)]
    assert user_frames, first.stack
    assert user_frames[0].line == line_of("tp-dot1")
    assert user_frames[0].function.endswith("body")
    reduce = next(i for c in dist.computations.values() for i in c.instructions if i.opcode == "all-reduce")
    assert next(s for s in reduce.stack if Path(s.file).resolve() == Path(user_file)).line == line_of("tp-psum")
    assert Path(tp_capture.repo_root).resolve() == manifest.root.resolve()


def test_gspmd_collectives_appear_after_partitioning(gspmd_capture):
    dist = parse_module(gspmd_capture.distributed_hlo)
    ops = [i for c in dist.computations.values() for i in c.instructions]
    collectives = [i for i in ops if i.opcode in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")]
    assert collectives, "the SPMD partitioner's collectives are missing: was the pre-partitioning HLO captured?"
    # no shard_map: the program has no manual computation body, yet is per-device
    assert not any(name.startswith("xla.sdy.inlinable_manual_computation_body") for name in dist.computations)
    assert [str(p.shape) for p in dist.entry.parameters()] == ["f32[8,16]", "f32[16,8]", "f32[8,16]"]
    assert gspmd_capture.inputs[1].device_slices == (((0, 16), (0, 8)), ((0, 16), (8, 16)))


def test_trace_failure_names_entrypoint_without_traceback(manifest):
    with pytest.raises(EquivciError) as info:
        capture_model(_model(manifest, "broken"), manifest)
    message = str(info.value)
    assert "mlp.py:broken" in message
    assert "distributed" in message
    assert f"mlp.py:{line_of('broken')}" in message
    assert "Traceback" not in message
    assert 'File "' not in message
    assert "ConcretizationTypeError" in message or "TracerBoolConversionError" in message


LOUD = MODELS.replace("import jax\n", "import jax\nprint('x' * 300_000)  # more than a pipe holds\n", 1)


def test_on_compile_runs_while_the_child_compiles_a_result_to_verify(tmp_path):
    """The parent hears when the child starts compiling (the result will be verified), however much
    the user's code prints; a capture the memo serves never compiles and never says so."""
    loud = model_package.write_package(tmp_path, "mlp.py", LOUD, MANIFEST)
    from equivci import cache

    request = {"fingerprint": cache.fingerprint(), "repo_root": str(tmp_path), "cache_dir": str(tmp_path / "cache"), "known": {}}
    calls = []
    first = capture_model(_model(loud, "tp"), loud, memo=request, on_compile=lambda: calls.append(len(calls)))
    assert calls == [0] and not first.cached and first.distributed_hlo
    again = capture_model(_model(loud, "tp"), loud, memo={**request, "known": {first.content_key: None}},
                          on_compile=lambda: calls.append(len(calls)))
    assert calls == [0] and again.cached and again.content_key == first.content_key
