"""What the capture stage hands to the HLO parser and the verifier."""

from __future__ import annotations

import dataclasses

from equivci.manifest import mesh_size


@dataclasses.dataclass(frozen=True)
class LeafPlacement:
    """One flattened input or output leaf and which part of it each device holds."""

    path: str  # pytree key path, e.g. "[0]['w1']"
    shape: tuple[int, ...]  # global shape
    dtype: str
    # device_slices[d][k] = (start, stop) along dimension k of the global array held by device d
    # (device d = partition id d = the d-th device of the mesh in row-major order).
    device_slices: tuple[tuple[tuple[int, int], ...], ...]


@dataclasses.dataclass(frozen=True)
class CapturedModel:
    name: str
    mesh: tuple[tuple[str, int], ...]  # ordered (axis name, size)
    reference_hlo: str  # single-device HLO text, with stack-frame tables
    distributed_hlo: str  # per-device (SPMD-partitioned) HLO text, with stack-frame tables
    inputs: tuple[LeafPlacement, ...]  # distributed placements of the flattened inputs
    outputs: tuple[LeafPlacement, ...]  # distributed placements of the flattened outputs
    repo_root: str  # absolute; source paths in findings are relative to it
    # Memo (set when the parent asked for it): content key of both lowered programs, digest of their
    # source locations, repository-relative source files behind the ops (and repository modules
    # imported). `cached`: the child stopped before compiling because the memo holds the result;
    # the HLO texts and placements are then empty.
    content_key: str = ""
    loc_digest: str = ""
    sources: tuple[str, ...] = ()
    cached: bool = False
    # The child took the distributed program and placements from the SPMD-partitioning dump and
    # did not wait for the rest of XLA's compile (see capture/partitioned.py).
    partitioned_early: bool = False
    # (stage, seconds) of the capture, for --timings (see equivci.timings).
    timings: tuple[tuple[str, float], ...] = ()

    @property
    def num_devices(self) -> int:
        return mesh_size(self.mesh)
