"""Device groups of HLO collectives, in the three printed forms XLA uses."""

from __future__ import annotations

import re

import numpy as np


class UnsupportedGroups(ValueError):
    pass


def _iota_groups(text: str) -> list[list[int]]:
    # "[2,4]<=[8]" or "[4,2]<=[2,4]T(1,0)"
    m = re.fullmatch(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", text.replace(" ", ""))
    if not m:
        raise UnsupportedGroups(text)
    out_shape = [int(x) for x in m.group(1).split(",")]
    src_shape = [int(x) for x in m.group(2).split(",")]
    ids = np.arange(int(np.prod(src_shape))).reshape(src_shape)
    if m.group(3):
        ids = ids.transpose([int(x) for x in m.group(3).split(",")])
    return ids.reshape(out_shape[0], -1).tolist()


def _mesh_groups(text: str) -> list[list[int]]:
    # "mesh['axis_0'=2,'axis_1'=4] {'axis_1'}": groups vary the listed axes, in row-major order.
    m = re.fullmatch(r"mesh\[(.*?)\]\s*\{(.*)\}", text.strip())
    if not m:
        raise UnsupportedGroups(text)
    axes = [(a.split("=")[0].strip().strip("'"), int(a.split("=")[1])) for a in m.group(1).split(",")]
    names = [a for a, _ in axes]
    listed = [s.strip().strip("'") for s in m.group(2).split(",") if s.strip()]
    if any(name not in names for name in listed):
        raise UnsupportedGroups(text)  # sub-axes such as 'x':(1)2 are not modelled yet
    ids = np.arange(int(np.prod([s for _, s in axes]))).reshape([s for _, s in axes])
    kept = [i for i, n in enumerate(names) if n not in listed]
    varied = [names.index(n) for n in listed]
    ids = ids.transpose(kept + varied)
    group_size = int(np.prod([axes[i][1] for i in varied])) if varied else 1
    return ids.reshape(-1, group_size).tolist()


def parse_groups(text: str | None, num_devices: int) -> list[list[int]]:
    """Every device in exactly one group; a missing or empty attribute means all devices."""
    if text is None or text.strip() in ("", "{}"):
        return [list(range(num_devices))]
    text = text.strip()
    if text.startswith("mesh["):
        groups = _mesh_groups(text)
    elif text.startswith("["):
        groups = _iota_groups(text)
    elif text.startswith("{"):
        groups = [[int(x) for x in g.split(",") if x.strip()] for g in re.findall(r"\{([\d,\s]*)\}", text[1:-1])]
        if not groups:
            groups = [list(range(num_devices))]
    else:
        raise UnsupportedGroups(text)
    members = sorted(d for g in groups for d in g)
    if members != list(range(num_devices)):
        raise UnsupportedGroups(text)
    return groups


def parse_pairs(text: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in re.findall(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}", text)]


def axis_groups(mesh: tuple[tuple[str, int], ...]) -> dict[str, list[list[int]]]:
    """For each mesh axis, the device groups along it (devices numbered row-major over the mesh)."""
    spec = ",".join(f"'{name}'={size}" for name, size in mesh)
    return {name: _mesh_groups(f"mesh[{spec}] {{'{name}'}}") for name, size in mesh if size > 1}
