"""CLI behaviour: selection, exit codes, stdout discipline, error rendering (capture and verify faked)."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import pytest

import equivci.capture.run
from equivci.capture.types import CapturedModel, LeafPlacement
from equivci.cli import run
from equivci.errors import EquivciError
from equivci.results import Finding, ModelResult, Status

MANIFEST = """\
version: 1
models:
  - name: good
    reference: m.py:forward
    distributed: m.py:forward
    inputs: m.py:inputs
    mesh: {tp: 2}
    tags: [fast]
  - name: bad
    reference: m.py:forward
    distributed: m.py:forward
    inputs: m.py:inputs
    mesh: {dp: 2, tp: 2}
    tags: [nightly]
  - name: broken
    reference: m.py:forward
    distributed: m.py:forward
    inputs: m.py:inputs
    mesh: {tp: 2}
    tags: [nightly]
"""

HLO = """\
HloModule m, entry_computation_layout={(f32[2]{0})->f32[2]{0}}

ENTRY %main (x: f32[2]) -> f32[2] {
  ROOT %x = f32[2]{0} parameter(0), metadata={op_name="x" source_file="SRC" source_line=3}
}
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / "m.py").write_text("def forward(x):\n    return x\n")
    (tmp_path / "equivci.yaml").write_text(MANIFEST)
    monkeypatch.chdir(tmp_path)

    def capture_model(model, manifest, debug=False, memo=None, on_compile=None):
        if model.name == "broken":
            raise EquivciError("importing m.py failed at m.py:1: ValueError: nope")
        leaf = LeafPlacement("[0]", (2,), "float32", (((0, 2),),) * model.num_devices)
        hlo = HLO.replace("SRC", str(tmp_path / "m.py"))
        return CapturedModel(model.name, model.mesh, hlo, hlo, (leaf,), (leaf,), str(tmp_path),
                             content_key=f"stub-{model.name}")

    def verify_model(model, manifest, captured, memo=None, on_layer=None, iterations=120, budgets=None):
        status = Status.VERIFIED if model.name == "good" else Status.MISMATCH
        findings = () if status is Status.VERIFIED else (Finding("m.py", 2, "error", None, "dropped term"),)
        print("stray print from the verifier")  # must not reach stdout
        return ModelResult(model.name, status, 0.0, findings=findings)

    monkeypatch.setattr(equivci.capture.run, "capture_model", capture_model)
    monkeypatch.setitem(sys.modules, "equivci.verify.engine", types.SimpleNamespace(verify_model=verify_model))
    return tmp_path


def test_unknown_model_exits_2_listing_known_names(project: Path, capsys) -> None:
    assert run(["verify", "--model", "gpt"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("equivci: error: equivci.yaml: no model named 'gpt'; the manifest defines good, bad, broken.")
    assert "Traceback" not in err


def test_unknown_tag_exits_2(project: Path, capsys) -> None:
    assert run(["verify", "--tag", "weekly"]) == 2
    assert "no model is tagged 'weekly'; the manifest uses fast, nightly" in capsys.readouterr().err


def test_verified_model_exits_0(project: Path, capfd) -> None:
    assert run(["verify", "--model", "good"]) == 0
    out, err = capfd.readouterr()
    assert out.splitlines()[0].startswith("good  verified")
    assert "equivci: [1/1] good: verified" in err and "stray print" in err


def test_mismatch_exits_1_and_tags_select(project: Path, capsys) -> None:
    assert run(["verify", "--tag", "fast", "--model", "bad"]) == 1
    out, _ = capsys.readouterr()
    assert "  m.py:2: dropped term" in out.splitlines()
    assert out.splitlines()[-1].startswith("equivci: 2 models: 1 verified, 1 mismatch")


def test_json_run_prints_one_document_and_capture_error_is_per_model(project: Path, capfd) -> None:
    assert run(["verify", "--format", "json"]) == 2
    out, err = capfd.readouterr()
    doc = json.loads(out)
    assert [(m["name"], m["status"]) for m in doc["models"]] == [("good", "verified"), ("bad", "mismatch"), ("broken", "error")]
    broken = doc["models"][2]["findings"][0]
    assert broken["path"] == "equivci.yaml" and broken["line"] is None and broken["severity"] == "error"
    assert broken["message"] == "importing m.py failed at m.py:1: ValueError: nope"
    assert "stray print" in err and "Traceback" not in err


def test_json_manifest_error_still_prints_a_document(project: Path, capsys) -> None:
    Path("equivci.yaml").write_text("version: 2\nmodels: []\n")
    assert run(["verify", "--format", "json"]) == 2
    out, err = capsys.readouterr()
    assert "version: unsupported manifest version 2" in json.loads(out)["error"]
    assert err.startswith("equivci: error: equivci.yaml:1: version:")


def test_debug_shows_traceback(project: Path, capsys) -> None:
    assert run(["verify", "--model", "nope", "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "equivci: error: " in err


def test_internal_error_is_reported_per_model(project: Path, capsys, monkeypatch) -> None:
    def crash(model, manifest, captured, memo=None, on_layer=None, iterations=120, budgets=None):
        raise RuntimeError("kaboom")

    monkeypatch.setitem(sys.modules, "equivci.verify.engine", types.SimpleNamespace(verify_model=crash))
    assert run(["verify", "--model", "good"]) == 2
    out, _ = capsys.readouterr()
    assert "internal error while checking model 'good': RuntimeError: kaboom" in out
    with pytest.raises(RuntimeError):  # --debug lets it through with its traceback
        run(["verify", "--model", "good", "--debug"])


def test_bad_format_is_a_usage_error(project: Path, capsys) -> None:
    assert run(["verify", "--format", "xml"]) == 2
    assert "Invalid value for '--format'" in capsys.readouterr().err


def test_missing_default_manifest(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert run(["verify"]) == 2
    assert capsys.readouterr().err.startswith("equivci: error: equivci.yaml: manifest not found")


def test_version_and_help(capsys) -> None:
    assert run(["--version"]) == 0
    assert capsys.readouterr().out.strip() == "equivci 0.1.0"
    assert run(["--help"]) == 0
    help_text = capsys.readouterr().out
    assert "verify" in help_text and "dump" in help_text


def test_dump_writes_hlo_and_source_map(project: Path, capsys) -> None:
    assert run(["dump", "--model", "good", "--out", "out"]) == 0
    assert Path("out/reference.hlo.txt").read_text().startswith("HloModule m")
    assert Path("out/distributed.hlo.txt").exists()
    source_map = json.loads(Path("out/sourcemap.json").read_text())
    assert source_map["mesh"] == {"tp": 2}
    assert source_map["inputs"][0]["path"] == "[0]"
    assert source_map["reference"] == {"x": {"path": "m.py", "line": 3}}
    assert source_map["distributed"] == {"x": {"path": "m.py", "line": 3}}


def test_dump_unknown_model(project: Path, capsys) -> None:
    assert run(["dump", "--model", "gpt", "--out", "out"]) == 2
    assert "no model named 'gpt'" in capsys.readouterr().err
    assert not Path("out").exists()


def test_verify_writes_sarif_and_markdown_documents(tmp_path):
    """--format sarif|markdown go through the same run as text/json (real capture and proof)."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    base = [sys.executable, "-m", "equivci", "verify", "--manifest", "configs/buggy.yaml", "--model",
            "mlp-tp-missing-psum"]
    env = {**os.environ, "EQUIVCI_CACHE_DIR": str(tmp_path / "cache")}  # a fresh cache, never the repository's
    sarif = subprocess.run(base + ["--format", "sarif"], cwd=root, capture_output=True, text=True, timeout=300, env=env)
    assert sarif.returncode == 1
    doc = json.loads(sarif.stdout)
    results = doc["runs"][0]["results"]
    locations = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in results}
    assert "examples/models/mlp_tp_buggy.py" in locations
    md = subprocess.run(base + ["--format", "markdown"], cwd=root, capture_output=True, text=True, timeout=300, env=env)
    assert md.returncode == 1
    assert "mlp-tp-missing-psum" in md.stdout and "mlp_tp_buggy.py" in md.stdout


def test_a_command_imports_only_its_own_modules_and_help_lists_all() -> None:
    """`equivci verify` starts without the GitHub client and GitPython (a `git` process at import),
    and without the verifier's modules (numpy, the translation) or the HLO-file reader, which only a
    model to verify needs (a run answered from the memo needs none of them); help after it still
    lists every command, in their order."""
    import subprocess

    probe = (
        "import sys\n"
        "from equivci.cli import run\n"
        "run(['verify', '--help'])\n"
        "from equivci.git import repo_root; repo_root(__import__('pathlib').Path('.'))\n"
        "heavy = ('git', 'equivci.ci.github', 'equivci.commands.ci', 'numpy', 'equivci.diagnose.numeric',\n"
        "         'equivci.translate.evaluator', 'equivci.capture.hlo_files')\n"
        "print('LOADED', sorted(m for m in heavy if m in sys.modules), 'pipeline' in str(sys.modules))\n"
        "run(['--help'])\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "LOADED [] True" in proc.stdout  # the verify command's pipeline was imported, without them
    root_help = proc.stdout[proc.stdout.index("LOADED"):]
    positions = [root_help.index(f" {name} ") for name in ("verify", "dump", "ci", "precommit")]
    assert positions == sorted(positions)


def test_repo_root_is_the_nearest_folder_with_a_git_entry(tmp_path: Path) -> None:
    import subprocess

    from equivci.git import repo_root as repo_root_of

    main = tmp_path / "main"
    (main / "models" / "deep").mkdir(parents=True)
    assert repo_root_of(main / "models") == (main / "models").resolve()  # outside git: the folder itself
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q"], cwd=main, check=True)
    (main / "models" / "deep" / "m.py").write_text("")
    subprocess.run([*git, "add", "."], cwd=main, check=True)
    subprocess.run([*git, "commit", "-qm", "m"], cwd=main, check=True)
    assert repo_root_of(main / "models" / "deep") == main.resolve()
    # A linked work tree has a `.git` file, and is its own root.
    subprocess.run([*git, "worktree", "add", "-q", str(tmp_path / "wt")], cwd=main, check=True)
    assert (tmp_path / "wt" / ".git").is_file()
    assert repo_root_of(tmp_path / "wt" / "models") == (tmp_path / "wt").resolve()
    # Through a symbolic link, the real folder.
    (tmp_path / "link").symlink_to(main / "models")
    assert repo_root_of(tmp_path / "link") == main.resolve()
