"""Stop paying for XLA's compile once the SPMD partitioner is done.

equivci needs two things from compiling the distributed program: the `after_spmd-partitioning`
dump (the per-device program) and the entry shardings XLA records on the module (the placements;
`compiled.input_shardings` / `output_shardings` are made from them). Both exist long before the
CPU backend finishes optimizing and generating code (a 405B-shaped Llama at TP=8 is partitioned
about a fifth of the way into its compile). So the compile runs in a daemon thread while the capture waits for the
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
# parser) and as protos (for the shardings XLA records on the partitioned module). Large constants
# are printed in full: an elided one (`{...}`) is opaque, so a table the program slices per device
# (RoPE's cos/sin at a shard's positions) could not be related to the reference's.
DUMP_FLAGS = (
    "--xla_dump_hlo_pass_re=spmd-partitioning --xla_dump_hlo_as_text --xla_dump_hlo_as_proto --xla_dump_large_constants"
)

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
    except (AttributeError, OSError, TypeError):  # not Linux, or out of watches
        return None


def wait_for_spmd_dump(watcher: _Inotify, folder: Path, job: BackgroundCompile) -> SpmdDump | None:
    """Wait until the after-partitioning text and proto are both closed and read them; None if
    the compile ends (or fails) first or the proto lacks the partitioner's records."""
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


# Field numbers in XLA's hlo.proto (protobuf field numbers never change): the dump is an HloProto
# whose `hlo_module` holds the records the SPMD partitioner leaves on the module.
_HLO_PROTO_MODULE = 1
_MODULE_OUTPUT_SHARDING = 12
_MODULE_PARAMETER_SHARDINGS = 14


def _read_dump(folder: Path, stem: str) -> SpmdDump | None:
    """The dumped text and the module's sharding records; None when a record is missing. Only
    the records are decoded: building the whole module from the proto would cost more than the
    rest of this (0.4 s for a 405B-shaped Llama)."""
    # lazy: jax is heavy; the CLI's parent process must not import it
    from jax._src.lib import xla_client

    hlo_proto = _length_delimited_fields(Path(folder, stem + _PROTO_SUFFIX).read_bytes())
    if hlo_proto is None or len(hlo_proto.get(_HLO_PROTO_MODULE, ())) != 1:
        return None
    module = _length_delimited_fields(hlo_proto[_HLO_PROTO_MODULE][0])
    if module is None or len(module.get(_MODULE_OUTPUT_SHARDING, ())) != 1:
        return None

    def op_sharding(data: bytes):
        op = xla_client.OpSharding()
        op.ParseFromString(data)
        return op

    try:
        params = tuple(op_sharding(data) for data in module.get(_MODULE_PARAMETER_SHARDINGS, ()))
        output = op_sharding(module[_MODULE_OUTPUT_SHARDING][0])
    except Exception:  # not an OpSharding after all: let the full compile answer
        return None
    outputs = tuple(output.tuple_shardings) if output.type == xla_client.OpSharding.Type.TUPLE else (output,)
    return SpmdDump(Path(folder, stem + ".txt").read_text(), params, outputs)


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def _length_delimited_fields(data: bytes) -> dict[int, list[bytes]] | None:
    """The length-delimited fields of a serialized protobuf message by field number (other wire
    types skipped); None if the bytes are not a well-formed message."""
    fields: dict[int, list[bytes]] = {}
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
                fields.setdefault(key >> 3, []).append(data[at : at + length])
                at += length
            else:
                return None
    except IndexError:
        return None
    return fields if at == len(data) else None


def shardings_for_leaves(op_shardings: tuple[Any, ...], count: int, device_list, one_for_all: bool) -> list | None:
    """jax shardings for `count` leaves from XLA's entry shardings, as jax makes them for a
    compiled executable: one per leaf, or (outputs: `one_for_all`) XLA's single sharding for
    every leaf. None when the counts do not fit."""
    # lazy: jax is heavy; the CLI's parent process must not import it
    from jax._src.lib import xla_client
    from jax._src.sharding_impls import GSPMDSharding

    if one_for_all and len(op_shardings) == 1:
        op_shardings = op_shardings * count
    if len(op_shardings) != count or device_list is None:
        return None
    # The partitioner records Shardy's named (V3) shardings; the executable reports them as
    # tile assignments (V2), which is what jax's index maps were written for.
    return [
        GSPMDSharding(device_list, xla_client.HloSharding.from_proto(op).v3_to_v2_sharding()) for op in op_shardings
    ]
