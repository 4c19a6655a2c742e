"""The capture's early exit after SPMD partitioning gives exactly what the full compile gives.

Each model is captured twice: as equivci does (placements from the partitioned module's sharding
records, compile abandoned) and with the proto dump switched off, which forces the fallback to the
full compile and `compiled.input_shardings` / `output_shardings`. Both must agree to the byte.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import model_package
import pytest

from equivci.capture import partitioned
from equivci.capture.run import capture_model

MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P


    def inputs():
        f = jnp.float32
        return (jax.ShapeDtypeStruct((8, 16), f), {"w1": jax.ShapeDtypeStruct((16, 16), f), "w2": jax.ShapeDtypeStruct((16, 16), f)})


    def reference(x, w):
        h = jnp.tanh(x @ w["w1"])
        return h @ w["w2"], h, x.sum()


    def shard_map_2d(x, w, *, mesh):
        # replicated x; w1, w2 and h split over tp only (partially replicated over dp)
        def body(x, w1, w2):
            h = jnp.tanh(x @ w1)
            return jax.lax.psum(h @ w2, "tp"), h, x.sum()
        return jax.shard_map(
            body, mesh=mesh,
            in_specs=(P(), P(None, "tp"), P("tp", None)),
            out_specs=(P(), P(None, "tp"), P()),
        )(x, w["w1"], w["w2"])


    def shard_map_sharded_out(x, w, *, mesh):
        def body(x, w1, w2):
            h = jnp.tanh(x @ jax.lax.all_gather(w1, ("tp", "dp"), axis=1, tiled=True))
            return h @ w2, h, x.sum()
        return jax.shard_map(
            body, mesh=mesh,
            in_specs=(P("dp"), P(None, ("tp", "dp")), P()),
            out_specs=(P("dp"), P("dp"), P()),
            check_vma=False,
        )(x, w["w1"], w["w2"])


    def gspmd_tuple(x, w):
        w1 = jax.lax.with_sharding_constraint(w["w1"], P(None, "tp"))
        w2 = jax.lax.with_sharding_constraint(w["w2"], P("tp", "dp"))
        h = jnp.tanh(x @ w1)
        y = h @ w2
        return (
            jax.lax.with_sharding_constraint(y, P("dp", "tp")),
            jax.lax.with_sharding_constraint(h, P(None, ("dp", "tp"))),
            x.sum(),
        )


    def gspmd_same_sharding(x, w):
        # every output sharded alike: XLA may keep one sharding for the whole output tuple
        h = jax.lax.with_sharding_constraint(jnp.tanh(x @ w["w1"]), P("tp"))
        y = jax.lax.with_sharding_constraint(h @ w["w2"], P("tp"))
        return y, h, x.sum()


    def one_device(x, w):
        return reference(x, w)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: shard-map-2d, reference: m.py:reference, distributed: m.py:shard_map_2d, inputs: m.py:inputs, mesh: {dp: 2, tp: 2}}
      - {name: shard-map-sharded-out, reference: m.py:reference, distributed: m.py:shard_map_sharded_out, inputs: m.py:inputs, mesh: {dp: 2, tp: 2}}
      - {name: gspmd-tuple, reference: m.py:reference, distributed: m.py:gspmd_tuple, inputs: m.py:inputs, mesh: {dp: 2, tp: 4}}
      - {name: gspmd-same-sharding, reference: m.py:reference, distributed: m.py:gspmd_same_sharding, inputs: m.py:inputs, mesh: {tp: 4}}
      - {name: one-device, reference: m.py:reference, distributed: m.py:one_device, inputs: m.py:inputs, mesh: {tp: 1}}
    """
)

NAMES = ["shard-map-2d", "shard-map-sharded-out", "gspmd-tuple", "gspmd-same-sharding"]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("early_models"), "m.py", MODELS, MANIFEST)


def _model(manifest, name):
    return next(m for m in manifest.models if m.name == name)


def _full_compile_capture(model, manifest, monkeypatch):
    # Without the proto dump the shardings are never read from the dump: the child falls back to
    # the finished compile.
    monkeypatch.setattr(partitioned, "DUMP_FLAGS", partitioned.DUMP_FLAGS.replace(" --xla_dump_hlo_as_proto", ""))
    return capture_model(model, manifest)


@pytest.mark.parametrize("name", NAMES)
def test_early_capture_equals_full_compile(manifest, monkeypatch, name):
    early = capture_model(_model(manifest, name), manifest)
    full = _full_compile_capture(_model(manifest, name), manifest, monkeypatch)
    assert early.partitioned_early and not full.partitioned_early
    assert early.inputs == full.inputs
    assert early.outputs == full.outputs
    assert early.distributed_hlo == full.distributed_hlo
    assert early.reference_hlo == full.reference_hlo


def test_sharding_kinds_are_covered(manifest):
    """The models above exercise replicated, one-axis, two-axes-on-one-dim, partially
    replicated and tuple-output placements (otherwise the comparison proves little)."""
    captured = capture_model(_model(manifest, "gspmd-tuple"), manifest)
    x, w1, w2 = captured.inputs
    assert len({dev for dev in x.device_slices}) == 1  # replicated
    assert len({dev for dev in w1.device_slices}) == 4  # tp only: each column block on 2 devices
    assert len({dev for dev in w2.device_slices}) == 8  # two mesh axes
    y, h, total = captured.outputs
    assert len({dev for dev in y.device_slices}) == 8
    assert len({dev[1] for dev in h.device_slices}) == 8  # (dp, tp) on one dimension
    assert total.shape == () and len(set(total.device_slices)) == 1


def test_single_device_mesh_falls_back_to_full_compile(manifest):
    # No SPMD partitioning happens on one device, so there is no dump to stop at.
    captured = capture_model(_model(manifest, "one-device"), manifest)
    assert not captured.partitioned_early
    for leaf in captured.inputs:
        assert leaf.device_slices == (tuple((0, n) for n in leaf.shape),)


def test_length_delimited_fields_skip_other_wire_types():
    message = (
        b"\x10\x96\x01"  # field 2, varint 150
        + b"\x1d\x01\x02\x03\x04"  # field 3, fixed32
        + b"\x21" + bytes(8)  # field 4, fixed64
        + b"\x0a\x02hi"  # field 1, bytes
        + b"\x0a\x03abc"  # field 1 again (repeated)
    )
    assert partitioned._length_delimited_fields(message) == {1: [b"hi", b"abc"]}
    assert partitioned._length_delimited_fields(b"\x0a\x05ab") is None  # truncated
    assert partitioned._length_delimited_fields(b"\x0b") is None  # group wire types are not expected


RECORDS_SCRIPT = textwrap.dedent(
    """\
    import glob, os, sys
    from pathlib import Path
    from equivci.capture import partitioned
    dump = sys.argv[1]
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count=8 --xla_dump_to={dump} {partitioned.DUMP_FLAGS}"
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import AxisType, Mesh, PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)

    def f(x, w1, w2):
        w1 = jax.lax.with_sharding_constraint(w1, P(None, "tp"))
        w2 = jax.lax.with_sharding_constraint(w2, P("tp", "dp"))
        h = jnp.tanh(x @ w1)
        y = jax.lax.with_sharding_constraint(h @ w2, P("dp", "tp"))
        return y, jax.lax.with_sharding_constraint(h, P(None, ("dp", "tp"))), x.sum()

    shape = jax.ShapeDtypeStruct((8, 16), jnp.float32), jax.ShapeDtypeStruct((16, 16), jnp.float32)
    with jax.set_mesh(mesh):
        lowered = jax.jit(f).lower(shape[0], shape[1], shape[1])
    executable = lowered.compile()._executable.xla_executable
    stem = Path(glob.glob(f"{dump}/*after_spmd-partitioning*.txt")[0]).name[: -len(".txt")]
    records = partitioned._read_dump(Path(dump), stem)
    devices = lowered._lowering._device_list
    for xla, ours in [
        (executable.get_parameter_shardings(), partitioned.shardings_for_leaves(records.parameter_shardings, 3, devices, one_for_all=False)),
        (executable.get_output_shardings(), partitioned.shardings_for_leaves(records.output_shardings, 3, devices, one_for_all=True)),
    ]:
        assert [s.SerializeToString() for s in xla] == [s._hlo_sharding.to_proto().SerializeToString() for s in ours], (xla, ours)
    print("same")
    """
)


def test_dump_records_are_the_executables_shardings(tmp_path):
    """Byte for byte, the shardings read from the dump are the ones the compiled executable
    reports (replicated, one axis, two axes, partially replicated, a tuple of outputs)."""
    script = tmp_path / "records.py"
    script.write_text(RECORDS_SCRIPT)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "dump")], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "same"
