"""`verify --shard I/N` and `equivci merge`: the shards partition the models, and merging the
shard reports gives the unsharded report. Real zoo models (two correct norms and a buggy one: both
verdicts, and a shard of two models beside a shard of one), real capture and egglog, in a temporary
git repository, through the CLI."""

from __future__ import annotations

import concurrent.futures
import json
import os
import random
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from equivci import shard
from equivci.ci.publish import MARKER

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("rmsnorm-tp", "rmsnorm-tp-local-stats", "layernorm-tp")
SHARDS = 2


def _manifest() -> str:
    entries = {
        "rmsnorm-tp": ("common.py:rms_norm", "norms.py:rms_norm_tp", "norms.py:rms_inputs"),
        "rmsnorm-tp-local-stats": ("common.py:rms_norm", "norms.py:rms_norm_tp_local_stats", "norms.py:rms_inputs"),
        "layernorm-tp": ("common.py:layer_norm", "norms.py:layer_norm_tp", "norms.py:ln_inputs"),
    }
    rows = [f"  - name: {name}\n    reference: models/{ref}\n    distributed: models/{dist}\n"
            f"    inputs: models/{inputs}\n    mesh: {{tp: 4}}\n" for name, (ref, dist, inputs) in entries.items()]
    return "version: 1\nmodels:\n" + "".join(rows)


def cli(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "equivci", *args], cwd=repo, capture_output=True, text=True, check=False,
                          timeout=600)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """The unsharded report and the reports of the SHARDS shards, each run without a cache."""
    repo = tmp_path_factory.mktemp("shards") / "repo"
    (repo / "models").mkdir(parents=True)
    for name in ("common.py", "norms.py"):
        shutil.copy(ROOT / "examples" / "zoo" / name, repo / "models" / name)
    (repo / "equivci.yaml").write_text(_manifest())
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    for step in (["init", "-q"], ["add", "."], ["commit", "-qm", "models"]):
        subprocess.run([*git, *step], cwd=repo, check=True)
    jobs = [()] + [("--shard", f"{i}/{SHARDS}") for i in range(1, SHARDS + 1)]
    # As parallel jobs would (two at once, the suite's cores), the unsharded run among them.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        whole, *procs = pool.map(lambda extra: cli(repo, "verify", "--no-cache", "--format", "json", *extra), jobs)
    shards = []
    for i, proc in enumerate(procs, 1):
        path = repo / f"shard-{i}.json"
        path.write_text(proc.stdout)
        shards.append((proc, path))
    return {"repo": repo, "whole": whole, "shards": shards}


def test_assignment_is_a_stable_balanced_partition():
    names = [f"model-{i}" for i in range(23)]
    for count in range(1, 8):
        shards, by = shard.assign(names, count)
        assert by == shard.BY_NAME and sorted(shards) == sorted(names)
        assert set(shards.values()) <= set(range(1, count + 1))
        sizes = Counter(shards.values())
        assert max(sizes.values()) - min(sizes.values(), default=0) <= 1 and len(sizes) == min(count, len(names))
        shuffled = random.Random(count).sample(names, len(names))
        assert shard.assign(shuffled, count)[0] == shards  # manifest order does not matter


def test_cost_balancing_partitions_and_balances():
    costs = {f"m{i}": float(c) for i, c in enumerate([60, 50, 40, 30, 20, 10, 5, 5])}
    shards, by = shard.assign(list(costs), 3, costs)
    assert by == shard.BY_COST and sorted(shards) == sorted(costs)
    loads = Counter()
    for name, i in shards.items():
        loads[i] += costs[name]
    assert max(loads.values()) <= 80  # total 220 over 3: longest-first keeps every shard near 73
    # Missing costs: by name, so that shards which saw different caches still agree.
    assert shard.assign(list(costs), 3, {"m0": 1.0})[1] == shard.BY_NAME


def test_shard_reports_partition_the_selected_models(runs):
    plans = [json.loads(path.read_text())["shard"] for _, path in runs["shards"]]
    assert all(p["selected"] == list(NAMES) and p["count"] == SHARDS for p in plans)
    assigned = [name for p in plans for name in p["assigned"]]
    assert sorted(assigned) == sorted(NAMES)  # every model in exactly one shard
    assert sorted(len(p["assigned"]) for p in plans) == [1, 2]  # a shard's report lists several in order
    for (proc, path), plan in zip(runs["shards"], plans, strict=True):
        assert [m["name"] for m in json.loads(path.read_text())["models"]] == plan["assigned"], proc.stderr
    # Stable across runs: the same assignment as the pure function (and so as any other run).
    expected, _ = shard.assign(NAMES, SHARDS)
    assert {name: p["index"] for p in plans for name in p["assigned"]} == expected


def _comparable(doc: dict) -> list:
    return [(m["name"], m["status"], m["layers"], m["findings"]) for m in doc["models"]]


def test_merged_shard_reports_equal_the_unsharded_report(runs):
    repo, whole = runs["repo"], runs["whole"]
    paths = [str(path) for _, path in reversed(runs["shards"])]  # any order
    merged = cli(repo, "merge", "--format", "json", *paths)
    assert merged.returncode == whole.returncode == 1, merged.stderr + whole.stderr  # a buggy model
    want, got = json.loads(whole.stdout), json.loads(merged.stdout)
    assert [m["status"] for m in want["models"]] == ["verified", "mismatch", "verified"]
    assert any(m["findings"] for m in want["models"])
    assert _comparable(got) == _comparable(want)
    assert "shard" not in got


def test_merge_renders_the_pull_request_comment(runs):
    comment = cli(runs["repo"], "merge", "--format", "comment", *(str(p) for _, p in runs["shards"]))
    assert comment.stdout.startswith(MARKER)
    assert "3 models: 2 verified, 1 mismatch" in comment.stdout
    for name in NAMES:
        assert f"| {name} |" in comment.stdout


def _one_paragraph_error(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert err.startswith("equivci: error:") and "\n\n" not in err and "Traceback" not in err, err
    for word in words:
        assert word in err, err


@pytest.mark.parametrize("spec", ["3/2", "0/0", "0/2", "two/4", "1/"])
def test_bad_shard_argument(runs, spec):
    _one_paragraph_error(cli(runs["repo"], "verify", "--shard", spec), f"--shard {spec!r}", "1 <= I <= N")


def test_merge_refuses_bad_reports(runs, tmp_path):
    repo = runs["repo"]
    shard_paths = [str(p) for _, p in runs["shards"]]
    _one_paragraph_error(cli(repo, "merge", str(tmp_path / "absent.json")), "cannot read the report", "absent.json")
    (tmp_path / "junk.json").write_text("<html>")
    _one_paragraph_error(cli(repo, "merge", str(tmp_path / "junk.json")), "is not an equivci JSON report")
    (tmp_path / "failed.json").write_text(json.dumps({"equivci": "0.1.0", "models": [], "error": "bad manifest"}))
    _one_paragraph_error(cli(repo, "merge", *shard_paths[1:], str(tmp_path / "failed.json")),
                         "failed before verifying", "bad manifest")
    _one_paragraph_error(cli(repo, "merge", *shard_paths[:-1]), f"shard(s) {SHARDS} of {SHARDS} missing")
    _one_paragraph_error(cli(repo, "merge", *shard_paths, shard_paths[0]), "more than one report")


def test_documented_matrix_workflows_use_real_options():
    """docs/ci-matrix.md: shards -> merge; the matrix and --shard agree on N; every option that
    its `equivci` commands pass is one the command accepts."""
    doc = (ROOT / "docs" / "ci-matrix.md").read_text()
    workflows = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", doc, flags=re.DOTALL)]
    assert len(workflows) == 2
    helps: dict[str, str] = {}
    for wf in workflows:
        jobs = wf["jobs"]
        assert jobs["merge"]["needs"] == "shards" and jobs["merge"]["if"] == "always()"
        n = len(jobs["shards"]["strategy"]["matrix"]["shard"])
        runs = [s["run"] for job in jobs.values() for s in job["steps"] if "run" in s]
        commands = [line.strip() for run in runs for line in run.splitlines() if line.strip().startswith("equivci ")]
        assert any(f"--shard ${{{{ matrix.shard }}}}/{n} " in c for c in commands), commands
        assert any(c.startswith("equivci merge shards/*/shard.json") for c in commands), commands
        for command in commands:
            name = command.split()[1]
            if name not in helps:
                helps[name] = subprocess.run([sys.executable, "-m", "equivci", name, "--help"], check=False, capture_output=True,
                                             text=True, timeout=120, env={**os.environ, "COLUMNS": "300"}).stdout
            for option in re.findall(r"(?<!\S)(--[a-z-]+)", command):
                assert option in helps[name], f"{command}: {option} is not an option of `equivci {name}`"


def test_merge_publishes_one_comment_for_the_shards_of_a_pull_request(tmp_path):
    """Two shard jobs of a pull request that drops a psum, then `merge --publish`: one sticky
    comment with both models, the line comment on the changed line, the job summary."""
    from fake_github import (
        FakeGitHub,
        actions_env,
        make_pr_repo,
        pull_files_from_git,
        write_pr_event,
    )

    pr = make_pr_repo(tmp_path)
    with FakeGitHub() as fake:
        fake.set_pull_files(5, pull_files_from_git(pr.path, pr.base, pr.head))
        env = actions_env(tmp_path, fake, write_pr_event(tmp_path / "event.json", fake.repo, 5, pr.base, pr.head))
        full = {**{k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "RUNNER_"))}, **env}

        def shard_job(i: int) -> Path:
            proc = subprocess.run([sys.executable, "-m", "equivci", "verify", "--shard", f"{i}/2", "--changed-since",
                                   pr.base, "--format", "json"], cwd=pr.path, env=full, capture_output=True, text=True,
                                  check=False, timeout=600)
            path = tmp_path / f"shard-{i}.json"
            path.write_text(proc.stdout)
            return path

        with concurrent.futures.ThreadPoolExecutor(2) as pool:  # as the matrix's jobs run: at once
            paths = list(pool.map(shard_job, (1, 2)))
        merged = subprocess.run([sys.executable, "-m", "equivci", "merge", *map(str, paths), "--publish"], cwd=pr.path,
                                env=full, capture_output=True, text=True, check=False, timeout=600)
        assert merged.returncode == 1, merged.stdout + merged.stderr
        (comment,) = fake.issue_comments[5]
        assert comment["body"].startswith(MARKER)
        assert "| mlp-tp | ✅ verified |" in comment["body"] and "| mlp-tp-edited | ❌ mismatch |" in comment["body"]
        assert {(c["path"], c["line"]) for c in fake.review_comments[5]} == {(pr.edited, pr.bug_line)}
        assert "| mlp-tp-edited | ❌ mismatch |" in Path(env["GITHUB_STEP_SUMMARY"]).read_text()
