"""Stop paying for XLA's compile once the SPMD partitioner is done.

equivci needs two things from compiling the distributed program: the `after_spmd-partitioning`
dump (the per-device program) and the entry shardings XLA records on the module (the placements;
`compiled.input_shardings` / `output_shardings` are made from them). Both exist long before the
CPU backend finishes optimizing and generating code (a 405B-shaped Llama: partitioned after about
a third of the compile). So the compile runs in a daemon thread while the capture waits for the
dump files to be closed (inotify on Linux), reads the shardings from the dumped module proto (the
same `spmd_parameters_shardings` / `spmd_output_sharding` the executable reports) and carries on;
the child process exits without waiting for the rest of the compile.

Whenever the shortcut cannot be taken for sure (no inotify, no dump, an unreadable proto, a count
that does not match the leaves), the caller waits for the full compile instead: `SpmdDump` is
None and nothing is guessed.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import re
import select
import struct
import threading
from pathlib import Path
from typing import Any

# Flags for the capture child: the pass dumps around SPMD partitioning, as text (for the HLO
# parser) and as protos (for the shardings XLA records on the partitioned module).
DUMP_FLAGS = "--xla_dump_hlo_pass_re=spmd-partitioning --xla_dump_hlo_as_text --xla_dump_hlo_as_proto"

_AFTER_SPMD_TEXT = re.compile(r".*\.jit_.*after_spmd-partitioning.*\.txt$")
_PROTO_SUFFIX = ".hlo.pb"  # `<same stem>.hlo.pb` next to `<stem>.txt`
_IN_CLOSE_WRITE = 0x8
_POLL_SECONDS = 0.1


@dataclasses.dataclass(frozen=True)
class SpmdDump:
    """The partitioned module as XLA dumped it, with the entry shardings it records."""

    text: str
    parameter_shardings: tuple[Any, ...]  # xla OpSharding per entry parameter
    output_shardings: tuple[Any, ...]  # xla OpSharding per output (one for all outputs is possible)


class BackgroundCompile:
    """`lowered.compile()` in a daemon thread; `result()` joins it (and re-raises its error)."""

    def __init__(self, lowered) -> None:
        self._lowered = lowered
        self._compiled = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="equivci-compile", daemon=True)

    def _run(self) -> None:
        try:
            self._compiled = self._lowered.compile()
        except BaseException as exc:  # handed to the caller by result()
            self._error = exc

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._compiled


class _Inotify:
    """Names of files closed after writing in one folder (Linux inotify through libc)."""

    def __init__(self, folder: Path) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        if libc.inotify_add_watch(self._fd, os.fsencode(folder), _IN_CLOSE_WRITE) < 0:
            os.close(self._fd)
            raise OSError(ctypes.get_errno(), "inotify_add_watch")

    def closed_files(self, timeout: float) -> list[str]:
        if not select.select([self._fd], [], [], timeout)[0]:
            return []
        data, names, offset = os.read(self._fd, 1 << 16), [], 0
        while offset + 16 <= len(data):
            _, mask, _, length = struct.unpack_from("iIII", data, offset)
            name = data[offset + 16 : offset + 16 + length].rstrip(b"\0")
            if mask & _IN_CLOSE_WRITE:
                names.append(os.fsdecode(name))
            offset += 16 + length
        return names

    def close(self) -> None:
        os.close(self._fd)


def watch(folder: Path) -> _Inotify | None:
    """A watch on `folder` (created if missing), or None where inotify is not available."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        return _Inotify(folder)
    except (AttributeError, OSError):  # not Linux, or out of watches
        return None


def wait_for_spmd_dump(watcher: _Inotify, folder: Path, job: BackgroundCompile) -> SpmdDump | None:
    """Wait until the after-partitioning text and proto are both closed; None if the compile ends
    (or fails) first, or if the proto does not give one sharding per entry parameter."""
    closed: set[str] = set()
    try:
        while job.alive():
            closed.update(watcher.closed_files(_POLL_SECONDS))
            stems = [n[: -len(".txt")] for n in closed if _AFTER_SPMD_TEXT.match(n)]
            ready = [s for s in stems if s + _PROTO_SUFFIX in closed]
            if ready:
                return _read_dump(folder, min(ready))
        return None
    finally:
        watcher.close()


def _read_dump(folder: Path, stem: str) -> SpmdDump | None:
    from jaxlib import _hlo

    module_bytes = _length_delimited_field(Path(folder, stem + _PROTO_SUFFIX).read_bytes(), 1)
    if module_bytes is None:  # HloProto.hlo_module missing
        return None
    try:
        module = _hlo.HloModule.from_serialized_hlo_module_proto(module_bytes)
    except RuntimeError:
        return None
    params, output = module.spmd_parameters_shardings, module.spmd_output_sharding
    if params is None or output is None:
        return None
    outputs = tuple(output.tuple_shardings) if output.type == _hlo.OpSharding.Type.TUPLE else (output,)
    return SpmdDump(Path(folder, stem + ".txt").read_text(), tuple(params), outputs)


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def _length_delimited_field(data: bytes, number: int) -> bytes | None:
    """The first length-delimited field `number` of a serialized protobuf message (the dump is
    an `HloProto`, whose field 1 is the `HloModuleProto`)."""
    at = 0
    try:
        while at < len(data):
            key, at = _varint(data, at)
            kind = key & 7
            if kind == 0:
                _, at = _varint(data, at)
            elif kind == 1:
                at += 8
            elif kind == 5:
                at += 4
            elif kind == 2:
                length, at = _varint(data, at)
                if key >> 3 == number:
                    return data[at : at + length] if at + length <= len(data) else None
                at += length
            else:
                return None
    except IndexError:
        return None
    return None


def shardings_for_leaves(op_shardings: tuple[Any, ...], count: int, device_list, one_for_all: bool) -> list | None:
    """jax shardings for `count` leaves from XLA's entry shardings, as jax makes them for a
    compiled executable: one per leaf, or (outputs: `one_for_all`) XLA's single sharding for
    every leaf. None when the counts do not fit."""
    from jax._src.sharding_impls import GSPMDSharding

    if one_for_all and len(op_shardings) == 1:
        op_shardings = op_shardings * count
    if len(op_shardings) != count or device_list is None:
        return None
    return [GSPMDSharding(device_list, op) for op in op_shardings]
