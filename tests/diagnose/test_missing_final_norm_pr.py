"""The headline case of issue 14: a pull request drops the final RMSNorm before the LM head of a
16-layer model. The real `equivci ci` (real git repository, real capture and proof, the GitHub
stand-in) must put its review comment on the changed line and say what the reference does there."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from fake_github import FakeGitHub, actions_env, pull_files_from_git, write_pr_event

PR = 14

ROOT = Path(__file__).resolve().parents[2]
# The reference of the localization cases (examples/localize/stack.py), at 16 layers.
EXAMPLE = (ROOT / "examples/localize/stack.py").read_text()
REFERENCE = EXAMPLE[: EXAMPLE.index("\n\ndef _specs")].replace("L, T, D, F, V = 4,", "L, T, D, F, V = 16,") + "\n"
FINAL_NORM = '    return rms_norm(x, params["final_norm"]) @ params["lm_head"]'

NORMED = '        logits = rms_norm(x, params["final_norm"]) @ params["lm_head"]'
UNNORMED = '        logits = x @ params["lm_head"]'
DISTRIBUTED = textwrap.dedent('''
    import jax
    from jax import lax
    from jax.sharding import PartitionSpec as P

    from model import L, rms_norm


    def block(x, p):
        h = rms_norm(x, p["norm"])
        return x + lax.psum(jax.nn.silu(h @ p["w1"]) @ p["w2"], "tp")


    def forward(x, params, *, mesh):
        layer = {"norm": P(), "w1": P(None, "tp"), "w2": P("tp", None)}
        specs = {"layers": [layer] * L, "final_norm": P(), "lm_head": P(None, "tp")}

        def body(x, params):
            for i, p in enumerate(params["layers"]):
                with jax.named_scope(f"layers_{i}"):
                    x = block(x, p)
    %s
            return logits

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), specs), out_specs=P(None, "tp"))(x, params)
''').lstrip()

MANIFEST = ("version: 1\nmodels:\n  - {name: lm, reference: model.py:forward, distributed: model_tp.py:forward, "
            "inputs: model.py:inputs, mesh: {tp: 4}}\n")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def test_review_comment_lands_on_the_line_that_dropped_the_norm(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    assert "L, T, D, F, V = 16," in REFERENCE
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "dev@example.invalid")
    git(repo, "config", "user.name", "dev")
    git(repo, "config", "commit.gpgsign", "false")
    (repo / "equivci.yaml").write_text(MANIFEST)
    (repo / "model.py").write_text(REFERENCE)
    (repo / "model_tp.py").write_text(DISTRIBUTED % NORMED)
    (repo / ".gitignore").write_text(".equivci/\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "base: a 16-layer model and its tensor-parallel version")
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "feature")
    (repo / "model_tp.py").write_text(DISTRIBUTED % UNNORMED)
    git(repo, "commit", "-q", "-am", "head: logits straight from the last layer")
    head = git(repo, "rev-parse", "HEAD")
    changed = (DISTRIBUTED % UNNORMED).splitlines().index(UNNORMED) + 1
    norm_line = REFERENCE.splitlines().index(FINAL_NORM) + 1

    with FakeGitHub() as fake:
        fake.set_pull_files(PR, pull_files_from_git(repo, base, head))
        event = write_pr_event(tmp_path / "event.json", fake.repo, PR, base, head)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "RUNNER_"))}
        env.update(actions_env(tmp_path, fake, event))
        proc = subprocess.run([sys.executable, "-m", "equivci", "ci", "--manifest", "equivci.yaml"], cwd=repo, env=env,
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        comments = fake.review_comments[PR]
        assert {(c["path"], c["line"]) for c in comments} == {("model_tp.py", changed)}, proc.stdout
        body = comments[0]["body"]
        # in the reference's terms: what it applies, and where
        assert "rms_norm" in body and f"model.py:{norm_line}" in body, body
        assert "layers_15" not in body  # the LM head is in no layer
