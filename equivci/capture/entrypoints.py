"""Import the user's entrypoints and apply the calling convention (runs inside the capture child)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any, Callable

from equivci.errors import EquivciError
from equivci.manifest import Entrypoint, ModelSpec


def load_function(entry: Entrypoint, root: Path) -> Callable[..., Any]:
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    if entry.file is not None:
        mod_name = "_equivci_user_" + entry.file.stem
        spec = importlib.util.spec_from_file_location(mod_name, entry.file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(entry.module)
    return getattr(module, entry.function)


def build_mesh(model: ModelSpec):
    import jax
    import numpy as np
    from jax.sharding import AxisType, Mesh

    names = tuple(name for name, _ in model.mesh)
    shape = tuple(size for _, size in model.mesh)
    devices = np.array(jax.devices()[: model.num_devices]).reshape(shape)
    return Mesh(devices, names, axis_types=(AxisType.Auto,) * len(names))


def abstract_inputs(fn: Callable[[], Any], entry: Entrypoint) -> tuple:
    args = fn()
    return tuple(args)


def bind_distributed(fn: Callable[..., Any], mesh) -> Callable[..., Any]:
    """The distributed entrypoint as a function of the positional inputs only."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    if "mesh" in params:
        return lambda *args: fn(*args, mesh=mesh)
    return fn
