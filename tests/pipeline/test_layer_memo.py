"""Layer proofs in the cache, on a real temporary git repository holding the bundled layer stack
(examples/models/stack.py: layers_0..3 and lm_head): an edit of the LM head re-proves only the
LM head, a bug there is reported at the edited line, corrupt layer entries are ignored."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_incremental import git

from equivci import cache
from equivci.cli import run

STACK = Path(__file__).resolve().parents[2] / "examples" / "models" / "stack.py"
MANIFEST = """\
version: 1
models:
  - {name: stack-tp, reference: stack.py:reference, distributed: stack.py:tensor_parallel,
     inputs: stack.py:inputs, mesh: {tp: 4}}
"""
HEAD_CALL = '        return _head(h, params["head"])\n'


def verify(repo: Path, capsys, *args: str) -> tuple[int, dict]:
    capsys.readouterr()
    code = run(["verify", "--manifest", str(repo / "equivci.yaml"), "--format", "json", *args])
    (model,) = json.loads(capsys.readouterr().out)["models"]
    return code, model


def layer_files(repo: Path) -> list[Path]:
    return sorted((repo / ".equivci" / "cache").rglob("layers/*/*.json"))


@pytest.fixture(scope="module")
def warm_template(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("layer-memo") / "repo"
    repo.mkdir()
    shutil.copy(STACK, repo / "stack.py")
    (repo / "equivci.yaml").write_text(MANIFEST)
    (repo / ".gitignore").write_text(".equivci/\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "stack")
    assert run(["verify", "--manifest", str(repo / "equivci.yaml")]) == 0
    return repo


def edit_tensor_parallel_head(repo: Path, new: str) -> int:
    """Replace the head call of `tensor_parallel` (the first of the file); its line number."""
    lines = (repo / "stack.py").read_text().splitlines(keepends=True)
    number = lines.index(HEAD_CALL)
    lines[number] = new
    (repo / "stack.py").write_text("".join(lines))
    return number + 1


def test_cold_run_stores_one_proof_per_distinct_layer(repo: Path) -> None:
    # layers_0..3 are one proof (the model input and a value entering from the layer before are
    # both inputs of the layer), lm_head the other
    assert len(layer_files(repo)) == 2


def test_lm_head_edit_reproves_only_the_lm_head(repo: Path, capsys) -> None:
    source = (repo / "stack.py").read_text()
    head = "        return jnp.tanh(h) @ w_head\n"
    assert source.count(head) == 1
    # reference and distributed share _head: a new head, still the same on both sides
    (repo / "stack.py").write_text(source.replace(head, "        return jnp.sin(h) @ w_head\n"))
    code, model = verify(repo, capsys)
    assert code == 0 and model["status"] == "verified"
    assert model["layers"] == {"total": 5, "verified": 5, "reused": 4}


def test_lm_head_bug_is_reported_at_the_edited_line(repo: Path, capsys) -> None:
    line = edit_tensor_parallel_head(repo, '        return 2 * _head(h, params["head"])\n')
    code, model = verify(repo, capsys, "--changed-since", "HEAD")
    assert code == 1 and model["status"] == "mismatch"
    assert model["layers"]["reused"] == 4 and model["layers"]["verified"] == 4
    at_line = [f for f in model["findings"] if (f["path"], f["line"]) == ("stack.py", line)]
    # The `2 *` stands outside every named scope (the head's scope is inside `_head`): such an op is
    # labelled with no layer rather than the segment the proof counted it in (issue 14).
    assert at_line and all(f["changed"] and f["layer"] is None for f in at_line)


def test_corrupt_layer_entries_are_ignored(repo: Path, capsys) -> None:
    for path in (repo / ".equivci" / "cache").rglob("*.json"):
        if "layers" in path.parts:  # well-formed entries whose payload does not fit the layer
            path.write_text(json.dumps({"format": cache.FORMAT, "key": path.stem, "payload": {"proved": "yes"}}))
        else:
            path.write_text("{not json")
    code, model = verify(repo, capsys)
    assert code == 0 and model["status"] == "verified"
    assert model["layers"] == {"total": 5, "verified": 5, "reused": 3}  # only the in-run reuse
    for path in layer_files(repo):  # rebuilt
        assert json.loads(path.read_text())["payload"]["proved"] in ([], [True] * 4)
