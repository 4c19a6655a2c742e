"""Incremental runs on a real temporary git repository with real JAX models (copied from
examples/models, tp=2): the memo, --changed-since, --all, --no-cache, corrupt cache files."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from equivci import cache, memo
from equivci.cli import run
from equivci.manifest import load_manifest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "models"
LM_HEAD_LINE = 58  # models/mlp_tp.py: the all_gather that re-assembles the vocab-parallel logits
MANIFEST = """\
version: 1
models:
  - name: mlp-tp
    reference: models/mlp.py:mlp
    distributed: models/mlp_tp.py:mlp
    inputs: models/mlp.py:mlp_inputs
    mesh: {tp: 2}
  - name: lm-head
    reference: models/mlp.py:projection
    distributed: models/mlp_tp.py:projection
    inputs: models/mlp.py:projection_inputs
    mesh: {tp: 2}
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        cwd=repo, check=True, capture_output=True, text=True,
    ).stdout


def verify(repo: Path, capsys, *args: str) -> tuple[int, dict]:
    capsys.readouterr()
    code = run(["verify", "--manifest", str(repo / "equivci.yaml"), "--format", "json", *args])
    return code, {m["name"]: m for m in json.loads(capsys.readouterr().out)["models"]}


def result_files(repo: Path) -> dict[Path, str]:
    return {p: p.read_text() for p in (repo / ".equivci" / "cache").rglob("*.json")}


@pytest.fixture(scope="module")
def warm_template(tmp_path_factory) -> Path:
    """A committed repository whose cache holds a first (cold) run of both models."""
    repo = tmp_path_factory.mktemp("incremental") / "repo"
    (repo / "models").mkdir(parents=True)
    for name in ("mlp.py", "mlp_tp.py"):
        shutil.copy(EXAMPLES / name, repo / "models" / name)
    assert "all_gather" in (repo / "models" / "mlp_tp.py").read_text().splitlines()[LM_HEAD_LINE - 1]
    (repo / "equivci.yaml").write_text(MANIFEST)
    (repo / ".gitignore").write_text(".equivci/\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "models")
    code = run(["verify", "--manifest", str(repo / "equivci.yaml")])
    assert code == 0
    return repo


def test_cold_run_fills_the_cache(repo: Path) -> None:
    cache = repo / ".equivci" / "cache"
    assert (cache / "CACHEDIR.TAG").is_file()
    manifest = load_manifest(repo / "equivci.yaml")
    sources = memo.recorded_sources(manifest, manifest.models[0])
    assert sources == {str(repo / "models" / "mlp.py"), str(repo / "models" / "mlp_tp.py")}


def test_second_run_reuses_every_layer(repo: Path, capsys) -> None:
    before = result_files(repo)
    code, models = verify(repo, capsys)
    assert code == 0
    for m in models.values():
        assert m["status"] == "verified"
        assert m["layers"]["total"] >= 1 and m["layers"]["reused"] == m["layers"]["total"]
    assert {p for p in result_files(repo) if "/results/" in str(p)} == {p for p in before if "/results/" in str(p)}


def test_comment_only_edit_reverifies_nothing(repo: Path, capsys) -> None:
    tp = repo / "models" / "mlp_tp.py"
    lines = tp.read_text().splitlines(keepends=True)
    lines.insert(0, "# Tensor-parallel blocks.\n# (a comment that moves every line down)\n")
    lines.insert(20, "        # the partial sums are added by the psum below\n")
    tp.write_text("".join(lines))
    code, models = verify(repo, capsys, "--changed-since", "HEAD")
    assert code == 0
    for m in models.values():  # both models live in the edited file: captured again, proof reused
        assert m["status"] == "verified" and m["reused"] is False
        assert m["layers"]["reused"] == m["layers"]["total"]


def program_entries(repo: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text())["payload"] for p in (repo / ".equivci" / "cache").glob("v1/programs/*/*.json")}


def record_keys(repo: Path) -> dict[str, str]:
    manifest = load_manifest(repo / "equivci.yaml")
    store = cache.Memo(repo / ".equivci" / "cache")
    return {m.name: store.last_capture("equivci.yaml", m.name)["key"] for m in manifest.models}


def test_program_keys_are_those_of_the_texts_and_change_with_any_byte(repo: Path, capsys) -> None:
    """A rerun takes the content key from the "programs" entry of its bytecode; the entry holds
    what the printed texts give (recomputed here after deleting the entries), and a program that
    differs in a single location (a line number) is a new entry, found through its text."""
    keys = record_keys(repo)
    verify(repo, capsys)  # the copy's path is in its locations: entries of its own
    assert record_keys(repo) == keys
    stored = {k: e for k, e in program_entries(repo).items() if any(str(repo) in f for f in e["files"])}
    assert sorted(e["content_key"] for e in stored.values()) == sorted(keys.values())
    shutil.rmtree(repo / ".equivci" / "cache" / "v1" / "programs")
    code, models = verify(repo, capsys)
    assert code == 0 and all(m["layers"]["reused"] == m["layers"]["total"] for m in models.values())
    assert program_entries(repo) == stored and record_keys(repo) == keys

    tp = repo / "models" / "mlp_tp.py"
    tp.write_text("# a comment that moves every line down\n" + tp.read_text())
    code, models = verify(repo, capsys)
    assert code == 0 and all(m["layers"]["reused"] == m["layers"]["total"] for m in models.values())
    moved = program_entries(repo)
    assert len(moved) == 2 * len(stored) and record_keys(repo) == keys  # new entries, the same content keys
    assert moved.items() >= stored.items()
    assert {e["loc_digest"] for e in moved.values()} > {e["loc_digest"] for e in stored.values()}


def test_untouched_models_are_not_captured_at_all(repo: Path, capsys) -> None:
    (repo / "models" / "unrelated.py").write_text("x = 1\n")
    code, models = verify(repo, capsys, "--changed-since", "HEAD")
    assert code == 0
    assert all(m["reused"] is True and m["layers"]["reused"] == m["layers"]["total"] for m in models.values())


def test_lm_head_bug_reverifies_only_the_lm_head(repo: Path, capsys) -> None:
    tp = repo / "models" / "mlp_tp.py"
    lines = tp.read_text().splitlines(keepends=True)
    good = "return lax.all_gather(y, TP, axis=2, tiled=True)"
    assert good in lines[LM_HEAD_LINE - 1]
    lines[LM_HEAD_LINE - 1] = lines[LM_HEAD_LINE - 1].replace(
        good, "return lax.all_gather(y, TP, axis=1, tiled=True).reshape(y.shape[0], y.shape[1], -1)"
    )
    tp.write_text("".join(lines))

    code, models = verify(repo, capsys, "--changed-since", "HEAD")
    assert code == 1
    mlp, head = models["mlp-tp"], models["lm-head"]
    assert mlp["status"] == "verified" and mlp["layers"]["reused"] == mlp["layers"]["total"]
    assert head["status"] in ("mismatch", "unproven") and head["layers"]["reused"] == 0
    at_line = [f for f in head["findings"] if (f["path"], f["line"]) == ("models/mlp_tp.py", LM_HEAD_LINE)]
    assert at_line and all(f["changed"] for f in at_line)

    # Committed: nothing changed since HEAD, so both come from the memo, the finding with them.
    git(repo, "commit", "-qam", "gather on tokens")
    code, models = verify(repo, capsys, "--changed-since", "HEAD")
    assert code == 1
    assert models["lm-head"]["reused"] is True and models["lm-head"]["status"] == head["status"]
    assert [(f["path"], f["line"], f["changed"]) for f in models["lm-head"]["findings"]][0] == (
        "models/mlp_tp.py", LM_HEAD_LINE, False)
    # Since the commit before it, the line is changed again.
    code, models = verify(repo, capsys, "--changed-since", "HEAD~1")
    assert models["lm-head"]["findings"][0]["changed"] is True


def test_corrupt_cache_files_are_ignored(repo: Path, capsys) -> None:
    # The copied cache's "programs" entries name the template's path; this copy's own replace them.
    shutil.rmtree(repo / ".equivci" / "cache" / "v1" / "programs")
    verify(repo, capsys)
    for path in result_files(repo):
        path.write_bytes(b"{not json")
    code, models = verify(repo, capsys, "--changed-since", "HEAD")
    assert code == 0
    for m in models.values():
        assert m["status"] == "verified" and m["reused"] is False and m["layers"]["reused"] == 0
    for text in result_files(repo).values():  # rebuilt
        assert json.loads(text)["format"] == cache.FORMAT


def test_nightly_all_no_cache(repo: Path, tmp_path: Path, capsys) -> None:
    fresh = tmp_path / "nightly-cache"
    code, models = verify(repo, capsys, "--all", "--no-cache", "--changed-since", "HEAD", "--cache-dir", str(fresh))
    assert code == 0
    for m in models.values():
        assert m["status"] == "verified" and m["reused"] is False and m["layers"]["reused"] == 0
    assert not fresh.exists()
    # --all alone still verifies every model (through the cache).
    code, models = verify(repo, capsys, "--all", "--changed-since", "HEAD")
    assert all(m["reused"] is False and m["layers"]["reused"] == m["layers"]["total"] for m in models.values())
