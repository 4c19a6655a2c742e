"""Issue 15, item 1 (false green): a config file read while tracing decides reuse like a source file."""

from __future__ import annotations

import json
from pathlib import Path

from repos import MLP_TP, equivci, git, make_repo

# The distributed MLP reads its config at trace time: `reduce: false` drops the psum.
CONFIGURED_TP = MLP_TP.replace("import jax\n", "import json\nfrom pathlib import Path\n\nimport jax\n", 1).replace(
    '        return jax.lax.psum(h @ w2, "tp")',
    '        config = json.loads((Path(__file__).parent / "config.json").read_text())\n'
    '        return jax.lax.psum(h @ w2, "tp") if config["reduce"] else h @ w2',
)


def test_config_change_is_not_verified_from_the_memo(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"models/mlp_tp.py": CONFIGURED_TP, "models/config.json": '{"reduce": true}\n'})
    first = equivci(["verify", "--format", "json"], repo)
    assert first.code == 0, first.stderr
    (repo / "models" / "config.json").write_text('{"reduce": false}\n')
    git(repo, "commit", "-qam", "config: no reduction")

    for args in (["verify", "--format", "json", "--changed-since", "HEAD~1"], ["ci", "--changed-since", "HEAD~1"]):
        run = equivci(args, repo)
        assert run.tracebacks == 0
        assert run.code == 1, run.stdout + run.stderr
        if args[0] == "verify":
            (model,) = json.loads(run.stdout)["models"]
            assert model["status"] == "mismatch" and model["reused"] is False

    # The record of the last capture names the config among the model's sources.
    from equivci import memo
    from equivci.manifest import load_manifest

    manifest = load_manifest(repo / "equivci.yaml")
    assert str(repo / "models" / "config.json") in memo.recorded_sources(manifest, manifest.models[0])
