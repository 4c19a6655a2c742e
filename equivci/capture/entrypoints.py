"""Import the user's entrypoints and apply the calling convention (runs inside the capture child).

Errors raised by the user's code become one-paragraph EquivciErrors that name the entrypoint, the
exception and the last frame of the user's own code, so the message points at the line to fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import inspect
import re
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Mapping, cast

import numpy as np

from equivci.errors import EquivciError
from equivci.manifest import Entrypoint, ModelSpec


def _short(exc: BaseException) -> str:
    """`Type: first line of the message`, so one paragraph stays one paragraph."""
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _user_frame(exc: BaseException, root: Path) -> str | None:
    """`file:line` of the innermost frame in the user's code (not in importlib, jax or equivci)."""
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        return f"{_display(Path(exc.filename), root)}:{exc.lineno}"
    skip = ("<frozen", "site-packages", "dist-packages", str(Path(__file__).resolve().parents[1]))
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not any(s in f.filename for s in skip)]
    if not frames:
        return None
    return f"{_display(Path(frames[-1].filename), root)}:{frames[-1].lineno}"


def _display(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def where_in_user_code(exc: BaseException, root: Path) -> str:
    where = _user_frame(exc, root)
    return f" at {where}" if where else ""


def _import_file(file: Path, root: Path) -> ModuleType:
    # One module object per file: reference and inputs usually share a file, and their
    # module-level state (configs, caches) must be the same object.
    rel = _display(file, root)
    mod_name = "_equivci_user_" + re.sub(r"\W", "_", rel.removesuffix(".py"))
    cached = sys.modules.get(mod_name)
    if cached is not None and Path(getattr(cached, "__file__", "")) == file:
        return cached
    spec = importlib.util.spec_from_file_location(mod_name, file)
    if spec is None or spec.loader is None:  # no loader for the suffix: reported like any import error
        raise ImportError(f"no module loader for {file.name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[mod_name]
        raise
    return module


def load_function(entry: Entrypoint, root: Path) -> Callable[..., Any]:
    # Make `import models.common` (from the manifest folder) and sibling imports work, as they
    # would when running the file as a script from the repository root.
    for folder in (root, entry.file.parent if entry.file else None):
        if folder is not None and str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    try:
        module = _import_file(entry.file, root) if entry.file else importlib.import_module(cast(str, entry.module))
    except (Exception, SystemExit) as exc:  # SystemExit: scripts that parse argv at import time
        raise EquivciError(
            f"importing {entry.source} (entrypoint {entry.spec}) failed{where_in_user_code(exc, root)}: {_short(exc)}. "
            f'Fix the error, or check it with `python -c "import ..."` from {root}; entrypoint '
            "modules must import without side effects (no argv parsing, no device allocation)."
        ) from exc
    try:
        fn = getattr(module, entry.function)
    except AttributeError:
        names = sorted(n for n in vars(module) if not n.startswith("_"))
        close = difflib.get_close_matches(entry.function, names, n=3)
        callables = [n for n in names if callable(vars(module)[n]) and not inspect.ismodule(vars(module)[n])]
        if close:
            hint = f"did you mean {' or '.join(repr(c) for c in close)}?"
        elif callables:
            hint = f"it defines {', '.join(callables[:10])}{', ...' if len(callables) > 10 else ''}."
        else:
            hint = "it defines no functions."
        raise EquivciError(
            f"{entry.source} has no function '{entry.function}' (entrypoint {entry.spec}); {hint} "
            "Fix the name after ':' in the manifest."
        ) from None
    if not callable(fn):
        raise EquivciError(
            f"{entry.spec} is {type(fn).__name__}, not a function; point the manifest at a callable "
            "(a function, or an object with __call__)."
        )
    return fn


def abstract_inputs(fn: Callable[[], Any], entry: Entrypoint) -> tuple:
    """Call inputs() and check it returns a tuple of pytrees of jax.ShapeDtypeStruct."""
    # lazy: jax is heavy; equivci's parent process loads this module without it
    import jax
    from jax.tree_util import keystr, tree_flatten_with_path

    root = Path.cwd()  # the capture child runs in the manifest's folder
    try:
        args = fn()
    except Exception as exc:
        raise EquivciError(
            f"calling the inputs entrypoint {entry.spec}() failed{where_in_user_code(exc, root)}: {_short(exc)}. "
            "It must take no arguments and return the positional arguments as jax.ShapeDtypeStruct."
        ) from exc
    if not isinstance(args, (tuple, list)):
        raise EquivciError(
            f"the inputs entrypoint {entry.spec}() returned {type(args).__name__}, not a tuple; it must "
            "return the positional arguments of both entrypoints, e.g. `return (x,)` for one argument."
        )
    for path, leaf in tree_flatten_with_path(tuple(args))[0]:
        if isinstance(leaf, jax.ShapeDtypeStruct):
            continue
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            what = f"a concrete {type(leaf).__name__} of shape {tuple(leaf.shape)}"
            fix = "return jax.ShapeDtypeStruct(x.shape, x.dtype) instead, so no memory is allocated"
        else:
            what = f"{type(leaf).__name__} {leaf!r}"[:120]
            fix = "every leaf must be a jax.ShapeDtypeStruct; pass constants through closures instead"
        raise EquivciError(f"the inputs entrypoint {entry.spec}() returned {what} at args{keystr(path)}; {fix}.")
    return tuple(args)


def build_mesh(model: ModelSpec):
    # lazy: jax is heavy; equivci's parent process loads this module without it
    import jax
    from jax.sharding import AxisType, Mesh

    devices = jax.devices()
    if len(devices) < model.num_devices:
        raise EquivciError(
            f"model '{model.name}' needs {model.num_devices} devices for mesh {dict(model.mesh)} but only "
            f"{len(devices)} exist; XLA_FLAGS=--xla_force_host_platform_device_count must be set before jax starts."
        )
    names = tuple(name for name, _ in model.mesh)
    shape = tuple(size for _, size in model.mesh)
    # Row-major: device d of the mesh is partition id d, which the placements rely on.
    mesh_devices = np.array(devices[: model.num_devices]).reshape(shape)
    # Auto axes: recent jax.make_mesh defaults to Explicit, which breaks shard_map on unsharded inputs.
    return Mesh(mesh_devices, names, axis_types=(AxisType.Auto,) * len(names))


def bind_distributed(fn: Callable[..., Any], mesh) -> Callable[..., Any]:
    """The distributed entrypoint as a function of the positional inputs only."""
    params: Mapping[str, inspect.Parameter]
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    if "mesh" in params:
        return lambda *args: fn(*args, mesh=mesh)
    return fn


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """A model's entrypoints imported and bound to its mesh, with its abstract inputs."""

    reference: Callable[..., Any]
    distributed: Callable[..., Any]  # takes the positional inputs only
    args: tuple
    mesh: Any


def load_model(model: ModelSpec, root: Path) -> LoadedModel:
    reference_ep, distributed_ep, inputs_ep = model.entrypoints()
    reference = load_function(reference_ep, root)
    distributed = load_function(distributed_ep, root)
    args = abstract_inputs(load_function(inputs_ep, root), inputs_ep)
    mesh = build_mesh(model)
    return LoadedModel(reference, bind_distributed(distributed, mesh), args, mesh)


def _leaf_text(leaf: Any) -> str:
    return f"{np.dtype(leaf.dtype).name}{list(leaf.shape)}"


def check_same_outputs(ref_out: Any, dist_out: Any, model_name: str) -> None:
    """Both entrypoints must return the same pytree of global shapes (the calling convention).

    A leaf whose dtype differs is no usage error but a different function: the verifier reports it
    as `mismatch` (equivci.diagnose.outputs)."""
    # lazy: jax is heavy; equivci's parent process loads this module without it
    from jax.tree_util import keystr, tree_flatten_with_path

    ref_leaves, ref_tree = tree_flatten_with_path(ref_out)
    dist_leaves, dist_tree = tree_flatten_with_path(dist_out)
    fix = "the distributed entrypoint must return the same global-shaped outputs as the reference"
    if ref_tree != dist_tree:  # type: ignore[operator]  # jaxlib's PyTreeDef stub declares no __ne__
        ref_paths = [keystr(p) for p, _ in ref_leaves]
        dist_paths = [keystr(p) for p, _ in dist_leaves]
        only_ref = [p for p in ref_paths if p not in dist_paths]
        only_dist = [p for p in dist_paths if p not in ref_paths]
        if only_ref or only_dist:
            detail = "; ".join(
                filter(
                    None,
                    [
                        f"only the reference returns output{only_ref[0]}" if only_ref else "",
                        f"only the distributed returns output{only_dist[0]}" if only_dist else "",
                    ],
                )
            )
        else:
            detail = f"reference {ref_tree}, distributed {dist_tree}"
        raise EquivciError(f"model '{model_name}': the outputs have different structures ({detail}); {fix}.")
    for (path, ref_leaf), (_, dist_leaf) in zip(ref_leaves, dist_leaves):
        if tuple(ref_leaf.shape) != tuple(dist_leaf.shape):
            raise EquivciError(
                f"model '{model_name}': output{keystr(path)} differs: reference {_leaf_text(ref_leaf)}, "
                f"distributed {_leaf_text(dist_leaf)}; {fix} (gather shards, or check out_specs)."
            )
