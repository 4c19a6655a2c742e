"""Capture child process: lower both entrypoints with abstract inputs on fake CPU devices.

Runs as `python -m equivci.capture.child REQUEST.json RESULT.json FD`, forked by the capture server
(capture/server.py); FD is the write end of a pipe on which it says when the compile starts. Its
environment's XLA_FLAGS carry the device count and the SPMD-partitioning dump: XLA reads them when
the backend starts, in this process, which is the only moment the fake device count can be chosen.
"""

from __future__ import annotations

import glob
import importlib.metadata
import io
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path

from equivci import memo
from equivci.capture import entrypoints, partitioned
from equivci.capture.entrypoints import where_in_user_code
from equivci.errors import EquivciError
from equivci.manifest import load_manifest
from equivci.timings import Laps


def _trace_failure(side: str, entry, exc: Exception) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "site-packages" not in f.filename]
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    first_line = (str(exc).strip().splitlines() or [""])[0]
    return (
        f"tracing the {side} entrypoint {entry.spec} failed{where}: {type(exc).__name__}: {first_line}. "
        f"equivci lowers it with jax.jit on abstract inputs (jax.ShapeDtypeStruct), so it must not need "
        "concrete values; run it under jax.jit yourself to see the full error, or pass --debug."
    )


def _placements(leaves, shardings, device_order) -> list[dict]:
    out = []
    for (path, leaf), sharding in zip(leaves, shardings):
        shape = tuple(int(d) for d in leaf.shape)
        index_map = sharding.devices_indices_map(shape)
        per_device = []
        for device in device_order:
            idx = index_map[device]
            per_device.append([list(s.indices(n)[:2]) for s, n in zip(idx, shape)])
        out.append({"path": path, "shape": list(shape), "dtype": str(leaf.dtype), "device_slices": per_device})
    return out


def _spmd_dump(dump_dir: str) -> str | None:
    files = sorted(glob.glob(os.path.join(dump_dir, "*after_spmd-partitioning*.txt")))
    jit_files = [f for f in files if ".jit_" in os.path.basename(f)] or files
    if not jit_files:
        return None
    return Path(jit_files[-1]).read_text()


class FilesRead:
    """Every file opened for reading from here on (an audit hook on `open`, which the built-in
    open, io, pathlib and os.open all raise): configs, tokenizer files and data read while the
    entrypoints are imported and traced. They decide reuse like the imported modules do, since a
    changed config changes the programs without changing any source file.

    Installed after jax is imported, so jax's own thousands of opens cost nothing. Files opened by
    native code (C fopen) are not seen."""

    def __init__(self) -> None:
        self.paths: set[str] = set()
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple) -> None:
        if event != "open":
            return
        path, mode, flags = args
        if isinstance(path, int) or path is None:
            return
        reading = ("r" in mode or "+" in mode) if isinstance(mode, str) else (flags & os.O_ACCMODE) != os.O_WRONLY
        if reading:
            self.paths.add(os.path.abspath(os.fsdecode(path)))


def capture(request: dict, laps: Laps) -> dict:
    # lazy: jax is heavy; equivci's parent process loads this module without it
    import jax
    from jax.tree_util import keystr, tree_flatten_with_path

    laps.lap("import jax")

    manifest = load_manifest(Path(request["manifest"]))
    read = FilesRead()  # from here: what the user's code reads
    model = next(m for m in manifest.models if m.name == request["model"])
    loaded = entrypoints.load_model(model, manifest.root)
    reference, bound, args, mesh = loaded.reference, loaded.distributed, loaded.args, loaded.mesh
    laps.lap("load entrypoints")

    try:
        ref_lowered = jax.jit(reference, keep_unused=True).lower(*args)
    except EquivciError:
        raise
    except Exception as exc:  # the user's reference failed to trace
        raise EquivciError(_trace_failure("reference", model.entrypoints()[0], exc)) from exc
    laps.lap("lower reference")
    try:
        with jax.set_mesh(mesh):
            dist_lowered = jax.jit(bound, keep_unused=True).lower(*args)
    except Exception as exc:
        raise EquivciError(_trace_failure("distributed", model.entrypoints()[1], exc)) from exc
    laps.lap("lower distributed")
    entrypoints.check_same_outputs(ref_lowered.out_info, dist_lowered.out_info, model.name)

    # Memo: the content key of both lowered programs; a known key ends the capture here, before
    # the HLO conversion and the costly compile (a warm run costs about one lowering).
    keys = _MemoKeys(request["memo"], model, args, ref_lowered, dist_lowered, read) if request.get("memo") else None
    memo_fields = {}
    if keys is not None and keys.stored:
        memo_fields = keys.fields()
        laps.lap("content key")
        if memo_fields["cached"]:
            return memo_fields
    dump_dir = Path(os.environ["EQUIVCI_DUMP_DIR"])
    # The compile runs in the background from here: the content key (when the memo did not know
    # these programs), then the reference HLO conversion overlap it, and the capture stops waiting
    # as soon as the partitioned module is dumped.
    if keys is not None and not keys.stored:
        keys.print_distributed()
    watcher = partitioned.watch(dump_dir)
    job = partitioned.BackgroundCompile(dist_lowered)
    job.start()
    if keys is not None and not keys.stored:
        memo_fields = keys.fields()
        laps.lap("content key")
        if memo_fields["cached"]:
            return memo_fields
    # the result will be verified: the parent prepares for it meanwhile
    os.write(request["compiling_fd"], b"compiling\n")
    reference_hlo = ref_lowered.as_text(dialect="hlo", debug_info=True)
    laps.lap("reference HLO")
    spmd = partitioned.wait_for_spmd_dump(watcher, dump_dir, job) if watcher else None
    laps.lap("SPMD partitioning")

    device_order = list(mesh.devices.flat)
    in_leaves = [(keystr(p), leaf) for p, leaf in tree_flatten_with_path(args)[0]]
    out_leaves = [(keystr(p), leaf) for p, leaf in tree_flatten_with_path(dist_lowered.out_info)[0]]
    placements = _dump_placements(spmd, dist_lowered, in_leaves, out_leaves, device_order) if spmd else None
    partitioned_early = placements is not None
    if placements is not None and spmd is not None:  # (placements come from spmd only)
        distributed_hlo = spmd.text
        laps.lap("placements")
    else:
        compiled = _full_compile(job, model)
        distributed_hlo = _spmd_dump(str(dump_dir)) or dist_lowered.as_text(dialect="hlo", debug_info=True)
        placements = (
            _placements(in_leaves, jax.tree_util.tree_leaves(compiled.input_shardings[0]), device_order),
            _placements(out_leaves, jax.tree_util.tree_leaves(compiled.output_shardings), device_order),
        )
        laps.lap("full compile, placements")
    return {
        "reference_hlo": reference_hlo,
        "distributed_hlo": distributed_hlo,
        "inputs": placements[0],
        "outputs": placements[1],
        "partitioned_early": partitioned_early,
        **memo_fields,
    }


def _full_compile(job: partitioned.BackgroundCompile, model):
    try:
        return job.result()
    except Exception as exc:
        raise EquivciError(
            f"XLA could not partition the distributed entrypoint {model.entrypoints()[1].spec} of model "
            f"'{model.name}' for mesh {dict(model.mesh)}: {type(exc).__name__}: {str(exc).splitlines()[0]}. "
            "Check that the shardings and collectives match the mesh axes."
        ) from exc


def _dump_placements(spmd: partitioned.SpmdDump, lowered, in_leaves, out_leaves, device_order) -> tuple | None:
    """Input and output placements from the partitioned module's sharding records, through the
    shardings jax makes of them for `compiled.input_shardings` / `output_shardings`. None (so the
    full compile decides) where jax would make them differently (extended dtypes such as PRNG
    keys get logical shardings), the lowering hides its device list, or the records do not fit
    the leaves."""
    # lazy: jax is heavy; equivci's parent process loads this module without it
    import jax

    if any(jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.extended) for _, leaf in in_leaves + out_leaves):
        return None
    # The executable's device list: XLA's device ids in the shardings are positions in it.
    device_list = getattr(getattr(lowered, "_lowering", None), "_device_list", None)
    try:
        ins = partitioned.shardings_for_leaves(spmd.parameter_shardings, len(in_leaves), device_list, one_for_all=False)
        outs = partitioned.shardings_for_leaves(spmd.output_shardings, len(out_leaves), device_list, one_for_all=True)
        if ins is None or outs is None:
            return None
        return _placements(in_leaves, ins, device_order), _placements(out_leaves, outs, device_order)
    except Exception:  # e.g. a sharding of another rank than its leaf: the compiled executable decides
        return None


_DUMP_FLAG = re.compile(r"--xla_dump_\S*")


class _MemoKeys:
    """The memo's view of one capture: the content key of both lowered programs (canonical
    StableHLO text: no line numbers, repository root made relative), the digest of their source
    locations, the files behind their ops, and whether the parent's memo holds the result.

    Printing both programs with their locations costs 0.4 s at 405B shapes, canonicalizing and
    scanning the texts another 0.1 s; writing them as MLIR bytecode costs 0.03 s. So the keys are
    computed from the texts once per pair of programs and kept in the memo ("programs") under a
    hash of the bytecode and everything else the keys depend on; a rerun of unchanged code finds
    them without printing anything."""

    def __init__(self, memo_request: dict, model, args, ref_lowered, dist_lowered, read: FilesRead) -> None:
        # lazy: jax is heavy; equivci's parent process loads this module without it
        import jax
        from jax.tree_util import keystr, tree_flatten_with_path

        def leaves(tree) -> str:
            return json.dumps(
                [[keystr(p), list(map(int, x.shape)), str(x.dtype)] for p, x in tree_flatten_with_path(tree)[0]]
            )

        self.memo = memo
        self.request = memo_request
        self.repo_root = memo_request["repo_root"]
        self.lowered = (ref_lowered, dist_lowered)
        self.read = read
        self.common = (
            memo_request["fingerprint"],
            jax.__version__,
            importlib.metadata.version("jaxlib"),
            json.dumps(list(map(list, model.mesh))),
            _DUMP_FLAG.sub("", os.environ.get("XLA_FLAGS", "")),
            leaves(args),
            leaves(dist_lowered.out_info),
            # The oracle's settings decide between `mismatch` and `unproven`.
            json.dumps([model.oracle.rtol, model.oracle.atol, model.oracle.inputs and model.oracle.inputs.spec]),
            # ... and so does whether a proof may rest on valid index inputs.
            f"assume_valid_indices={model.assume_valid_indices}",
            # ... and the integer inputs' stated range
            f"int_range={model.int_range}",
        )
        self.store = memo.Memo(Path(memo_request["cache_dir"])) if memo_request.get("cache_dir") else None
        try:
            self.programs: str | None = memo.key(
                "programs", *self.common, self.repo_root, *map(_bytecode, self.lowered)
            )
        except Exception:  # noqa: BLE001 - a shortcut only: without it the texts give the keys
            self.programs = None
        self.stored = self.store.program_keys(self.programs) if self.store is not None and self.programs else None
        self.texts: dict[int, str] = {}

    def print_distributed(self) -> None:
        """Its text, before the compile starts: the compile then has the module to itself."""
        self.texts[1] = self.lowered[1].as_text(debug_info=True)

    def fields(self) -> dict:
        """content_key, loc_digest, sources and `cached` (computed from the texts, and stored for
        the next run, where the memo did not know these programs)."""
        memo = self.memo
        keys = self.stored
        if keys is None:
            texts = [self.texts.get(i) or lowered.as_text(debug_info=True) for i, lowered in enumerate(self.lowered)]
            keys = {
                "content_key": memo.key(*self.common, *(memo.canonical_mlir(t, self.repo_root) for t in texts)),
                "loc_digest": memo.location_digest(texts, self.repo_root),
                "files": memo.named_files(texts),
            }
            if self.store is not None and self.programs:
                self.store.put_program_keys(self.programs, **keys)
        key, loc_digest = keys["content_key"], keys["loc_digest"]
        skip = str(Path(str(memo.__file__)).resolve().parent)  # equivci itself is in the fingerprint
        imported = [
            f
            for f in (getattr(m, "__file__", None) for m in list(sys.modules.values()))
            if f and not f.startswith(skip + os.sep)
        ]
        sources = [
            s
            for s in memo.repository_files(keys["files"] + imported + sorted(self.read.paths), self.repo_root)
            if not any(part in ("site-packages", "dist-packages", "__pycache__", ".git") for part in Path(s).parts)
            and not str(Path(self.repo_root, s).resolve()).startswith(skip + os.sep)
            and os.path.isfile(os.path.join(self.repo_root, s))
        ]
        known = self.request.get("known") or {}
        cached = (key in known and known[key] in (None, loc_digest)) or (
            self.store is not None and self.store.usable(key, loc_digest)
        )
        return {"content_key": key, "loc_digest": loc_digest, "sources": sources, "cached": bool(cached)}


def _bytecode(lowered) -> bytes:
    buffer = io.BytesIO()
    lowered.compiler_ir("stablehlo").operation.write_bytecode(file=buffer)
    return buffer.getvalue()


def main(argv: list[str]) -> int:
    request_path, result_path, compiling_fd = argv
    request = {**json.loads(Path(request_path).read_text()), "compiling_fd": int(compiling_fd)}
    laps = Laps()
    # From the parent's spawn to here: the interpreter's start and equivci's imports.
    laps.rows.append(("start-up", max(0.0, time.time() - request.get("spawned_at", time.time()))))
    try:
        result = {**capture(request, laps), "timings": laps.rows}
    except EquivciError as err:
        result = {"error": str(err), "traceback": traceback.format_exc()}
    except SystemExit as exc:  # the user's code called sys.exit() (or exit()) while loading or tracing
        result = {
            "error": f"capturing model '{request['model']}' stopped: the model's code called "
            f"sys.exit({exc.code!r}){where_in_user_code(exc, Path.cwd())}. "
            "Entrypoints and inputs() must return values; move command-line handling under "
            '`if __name__ == "__main__":`.',
            "traceback": traceback.format_exc(),
        }
    except Exception as exc:  # anything else is still reported as a capture error, with details for --debug
        result = {
            "error": f"capturing model '{request['model']}' failed: {type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
        }
    # Whole or not at all: a full disk must not leave half an answer for the parent to read.
    partial = Path(result_path + ".partial")
    partial.write_text(json.dumps(result))
    os.replace(partial, result_path)
    return 0


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    except BaseException as exc:  # noqa: BLE001 - the answer could not be written (a full disk): one line for the parent
        print(f"equivci capture: cannot report: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Not sys.exit: interpreter teardown (jax's exit handlers, the backend's destruction) would run
    # under a compile still going on in its thread after the capture took what it needed.
    os._exit(code)
