"""The cache: a persistent, content-keyed store of verification results, and the per-model record of
the source files behind the last capture (what `--changed-since` and the pre-commit hook select on).
A leaf: it knows folders, keys and results, not manifests or repositories (equivci.memo finds the
folder of a manifest's workspace).

Layout under the cache folder (default `.equivci/cache` at the repository root):

    CACHEDIR.TAG                      marks the folder as a cache (backup tools skip it)
    v1/results/ab/abcdef....json      one entry per content key: a result and what it was computed from
    v1/models/0123....json            the last capture of one (manifest, model): its key and sources
    v1/programs/cd/cdef....json       a pair of lowered programs (hash of their MLIR bytecode) -> their
                                      content key, location digest and the files their locations name

Keys are content hashes (`key(*parts)`), never names: the canonical text of both programs (HLO with
SSA names, source locations and stack-frame tables stripped), the mesh, the argument leaves, the XLA
flags and the versions of equivci (its source files, not just the version string), jax, jaxlib and
egglog. A stale result therefore cannot be found under a new key. Results whose findings carry source
lines also record a digest of the locations they were computed with, and are only reused when the
locations are unchanged too (a comment that shifts lines re-verifies a model with findings, never a
verified one, which has no lines to get wrong).

Every file is written atomically (a temporary file in the same folder, then os.replace). An entry
that cannot be read, does not parse, has another format number or a different key inside is
ignored (and rebuilt by the next write). The layer-level cache (kind "layers": a layer's result, proved or not) and the diagnoses of big
unproven models (kind "diagnoses": the first defect up to the first unproved layer,
equivci.verify.prefix) use the same store, with keys built by `key()` from what each is computed
from (the layer's canonical text and input relations; the prefix's terms, instructions and source
statements), equivci's fingerprint and the budgets.

The "programs" entries only save work: the bytecode is a lossless serialization of the modules
(locations included), so equal bytecode means equal printed texts and hence the same content key
and location digest; the entry is written by the capture that computed those from the texts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import equivci
from equivci.results import Finding, LayerCounts, ModelResult, Status

FORMAT = 1
CACHEDIR_TAG = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by equivci.\n"
    "# For information about cache directory tags, see https://bford.info/cachedir/\n"
)
DEFAULT_CACHE_DIR = Path(".equivci") / "cache"


# --- keys -------------------------------------------------------------------------------------------


def key(*parts: str | bytes) -> str:
    """sha256 over length-prefixed parts (so ("ab", "c") and ("a", "bc") differ)."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8") if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


_FINGERPRINT: str | None = None


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def fingerprint() -> str:
    """equivci's identity for cache keys: its version, a hash of its own source files (a verifier
    edited in a development install changes it), Python, egglog, jax and jaxlib versions."""
    global _FINGERPRINT
    if _FINGERPRINT is None:
        pkg = Path(equivci.__file__).resolve().parent
        h = hashlib.sha256()
        for path in sorted(pkg.rglob("*.py")):
            h.update(str(path.relative_to(pkg)).encode())
            h.update(path.read_bytes())
        _FINGERPRINT = key(
            "equivci",
            equivci.__version__,
            h.hexdigest(),
            sys.version,
            "egglog",
            _dist_version("egglog"),
            "jax",
            _dist_version("jax"),
            "jaxlib",
            _dist_version("jaxlib"),
        )
    return _FINGERPRINT


_MLIR_FILE_LOC = re.compile(r'loc\("((?:[^"\\]|\\.)*)":\d+:\d+(?:\s+to\s+\d*:\d+)?\)')


def canonical_mlir(text: str, repo_root: str | Path) -> str:
    """StableHLO text printed with debug_info=True, without line and column numbers and with the
    repository root made relative. Location names (op names with named scopes such as layers_3,
    argument paths) and the structure of the location table stay: layers are split on them. A
    comment that shifts lines leaves it unchanged; any change to an op changes it."""
    root = str(Path(repo_root).resolve())
    return _MLIR_FILE_LOC.sub(lambda m: f'loc("{m.group(1)}")', text).replace(root, "<repo>")


def named_files(texts: Iterable[str]) -> list[str]:
    """The file names in the FileNames tables (or inline source_file) of HLO texts and in the file
    locations of StableHLO texts printed with debug_info, as printed (absolute, unresolved)."""
    out: set[str] = set()
    for text in texts:
        in_files = False
        for line in text.splitlines():
            s = line.strip()
            if s == "FileNames":
                in_files = True
                continue
            if in_files:
                if not s:
                    in_files = False
                    continue
                _, _, rest = s.partition(" ")
                out.add(rest.strip().strip('"'))
        out.update(re.findall(r'source_file="((?:[^"\\]|\\.)*)"', text))
        out.update(m.group(1) for m in _MLIR_FILE_LOC.finditer(text))
    return sorted(out)


def repository_files(paths: Iterable[str], repo_root: str | Path) -> list[str]:
    """The repository-relative files among absolute `paths` (symbolic links resolved), less the
    cache folder."""
    prefix = os.path.join(Path(repo_root).resolve(), "")
    # Resolving each path costs a tenth of a second over the ~600 modules a capture imports;
    # their folders are few, so each folder is resolved once (and a file that is a link whole).
    folders: dict[str, str] = {}
    found = set()
    for path in paths:
        if not os.path.isabs(path):
            continue
        if os.path.islink(path):
            real = os.path.realpath(path)
        else:
            folder, name = os.path.split(path)
            if folder not in folders:
                folders[folder] = os.path.realpath(folder)
            real = os.path.join(folders[folder], name)
        if real.startswith(prefix):
            found.add(real[len(prefix) :].replace(os.sep, "/"))
    return sorted(f for f in found if not f.startswith(".equivci/"))


def location_digest(hlo_texts: Iterable[str], repo_root: str | Path) -> str:
    """A digest of where every op comes from (the full texts, repository root made relative)."""
    root = str(Path(repo_root).resolve())
    return key(*(t.replace(root, "<repo>") for t in hlo_texts))


def file_digests(repo_root: str | Path, rel_paths: Iterable[str]) -> dict[str, str]:
    """sha256 of each file's bytes ("" for a missing file)."""
    root = Path(repo_root)
    out = {}
    for rel in sorted(set(rel_paths)):
        try:
            out[rel] = hashlib.sha256((root / rel).read_bytes()).hexdigest()
        except OSError:
            out[rel] = ""
    return out


# --- results <-> JSON -------------------------------------------------------------------------------


def result_to_json(result: ModelResult) -> dict[str, Any]:
    return {
        "name": result.name,
        "status": result.status.value,
        "seconds": result.seconds,
        "layers": dataclasses.asdict(result.layers),
        "findings": [dataclasses.asdict(f) for f in result.findings],
    }


def _known(cls, row: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in row.items() if k in names}


def result_from_json(doc: Mapping[str, Any]) -> ModelResult:
    return ModelResult(
        name=str(doc["name"]),
        status=Status(doc["status"]),
        seconds=float(doc.get("seconds", 0.0)),
        layers=LayerCounts(**_known(LayerCounts, doc.get("layers") or {})),
        findings=tuple(Finding(**_known(Finding, f)) for f in doc.get("findings") or ()),
    )


def has_lines(result: ModelResult) -> bool:
    return any(f.path is not None or f.line is not None for f in result.findings)


# --- the store --------------------------------------------------------------------------------------


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def ensure_cache_dir(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    tag = root / "CACHEDIR.TAG"
    if not tag.exists():
        atomic_write(tag, CACHEDIR_TAG)


class Memo:
    """Entries by (kind, key): an in-run dictionary in front of an optional folder on disk.

    `Memo(None)` (what --no-cache gives) reads and writes nothing on disk but still lets identical
    work within one run be done once.
    """

    def __init__(self, root: Path | None):
        self.root = Path(root) if root is not None else None
        self._run: dict[tuple[str, str], dict[str, Any]] = {}
        self.ignored: list[Path] = []  # corrupt or foreign entries seen (and ignored) in this run

    # paths
    def path(self, kind: str, k: str) -> Path:
        assert self.root is not None
        return self.root / f"v{FORMAT}" / kind / k[:2] / f"{k}.json"

    # entries
    def get(self, kind: str, k: str) -> dict[str, Any] | None:
        hit = self._run.get((kind, k))
        if hit is not None:
            return hit
        if self.root is None:
            return None
        path = self.path(kind, k)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, ValueError):
            self.ignored.append(path)
            return None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("key") != k or "payload" not in doc:
            self.ignored.append(path)
            return None
        self._run[(kind, k)] = doc["payload"]
        return doc["payload"]

    def put(self, kind: str, k: str, payload: dict[str, Any]) -> None:
        self._run[(kind, k)] = payload
        if self.root is None:
            return
        try:
            ensure_cache_dir(self.root)
            atomic_write(self.path(kind, k), json.dumps({"format": FORMAT, "key": k, "payload": payload}))
        except OSError as exc:  # a read-only or full disk costs the cache, never the run
            print(f"equivci: cannot write the cache under {self.root}: {exc}", file=sys.stderr)

    # model results
    def result(self, k: str, loc_digest: str | None = None) -> ModelResult | None:
        """The result stored under content key `k`, if usable with these source locations."""
        payload = self.get("results", k)
        if payload is None:
            return None
        try:
            result = result_from_json(payload["result"])
        except (KeyError, TypeError, ValueError):
            self.ignored.append(self.path("results", k) if self.root else Path(k))
            return None
        if has_lines(result) and loc_digest is not None and payload.get("loc_digest") != loc_digest:
            return None
        return result

    def usable(self, k: str, loc_digest: str | None) -> bool:
        return self.result(k, loc_digest) is not None

    def known_results(self) -> dict[str, str | None]:
        """Keys of the results already in this run's memory -> the location digest they need
        (None: any), for the capture child's early exit."""
        out: dict[str, str | None] = {}
        for (kind, k), payload in self._run.items():
            if kind == "results":
                try:
                    lines = has_lines(result_from_json(payload["result"]))
                except (KeyError, TypeError, ValueError):
                    continue
                out[k] = payload.get("loc_digest") if lines else None
        return out

    def put_result(self, k: str, result: ModelResult, loc_digest: str) -> None:
        self.put("results", k, {"result": result_to_json(result), "loc_digest": loc_digest})

    # the keys of a pair of lowered programs (see the module docstring)
    def program_keys(self, k: str) -> dict[str, Any] | None:
        payload = self.get("programs", k)
        if payload is None:
            return None
        files = payload.get("files") if isinstance(payload, dict) else None
        if not (
            isinstance(files, list)
            and all(isinstance(v, str) for v in [payload.get("content_key"), payload.get("loc_digest"), *files])
        ):
            self.ignored.append(self.path("programs", k) if self.root else Path(k))
            return None
        return payload

    def put_program_keys(self, k: str, content_key: str, loc_digest: str, files: list[str]) -> None:
        self.put("programs", k, {"content_key": content_key, "loc_digest": loc_digest, "files": files})

    # the last capture of a model (for --changed-since and pre-commit)
    @staticmethod
    def model_key(manifest_rel: str, model_name: str) -> str:
        return key("model", manifest_rel, model_name)

    def last_capture(self, manifest_rel: str, model_name: str) -> dict[str, Any] | None:
        doc = self.get("models", self.model_key(manifest_rel, model_name))
        if not isinstance(doc, dict) or not isinstance(doc.get("sources"), list):
            return None
        return doc

    def record_capture(self, manifest_rel: str, model_name: str, record: dict[str, Any]) -> None:
        self.put("models", self.model_key(manifest_rel, model_name), record)
