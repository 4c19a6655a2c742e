"""A rounding of a reshape that only inserts size-1 dims keeps the rounding on top (the moved form
stated beside it): a device holding one KV head casts its bf16 projection, reshaped to [b, s, 1, hd],
to f32 for RoPE, where the reference casts all heads' [b, s, h, hd]. With the cast moved below the
reshape, the device's value reads as a broadcast of the cast projection (a reshape inserting only
size-1 dims is one) and its product with the cos table no longer met the reference's. The model is
the benchmark's per_layer style (Hugging Face style, RoPE tables built in every layer) at its tiny
shape, one head per device on tp=8: it was `unproven` at every shape."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from model_package import verify_named

from equivci.manifest import load_manifest
from equivci.results import Status

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_per_layer_style_with_one_head_per_device_verifies(tmp_path):
    sys.path.insert(0, str(BENCH))
    try:
        import run_bench
    finally:
        sys.path.remove(str(BENCH))
    (tmp_path / "models").mkdir()
    for file in run_bench.MODEL_FILES:
        shutil.copy(BENCH / file, tmp_path / "models" / Path(file).name)
    spec = run_bench.STYLES["per_layer"]
    mesh = ", ".join(f"{axis}: {size}" for axis, size in spec.mesh.items())
    (tmp_path / "equivci.yaml").write_text(
        run_bench.MANIFEST.format(style="per_layer", cfg="tiny", module=spec.module, mesh=mesh)
    )
    result = verify_named(load_manifest(tmp_path / "equivci.yaml"), "per_layer-tiny")
    assert result.status is Status.VERIFIED, result.findings
