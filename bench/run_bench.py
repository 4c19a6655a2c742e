"""Benchmark: equivci on Llama-style decoders written in several implementation styles.

Styles (`--styles`; bench/llama_tp.py and bench/styles/, each numerically checked by
bench/check_styles.py): llama_tp (Megatron TP=8 with shard_map, RoPE tables computed once),
per_layer (RoPE tables and causal mask computed inside every layer, Hugging Face style), scan
(lax.scan over stacked layers), fused_qkv (fused QKV and gate/up weights, grouped GQA), moe_ep
(8 experts, top-2, expert parallelism), fsdp_tp (2-D mesh fsdp=2 x tp=8), train_step (forward,
backward through shard_map, SGD update; float32). The forward styles other than llama_tp use
bfloat16 weights.

For each style and configuration (8B-, 70B-, 405B-shaped; abstract shapes only) in a fresh
temporary git repository, every figure from a fresh process running the real CLI:

  bare    the JAX lowering of both programs alone (jax.jit(...).lower, in-process time), and the
          wall time of a process that only imports jax and lowers both (same machine, same run)
  cold    `equivci verify` with an empty cache
  warm    the same again (no change): the capture child lowers, hashes, finds the key, stops
  warm-cs `equivci verify --changed-since HEAD` with no change: no capture at all
  1-layer one layer changed: a line of the LM-head block (logit soft-capping added; `lm_head`
          is one layer of the split, the decoder layers around it are unchanged),
          `--changed-since HEAD`

with wall time, CPU time (user + system of the process and every child it waited for, via wait4:
unlike the wall time, hardly inflated when other work loads the machine), peak RSS (the largest
process of the run), ratios to both bare figures, and where the time went, stage by stage (from
`equivci verify --timings`).
A run that exceeds `--timeout` seconds is killed with its children and reported as TIMEOUT;
after a cold timeout the style's other runs are skipped (nothing to reuse).
`--repeat N` takes the best of N for the runs that can be repeated as they are (bare, warm,
warm-cs), run in rounds so that other work on the machine weighs on them alike: there, the
minimum is the steadier figure.
`--layers N,N,...` adds a sweep over the number of identical layers (8B-shaped).
The run ends with one markdown table of every style and configuration measured.

    python bench/run_bench.py                       # llama_tp at 8b, 70b, 405b
    python bench/run_bench.py --styles all --configs 8b
    python bench/run_bench.py --styles per_layer,scan --configs 405b --timeout 900
    python bench/run_bench.py --configs 8b --layers 2,4,8,16 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from equivci import timings

HERE = Path(__file__).resolve().parent
EQUIVCI = [sys.executable, "-m", "equivci"]
LM_HEAD_OLD = "    return h @ w_out  # logits"
LM_HEAD_NEW = "    return 30.0 * jnp.tanh((h @ w_out) / 30.0)  # logits, soft-capped"



class Style(NamedTuple):  # not a dataclass: tests load this file without registering it as a module
    file: str  # relative to bench/; copied flat into the benchmark repository's models/
    mesh: dict[str, int]

    @property
    def module(self) -> str:
        return Path(self.file).stem


TP8 = {"tp": 8}
STYLES = {
    "llama_tp": Style("llama_tp.py", TP8),
    "per_layer": Style("styles/per_layer.py", TP8),
    "scan": Style("styles/scan.py", TP8),
    "fused_qkv": Style("styles/fused_qkv.py", TP8),
    "moe_ep": Style("styles/moe_ep.py", TP8),
    "fsdp_tp": Style("styles/fsdp_tp.py", {"fsdp": 2, "tp": 8}),
    "train_step": Style("styles/train_step.py", TP8),
}
MODEL_FILES = ("llama_tp.py", "styles/kit.py", *(s.file for s in STYLES.values() if s.file != "llama_tp.py"))

MANIFEST = """version: 1
models:
  - name: {style}-{cfg}
    reference: models/{module}.py:forward_{cfg}
    distributed: models/{module}.py:forward_{cfg}_tp
    inputs: models/{module}.py:inputs_{cfg}
    mesh: {{{mesh}}}
"""

BARE = """
import sys, time
t0 = time.perf_counter()
sys.path.insert(0, {models!r})
import importlib, jax, numpy as np
from jax.sharding import AxisType, Mesh
L = importlib.import_module({module!r})
names, sizes = {names!r}, {sizes!r}
mesh = Mesh(np.array(jax.devices()[:np.prod(sizes)]).reshape(sizes), names, axis_types=(AxisType.Auto,) * len(names))
args = L.inputs_{cfg}()
ref, dist = L.forward_{cfg}, L.forward_{cfg}_tp
t1 = time.perf_counter()
jax.jit(ref, keep_unused=True).lower(*args)
with jax.set_mesh(mesh):
    jax.jit(lambda *a: dist(*a, mesh=mesh), keep_unused=True).lower(*args)
t2 = time.perf_counter()
print(t2 - t1)
"""


def session_peak_rss_kb(session: int) -> int:
    """The largest peak RSS (VmHWM, kB) among the live processes of a session (Linux /proc; 0 elsewhere)."""
    peak = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # After the command in parentheses: state, ppid, pgrp, session.
            if int(stat.read_text().rsplit(")", 1)[1].split()[3]) != session:
                continue
            for line in (stat.parent / "status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]))
        except (OSError, ValueError, IndexError):
            continue
    return peak


def run_measured(cmd: list[str], cwd: Path, env: dict, timeout: float) -> dict:
    """Wall time, CPU time and peak RSS (over the process and the descendants it waited for), exit
    code, stdout, and the stage timings printed on stderr (by --timings)."""
    t0 = time.perf_counter()
    out_file, err_file = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    # Own process group: a timeout stops the CLI and its capture and verify children together.
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out_file, stderr=err_file, start_new_session=True)
    deadline = t0 + timeout
    killed_peak_kb = 0  # the run's processes' peak RSS, sampled: a killed run's children are never waited for
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            killed_peak_kb = session_peak_rss_kb(proc.pid)
            os.killpg(proc.pid, signal.SIGKILL)
            pid, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = -9
            break
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    out_file.seek(0)
    err_file.seek(0)
    stdout = out_file.read().decode()
    code = os.waitstatus_to_exitcode(status) if proc.returncode != -9 else None
    rss_kb = max(usage.ru_maxrss, killed_peak_kb)
    return {"seconds": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "rss_mb": rss_kb / 1024,
            "exit": code, "stdout": stdout, "stages": timings.read(err_file.read().decode(errors="replace"))}


def equivci_fingerprint(env: dict) -> str:
    """equivci's cache identity (its sources among it) as a fresh process computes it: when it changes
    between the cold and the warm run (an edit or checkout of equivci meanwhile), the warm run
    cannot find the cold run's result, and its figure is that of a cold run."""
    code = "from equivci.cache import fingerprint; print(fingerprint())"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout


def best_of(runs: list[dict]) -> dict:
    """The fastest of the runs, with the largest peak RSS seen."""
    best = min(runs, key=lambda r: r["seconds"])
    return {**best, "rss_mb": max(r["rss_mb"] for r in runs), "runs": len(runs)}


# Columns of the stage table: a stage of one model (capture/..., verify/...) or of the run.
STAGES = {
    "start-up": ("start-up (imports, arguments)",),
    "jax": ("capture/import jax",),
    "lower": ("capture/lower reference", "capture/lower distributed"),
    "key": ("capture/content key",),
    "compile": ("capture/reference HLO", "capture/SPMD partitioning", "capture/placements",
                "capture/full compile, placements"),
    "cap.rest": ("capture/start-up", "capture/load entrypoints", "capture/other (process start and exit, transfer)"),
    "parse": ("verify/parse HLO",),
    "build": ("verify/build programs",),
    "split": ("verify/split layers",),
    "layers": ("verify/prove layers",),
    "whole": ("verify/prove whole program", "verify/prove up to the first unproved layer",
              "verify/diagnosis up to the first unproved layer (from the memo)"),
    "localize": ("verify/localize", "verify/counterexample"),
    "ver.rest": ("verify/import the verifier", "verify/other (process start and exit, transfer)"),
}


def stage_columns(stages: dict[str, float]) -> dict[str, float]:
    out = {}
    for column, names in STAGES.items():
        total = 0.0
        for path, seconds in stages.items():
            # Per-model rows are "models/<model>/<stage>"; "prove layers (N new, M reused)" by prefix.
            stage = path.split("/", 2)[2] if path.startswith("models/") and path.count("/") >= 2 else path
            if any(stage == n or (n == "verify/prove layers" and stage.startswith(n)) for n in names):
                total += seconds
        out[column] = total
    return out


def summary(doc_text: str) -> str:
    try:
        doc = json.loads(doc_text)
        m = doc["models"][0]
    except (ValueError, KeyError, IndexError):
        return "no report"
    layers = m["layers"]
    first = next((f for f in m.get("findings") or () if f.get("severity") == "error"), None)
    where = f", first finding {Path(first['path'] or '-').name}:{first['line']}" if first else ""
    return f"{m['status']}, layers {layers['verified']}/{layers['total']} verified, {layers['reused']} reused" + (
        ", skipped (unchanged)" if m.get("reused") else "") + where


def bench_config(cfg: str, timeout: float, layers: int | None = None, repeat: int = 1, style: str = "llama_tp",
                 change: bool = True) -> dict:
    spec = STYLES[style]
    tmp = Path(tempfile.mkdtemp(prefix=f"equivci-bench-{style}-{cfg}-"))
    repo = tmp / "repo"
    (repo / "models").mkdir(parents=True)
    for file in MODEL_FILES:
        shutil.copy(HERE / file, repo / "models" / Path(file).name)
    mesh = ", ".join(f"{axis}: {size}" for axis, size in spec.mesh.items())
    (repo / "equivci.yaml").write_text(MANIFEST.format(style=style, cfg=cfg, module=spec.module, mesh=mesh))
    (repo / ".gitignore").write_text(".equivci/\n")
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "."], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "model"], cwd=repo, check=True)

    env = dict(os.environ, CI="true")
    env.pop("EQUIVCI_CACHE_DIR", None)
    if layers is not None:
        env["EQUIVCI_BENCH_LAYERS"] = str(layers)
    devices = math.prod(spec.mesh.values())
    bare_env = dict(env, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
    bare_cmd = [sys.executable, "-c", BARE.format(models=str(repo / "models"), cfg=cfg, module=spec.module,
                                                  names=tuple(spec.mesh), sizes=tuple(spec.mesh.values()))]
    verify = [*EQUIVCI, "verify", "--format", "json", "--timings"]
    identity = equivci_fingerprint(env)
    cold = run_measured(verify, repo, env, timeout)
    # Rounds of bare, warm and warm-cs: whatever else loads the machine weighs on all three alike.
    runs: dict[str, list[dict]] = {"bare": [], "warm": [], "warm-cs": []}
    for _ in range(repeat):
        runs["bare"].append(run_measured(bare_cmd, repo, bare_env, timeout))
        if cold["exit"] is not None:  # else no result to reuse: warm runs would be cold runs again
            runs["warm"].append(run_measured(verify, repo, env, timeout))
            runs["warm-cs"].append(run_measured([*verify, "--changed-since", "HEAD"], repo, env, timeout))
    lowering = [float(r["stdout"].strip().splitlines()[-1]) for r in runs["bare"] if r["exit"] == 0]
    rows = {"bare": {**best_of(runs["bare"]), "lowering_s": min(lowering, default=float("nan"))}, "cold": cold}
    if cold["exit"] is None:
        shutil.rmtree(tmp, ignore_errors=True)
        return rows
    rows["warm"], rows["warm-cs"] = best_of(runs["warm"]), best_of(runs["warm-cs"])
    rows["identity_changed"] = equivci_fingerprint(env) != identity
    if not change:
        shutil.rmtree(tmp, ignore_errors=True)
        return rows
    src = repo / "models" / "llama_tp.py"
    text = src.read_text()
    assert text.count(LM_HEAD_OLD) == 1, "the LM-head line to edit is not in bench/llama_tp.py"
    src.write_text(text.replace(LM_HEAD_OLD, LM_HEAD_NEW))
    rows["1-layer"] = run_measured([*verify, "--changed-since", "HEAD"], repo, env, timeout)
    shutil.rmtree(tmp, ignore_errors=True)
    return rows


def print_rows(title: str, rows: dict) -> None:
    lower, bare = rows["bare"]["lowering_s"], rows["bare"]["seconds"]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\n{title} (load average now {load}): bare JAX lowering of both programs {lower:.2f} s in-process; "
          f"{bare:.2f} s ({rows['bare']['cpu_s']:.2f} s CPU) for a process that only imports jax and lowers both "
          f"({rows['bare']['rss_mb']:.0f} MB)")
    if rows.get("identity_changed"):
        print("  equivci's sources changed between the cold and the warm runs: the warm runs could not reuse the "
              "cold run's results (their figures are cold figures)")
    print(f"  {'run':8} {'seconds':>8} {'x lower':>8} {'x bare':>7} {'CPU s':>7} {'peak RSS':>10}  result")
    for name in ("cold", "warm", "warm-cs", "1-layer"):
        r = rows.get(name)
        if r is None:
            why = "the cold run did not finish, nothing to reuse" if rows["cold"]["exit"] is None else "--no-change"
            print(f"  {name:8} {'-':>8} {'-':>8} {'-':>7} {'-':>7} {'-':>10}  not run: {why}")
            continue
        result = summary(r["stdout"]) if r["exit"] is not None else "TIMEOUT"
        if r.get("runs", 1) > 1:
            result += f" (best of {r['runs']})"
        # A killed run's children were never waited for: their CPU time is unknown.
        cpu = f"{r['cpu_s']:7.2f}" if r["exit"] is not None else f"{'-':>7}"
        print(f"  {name:8} {r['seconds']:8.2f} {r['seconds'] / lower:8.2f} {r['seconds'] / bare:7.2f} "
              f"{cpu} {r['rss_mb']:8.0f} MB  {result}")
    runs = [(name, stage_columns(rows[name]["stages"])) for name in ("cold", "warm", "warm-cs", "1-layer")
            if rows.get(name, {}).get("stages")]
    if runs:
        print("  where the time went (seconds, `equivci verify --timings`; cap.rest: the capture child's start-up,\n"
              "  loading the entrypoints, its exit and answer; compile: HLO of the reference, XLA up to the SPMD\n"
              "  partitioner, placements; ver.rest: the verifier child's fork, imports left to it, its answer):")
        print("  " + f"{'run':8}" + "".join(f"{c:>9}" for c in STAGES))
        for name, columns in runs:
            print("  " + f"{name:8}" + "".join(f"{columns[c]:9.2f}" for c in STAGES))
    sys.stdout.flush()


def _figure(rows: dict, name: str, lower: float) -> str:
    r = rows.get(name)
    if r is None:
        return "not run"
    if r["exit"] is None:
        return f"TIMEOUT (> {r['seconds']:.0f} s)"
    changed = " (equivci changed after the cold run)" if name != "cold" and rows.get("identity_changed") else ""
    return f"{r['seconds']:.1f} s ({r['seconds'] / lower:.1f}×; {r['cpu_s']:.1f} s CPU){changed}"


def summary_table(measured: list[tuple[str, str, dict]]) -> list[str]:
    """One markdown row per style and configuration: the figures of STYLES.md."""
    lines = ["| style | shape | verdict (cold) | bare lowering | cold | peak RSS | warm | one-layer change |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for style, cfg, rows in measured:
        lower = rows["bare"]["lowering_s"]
        cold = rows["cold"]
        verdict = summary(cold["stdout"]).split(",")[0] if cold["exit"] is not None else "timeout"
        lines.append(f"| {style} | {cfg} | {verdict} | {lower:.1f} s | {_figure(rows, 'cold', lower)} | "
                     f"{cold['rss_mb']:.0f} MB | {_figure(rows, 'warm', lower)} | {_figure(rows, '1-layer', lower)} |")
    return lines


def _names(text: str, known) -> list[str]:
    names = list(known) if text == "all" else [n for n in text.split(",") if n]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"run_bench.py: unknown {', '.join(unknown)}; choose from {', '.join(known)} (or all)")
    return names


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--styles", default="llama_tp", help=f"comma-separated, or all: {', '.join(STYLES)}")
    ap.add_argument("--configs", default="8b,70b,405b", help="comma-separated: 8b, 70b, 405b (tiny: a smoke test)")
    ap.add_argument("--layers", default="", help="comma-separated layer counts for an 8B-shaped sweep")
    ap.add_argument("--timeout", type=float, default=900.0,
                    help="seconds per equivci run; a slower run is killed and reported as TIMEOUT")
    ap.add_argument("--repeat", type=int, default=1, help="best of N for the bare, warm and warm-cs runs")
    ap.add_argument("--no-change", action="store_true", help="skip the one-line-change run (slow styles at 405B)")
    args = ap.parse_args()
    styles = _names(args.styles, STYLES)
    configs = _names(args.configs, ("tiny", "8b", "70b", "405b"))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"equivci benchmark: Llama-style decoders, TP=8; {os.cpu_count()} CPUs (load average {load}); "
          f"python {sys.version.split()[0]}")
    measured = []
    for style in styles:
        for cfg in configs:
            rows = bench_config(cfg, args.timeout, repeat=args.repeat, style=style, change=not args.no_change)
            print_rows(f"{style}, {cfg}-shaped", rows)
            measured.append((style, cfg, rows))
        for n in filter(None, args.layers.split(",")):
            print_rows(f"{style}, 8b-shaped, {n} layers",
                       bench_config("8b", args.timeout, layers=int(n), repeat=args.repeat, style=style,
                                    change=not args.no_change))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\nSummary (wall seconds; × the bare in-process lowering of both programs in the same run; CPU "
          f"seconds of the run's processes). Load average at the end: {load} on {os.cpu_count()} CPUs.")
    print("\n".join(summary_table(measured)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
