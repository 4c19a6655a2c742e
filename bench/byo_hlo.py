"""Bring-your-own-HLO benchmark: Llama-style dumps (scripts/make_byo_hlo.py) at TP 2, 4 and 8 with
1 to 8 layers, and the TP=2 variant whose attention reads k from q's columns, each verified cold
as a `kind: hlo` model by its own `equivci verify --no-cache --model NAME`. Prints one row per
model: status, the model's seconds in the JSON report (reading the files and verifying), the wall
time of the whole command, and the first finding.

    .venv/bin/python bench/byo_hlo.py [--tp 2 4 8] [--layers 1 2 4 8] [--out DIR]

Target: every correct dump `verified` in <= 10 s on 2 cores; the wrong one `unproven` or `mismatch`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import make_byo_hlo  # noqa: E402  (sets the fake device count before jax starts)

ENTRY = """\
  - name: {name}
    kind: hlo
    reference: {name}/reference.hlo.txt
    distributed: {name}/distributed.hlo.txt
    relations: {name}/relations.yaml
    mesh: {{tp: {tp}}}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--out", type=Path, help="keep the dumps and the manifest here")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="equivci-byo-hlo-"))
    models = []
    for tp in args.tp:
        for layers in args.layers:
            name = f"llama-tp{tp}-l{layers}"
            make_byo_hlo.make(out / name, tp, layers)
            models.append((name, tp))
    make_byo_hlo.make(out / "llama-tp2-l1-wrong-k", 2, 1, wrong_k_start=True)
    models.append(("llama-tp2-l1-wrong-k", 2))
    (out / "equivci.yaml").write_text("version: 1\nmodels:\n" + "".join(ENTRY.format(name=n, tp=tp) for n, tp in models))
    print(f"{'model':24} {'status':10} {'seconds':>8} {'wall':>6}  first finding")
    worst = 0.0
    for name, _ in models:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "equivci", "verify", "--format", "json", "--no-cache", "--model", name],
                              cwd=out, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        (m,) = json.loads(proc.stdout)["models"]
        finding = next((f for f in m["findings"] if f["severity"] == "error"), None)
        where = f"{finding['path']}:{finding['line']} {finding['message'][:60]}" if finding else ""
        print(f"{name:24} {m['status']:10} {m['seconds']:8.2f} {wall:6.2f}  {where}", flush=True)
        if "wrong" not in name:
            worst = max(worst, m["seconds"])
    print(f"slowest correct dump: {worst:.2f} s (target <= 10 s); files in {out}")


if __name__ == "__main__":
    main()
