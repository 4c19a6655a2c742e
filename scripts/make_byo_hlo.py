"""Make HLO files that look like another compiler's dumps, for `kind: hlo` models (docs/byo-hlo.md).

    .venv/bin/python scripts/make_byo_hlo.py OUT_DIR TP LAYERS [--wrong-k-start]

Lowers the Llama-style model of tests/data/byo_hlo/llama_tp.py (the reference on one device, the
tensor-parallel shard_map program on TP fake CPU devices, per device after XLA's SPMD partitioning)
and rewrites the texts the way other frontends print them: JAX's stack-frame tables are replaced by
`source_file`/`source_line` metadata (the op names, whose scopes name the layers, are kept), shardings are dropped, every all-reduce
becomes a vendor custom call `AwsNeuronAllReduce` without its groups, sharding markers become
`AwsNeuronTransfer` custom calls, and `partition-id` becomes `replica-id`. It writes
reference.hlo.txt, distributed.hlo.txt and relations.yaml (which declares what was renamed);
tests/data/byo_hlo/ holds the TP=2 one-layer files made by this script.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
from pathlib import Path

MAX_DEVICES = 8
DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "byo_hlo"
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={MAX_DEVICES}").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(DATA))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import llama_tp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, Mesh  # noqa: E402

from equivci.hlo.parser import balanced_end, parse_module, split_top  # noqa: E402

TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
MARKERS = ("Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape")
DROP = ("sharding", "frontend_attributes", "metadata", "channel_id", "use_global_device_ids", "backend_config",
        "api_version", "custom_call_has_side_effect")


def _metadata(text: str, keep_sources: bool) -> dict[str, str]:
    """Instruction name -> its metadata as a frontend prints it: the op name (whose scopes name
    the layers) and, with `keep_sources`, the line in llama_tp.py (the innermost frame there)."""
    out = {}
    for comp in parse_module(text).computations.values():
        for inst in comp.instructions:
            fields = [f'op_name="{inst.op_name}"'] if inst.op_name else []
            line = next((loc.line for loc in inst.stack if Path(loc.file).name == "llama_tp.py"), None)
            if keep_sources and line:
                fields.append(f'source_file="llama_tp.py" source_line={line}')
            if fields:
                out[inst.name] = "metadata={" + " ".join(fields) + "}"
    return out


def frontend_text(text: str, module_name: str, keep_sources: bool) -> str:
    """`text` (JAX's HLO) as another frontend prints it."""
    metadata = _metadata(text, keep_sources)
    out, skipping = [], False
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped in TABLES:
            skipping = True
            continue
        if skipping:
            skipping = bool(stripped)
            continue
        if stripped.startswith("HloModule"):
            out.append(f"HloModule {module_name}")
            continue
        out.append(_instruction(raw, metadata))
    return "\n".join(out) + "\n"


def _instruction(line: str, metadata: dict[str, str]) -> str:
    head, eq, rest = line.partition(" = ")
    if not eq or "(" not in rest or line.rstrip().endswith("{"):
        return line
    shape_end = balanced_end(rest, 0) if rest.startswith("(") else rest.index(" ")
    shape, body = rest[:shape_end], rest[shape_end:].strip()
    opcode = body[:body.index("(")]
    end = balanced_end(body, len(opcode))
    operands = body[len(opcode) + 1:end - 1]
    attrs = [a for a in split_top(body[end:].lstrip(", ")) if a.split("=", 1)[0].strip() not in DROP]
    if opcode == "all-reduce":
        opcode, attrs = "custom-call", ['custom_call_target="AwsNeuronAllReduce"']
    elif opcode == "custom-call" and any(f'custom_call_target="{m}"' in a for a in attrs for m in MARKERS):
        attrs = ['custom_call_target="AwsNeuronTransfer"']
    elif opcode == "partition-id":
        opcode = "replica-id"
    name = head.strip().removeprefix("ROOT").strip().lstrip("%")
    if name in metadata:
        attrs.append(metadata[name])
    return f"{head} = {shape} {opcode}({operands})" + "".join(", " + a for a in attrs)


def relations(tp: int, layers: int) -> str:
    rows = ["version: 1", "device_index: replica-id", "custom_calls:",
            "  AwsNeuronAllReduce: {all-reduce: add, groups: [tp]}", "  AwsNeuronTransfer: identity",
            "parameters:", "  0: {reference: 0}              # x, replicated"]
    for i in range(layers):
        d, r = 1 + 7 * i, 1 + 9 * i  # distributed and reference numbers of the layer's first weight
        rows += [
            f"  # layer {i}",
            f"  {d}: {{reference: {r}}}",
            f"  {d + 1}: {{concat: 1, parts: [{{reference: {r + 1}, split: {{1: tp}}}}, "
            f"{{reference: {r + 2}, split: {{1: tp}}}}, {{reference: {r + 3}, split: {{1: tp}}}}]}}",
            f"  {d + 2}: {{reference: {r + 4}, split: {{0: tp}}}}",
            f"  {d + 3}: {{reference: {r + 5}}}",
            f"  {d + 4}: {{reference: {r + 6}, split: {{1: tp}}}}",
            f"  {d + 5}: {{reference: {r + 7}, split: {{1: tp}}}}",
            f"  {d + 6}: {{reference: {r + 8}, split: {{0: tp}}}}",
        ]
    rows += ["outputs:", "  0: {reference: 0}"]
    return "\n".join(rows) + "\n"


def make(out: Path, tp: int, layers: int, wrong_k_start: bool = False, keep_sources: bool = True) -> None:
    out.mkdir(parents=True, exist_ok=True)
    x, ref, dist = llama_tp.shapes(layers)
    reference = jax.jit(llama_tp.reference).lower(x, *ref).as_text(dialect="hlo", debug_info=True)
    (out / "reference.hlo.txt").write_text(frontend_text(reference, f"llama_ref_l{layers}", keep_sources=False))
    mesh = Mesh(np.array(jax.devices()[:tp]), ("tp",), axis_types=(AxisType.Auto,))
    with tempfile.TemporaryDirectory() as dump:
        options = {"xla_dump_to": dump, "xla_dump_hlo_pass_re": "spmd-partitioning"}
        jax.jit(llama_tp.distributed(mesh, layers, wrong_k_start)).lower(x, *dist).compile(compiler_options=options)
        (partitioned,) = glob.glob(os.path.join(dump, "*after_spmd-partitioning*.txt"))
        text = Path(partitioned).read_text()
    (out / "distributed.hlo.txt").write_text(frontend_text(text, f"llama_tp{tp}_l{layers}", keep_sources))
    (out / "relations.yaml").write_text(relations(tp, layers))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("tp", type=int, choices=(2, 4, 8))
    parser.add_argument("layers", type=int)
    parser.add_argument("--wrong-k-start", action="store_true", help="k read from where q lives in the fused weight")
    args = parser.parse_args()
    make(args.out, args.tp, args.layers, args.wrong_k_start)


if __name__ == "__main__":
    main()
