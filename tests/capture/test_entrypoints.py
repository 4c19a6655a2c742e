"""Entrypoint loading and the calling-convention checks, in-process (jax with its default devices)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

from equivci.capture.entrypoints import (
    abstract_inputs,
    bind_distributed,
    build_mesh,
    check_same_outputs,
    load_function,
)
from equivci.errors import EquivciError
from equivci.manifest import Entrypoint, ModelSpec


def _write(root: Path, rel: str, source: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def _entry(root: Path, rel: str, function: str) -> Entrypoint:
    return Entrypoint(spec=f"{rel}:{function}", function=function, file=(root / rel).resolve())


def _load_inputs(root: Path, body: str):
    _write(root, "inp.py", "import jax, jax.numpy as jnp\nimport numpy as np\n\ndef inputs():\n" + textwrap.indent(textwrap.dedent(body), "    "))
    entry = _entry(root, "inp.py", "inputs")
    return abstract_inputs(load_function(entry, root), entry)


def test_loads_function_from_file(tmp_path: Path) -> None:
    _write(tmp_path, "lt_models/common.py", "SCALE = 3\n")
    _write(tmp_path, "lt_models/llama.py", "from lt_models.common import SCALE\n\ndef forward(x):\n    return x * SCALE\n")
    fn = load_function(_entry(tmp_path, "lt_models/llama.py", "forward"), tmp_path)
    assert fn(2) == 6


def test_same_file_is_one_module(tmp_path: Path) -> None:
    _write(tmp_path, "shared.py", "STATE = []\n\ndef forward(x):\n    return STATE\n\ndef inputs():\n    return STATE\n")
    forward = load_function(_entry(tmp_path, "shared.py", "forward"), tmp_path)
    inputs = load_function(_entry(tmp_path, "shared.py", "inputs"), tmp_path)
    assert forward(0) is inputs()


def test_import_error_names_user_frame(tmp_path: Path) -> None:
    _write(tmp_path, "models/broken.py", "import os\n\nraise ValueError('bad config')\n\ndef forward(x):\n    return x\n")
    with pytest.raises(EquivciError) as info:
        load_function(_entry(tmp_path, "models/broken.py", "forward"), tmp_path)
    message = str(info.value)
    assert "importing models/broken.py" in message
    assert "at models/broken.py:3" in message
    assert "ValueError: bad config" in message
    assert "\n" not in message


def test_syntax_error_names_line(tmp_path: Path) -> None:
    _write(tmp_path, "bad.py", "def forward(x):\n    return (x\n")
    with pytest.raises(EquivciError, match=r"at bad\.py:2: SyntaxError"):
        load_function(_entry(tmp_path, "bad.py", "forward"), tmp_path)


def test_missing_dotted_module(tmp_path: Path) -> None:
    entry = Entrypoint(spec="no_such_pkg_xyz.models:forward", function="forward", module="no_such_pkg_xyz.models")
    with pytest.raises(EquivciError, match=r"importing no_such_pkg_xyz\.models .*ModuleNotFoundError: No module named 'no_such_pkg_xyz'"):
        load_function(entry, tmp_path)


def test_missing_function_suggests_close_names(tmp_path: Path) -> None:
    _write(tmp_path, "m.py", "def forward(x):\n    return x\n\ndef inputs():\n    return ()\n")
    with pytest.raises(EquivciError, match=r"m\.py has no function 'forwrd' .*did you mean 'forward'\?"):
        load_function(_entry(tmp_path, "m.py", "forwrd"), tmp_path)


def test_missing_function_lists_defined_functions(tmp_path: Path) -> None:
    _write(tmp_path, "m2.py", "def forward(x):\n    return x\n\ndef inputs():\n    return ()\n")
    with pytest.raises(EquivciError, match=r"has no function 'zzz' .*it defines forward, inputs\."):
        load_function(_entry(tmp_path, "m2.py", "zzz"), tmp_path)


def test_not_callable(tmp_path: Path) -> None:
    _write(tmp_path, "cfg.py", "forward = {'layers': 2}\n")
    with pytest.raises(EquivciError, match=r"cfg\.py:forward is dict, not a function"):
        load_function(_entry(tmp_path, "cfg.py", "forward"), tmp_path)


def test_inputs_ok(tmp_path: Path) -> None:
    args = _load_inputs(tmp_path, "return [jax.ShapeDtypeStruct((2, 3), jnp.float32), {'w': jax.ShapeDtypeStruct((3,), jnp.bfloat16)}]\n")
    assert isinstance(args, tuple) and args[1]["w"].dtype == jnp.bfloat16


def test_inputs_raising(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EquivciError) as info:
        _load_inputs(tmp_path, "x = 1\nraise KeyError('hidden')\n")
    message = str(info.value)
    assert "inputs entrypoint inp.py:inputs() failed at inp.py:6: KeyError: 'hidden'" in message


def test_inputs_not_a_tuple(tmp_path: Path) -> None:
    with pytest.raises(EquivciError, match=r"returned ShapeDtypeStruct, not a tuple.*return \(x,\)"):
        _load_inputs(tmp_path, "return jax.ShapeDtypeStruct((2,), jnp.float32)\n")


def test_inputs_concrete_array_leaf(tmp_path: Path) -> None:
    with pytest.raises(EquivciError) as info:
        _load_inputs(tmp_path, "return (jax.ShapeDtypeStruct((2,), jnp.float32), {'w1': np.zeros((4, 4))})\n")
    message = str(info.value)
    assert "args[1]['w1']" in message and "concrete ndarray of shape (4, 4)" in message
    assert "jax.ShapeDtypeStruct(x.shape, x.dtype)" in message


def test_inputs_scalar_leaf(tmp_path: Path) -> None:
    with pytest.raises(EquivciError, match=r"returned int 3 at args\[0\]"):
        _load_inputs(tmp_path, "return (3,)\n")


def _sds(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def test_same_outputs_pass() -> None:
    out = {"logits": _sds((2, 8)), "aux": (_sds(()),)}
    check_same_outputs(out, {"logits": _sds((2, 8)), "aux": (_sds(()),)}, "m")


def test_outputs_differ_in_shape() -> None:
    ref = {"logits": _sds((2, 8)), "loss": _sds(())}
    dist = {"logits": _sds((2, 2)), "loss": _sds(())}
    with pytest.raises(EquivciError, match=r"model 'm': output\['logits'\] differs: reference float32\[2, 8\], distributed float32\[2, 2\]"):
        check_same_outputs(ref, dist, "m")


def test_outputs_differ_in_structure() -> None:
    with pytest.raises(EquivciError, match=r"different structures \(only the reference returns output\['loss'\]\)"):
        check_same_outputs({"logits": _sds((2,)), "loss": _sds(())}, {"logits": _sds((2,))}, "m")


def test_outputs_differ_in_container_type() -> None:
    with pytest.raises(EquivciError, match=r"different structures"):
        check_same_outputs((_sds((2,)),), [_sds((2,))], "m")


def test_build_mesh_is_auto_and_row_major() -> None:
    ep = Entrypoint("m.py:f", "f")
    model = ModelSpec("m", ep, ep, ep, mesh=(("dp", 1), ("tp", 1)))
    mesh = build_mesh(model)
    assert mesh.axis_names == ("dp", "tp") and mesh.devices.shape == (1, 1)
    assert all(t == AxisType.Auto for t in mesh.axis_types)


def test_build_mesh_needs_enough_devices() -> None:
    ep = Entrypoint("m.py:f", "f")
    n = len(jax.devices()) + 1
    with pytest.raises(EquivciError, match=rf"needs {n} devices"):
        build_mesh(ModelSpec("m", ep, ep, ep, mesh=(("tp", n),)))


def test_bind_distributed_passes_mesh_by_keyword() -> None:
    assert bind_distributed(lambda x, mesh: (x, mesh), "MESH")(1) == (1, "MESH")
    plain = lambda x: x  # noqa: E731
    assert bind_distributed(plain, "MESH") is plain
    assert np.array_equal(bind_distributed(np.asarray, "MESH")([1]), [1])
