"""The full mutation tool (mutmut, pinned in the test extra) over the verdict-deciding modules, with a
time budget; prints killed / survived / timed out / not checked.

mutmut writes its `mutants/` folder into the project, so it runs in a temporary copy of the
repository (the working tree is never touched). Its tests are the ones that run the engine in the
pytest process (mutmut maps each mutated function to the tests that call it in-process; the
near-miss models go through child processes, which it cannot see): the rule checks, the property
test and the numeric checks of the evaluator's facts.

    python bench/mutation_tool.py --budget 1800                       # every verdict-deciding module
    python bench/mutation_tool.py --budget 600 --only equivci/verify/masks.py
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VERDICT_MODULES = ["equivci/verify/masks.py", "equivci/verify/routing.py", "equivci/verify/instantiate.py",
                   "equivci/verify/language.py", "equivci/verify/prove.py", "equivci/verify/layered.py"]
TESTS = ["tests/test_rules_numeric.py", "tests/soundness/test_rule_properties.py",
         "tests/soundness/test_facts_numeric.py", "tests/test_vocab_parallel.py", "tests/test_routing.py"]
COPY = ["equivci", "tests", "examples", "configs", "pyproject.toml"]
STATES = ("killed", "survived", "timeout", "no tests", "suspicious", "skipped", "not checked", "segfault")


def configure(root: Path, modules: list[str], tests: list[str]) -> None:
    text = (root / "pyproject.toml").read_text()
    text += "\n[tool.mutmut]\n" + f"source_paths = [\"equivci/\"]\nonly_mutate = {modules!r}\n".replace("'", '"') \
        + f"pytest_add_cli_args_test_selection = {tests!r}\n".replace("'", '"') \
        + 'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q"]\n' + 'also_copy = ["examples", "configs"]\n'
    (root / "pyproject.toml").write_text(text)


def counts(root: Path, env: dict) -> dict[str, int]:
    """Mutants per state, from `mutmut results --all true` (one `name: state` line per mutant)."""
    out = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=root, env=env, check=False,
                         capture_output=True, text=True).stdout
    found = {s: 0 for s in STATES}
    for line in out.splitlines():
        m = re.match(r"\s*\S+:\s*(.+?)\s*$", line)
        if m and m.group(1) in found:
            found[m.group(1)] += 1
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=1800, help="seconds for `mutmut run` (then it is stopped)")
    parser.add_argument("--only", default=",".join(VERDICT_MODULES), help="comma-separated modules to mutate")
    parser.add_argument("--children", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="run in this folder and keep it (default: a temporary one)")
    args = parser.parse_args(argv)
    root = args.keep or Path(tempfile.mkdtemp(prefix="mutmut-"))
    for name in COPY:
        src = REPO / name
        (shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
         if src.is_dir() else shutil.copy(src, root / name))
    configure(root, args.only.split(","), TESTS)
    env = {**os.environ, "PYTHONPATH": str(root)}
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(args.children)]
    print(f"$ {' '.join(cmd)}   (in {root}, budget {args.budget:.0f} s)", flush=True)
    try:
        proc = subprocess.run(cmd, cwd=root, env=env, timeout=args.budget, capture_output=True, text=True, check=False)
        ended = f"finished (exit {proc.returncode})"
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
    except subprocess.TimeoutExpired as exc:
        ended = f"stopped at the budget of {args.budget:.0f} s"
        tail = [ln for ln in ((exc.stdout or b"") + (exc.stderr or b"")).decode(errors="replace").splitlines()][-3:]
    found = counts(root, env)
    total = sum(found.values())
    print(f"mutmut {ended}; mutants generated: {total}")
    print("  " + ", ".join(f"{state} {n}" for state, n in found.items() if n or state in STATES[:4]))
    checked = found["killed"] + found["survived"] + found["timeout"]
    if checked:
        print(f"  killed {100 * found['killed'] / checked:.1f} % of the {checked} mutants it ran")
    for line in tail:
        print(f"  | {line[:200]}")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
