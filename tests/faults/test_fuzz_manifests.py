"""Fault suite: malformed manifests. Each must end in exit code 2 with one paragraph naming the
problem (and a JSON document under --format json), no traceback, and the manifest untouched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from repos import TRACEBACK

from equivci.cli import run

GOOD_MODEL = """\
  - name: mlp-tp
    reference: models/mlp.py:mlp
    distributed: models/mlp_tp.py:mlp
    inputs: models/mlp.py:inputs
    mesh: {tp: 2}
"""


def model(**changes: str | None) -> str:
    """The good model with some keys replaced (value text) or removed (None)."""
    lines = []
    for line in GOOD_MODEL.splitlines():
        key = line.strip().removeprefix("- ").split(":", 1)[0]
        if key in changes:
            if changes[key] is None:
                continue
            line = line.split(":", 1)[0] + ": " + changes[key]
        lines.append(line)
    if "name" in changes and changes["name"] is None:
        lines[0] = "  - " + lines[0].strip()
    extra = [f"    {k}: {v}" for k, v in changes.items() if v is not None and k not in GOOD_MODEL]
    return "\n".join(lines + extra) + "\n"


def doc(models: str) -> str:
    return "version: 1\nmodels:\n" + models


# (id, manifest bytes or text, a phrase the message must contain)
CASES: list[tuple[str, str | bytes, str]] = [
    ("empty-file", "", "expected a mapping"),
    ("only-comments", "# nothing\n", "expected a mapping"),
    ("a-list", "- 1\n- 2\n", "expected a mapping"),
    ("a-scalar", "hello\n", "expected a mapping"),
    ("a-number", "42\n", "expected a mapping"),
    ("version-2", "version: 2\nmodels: []\n", "unsupported manifest version 2"),
    ("version-string", "version: '1'\nmodels: []\n", "unsupported manifest version '1'"),
    ("version-true", "version: true\nmodels: []\n", "unsupported manifest version True"),
    ("version-float", "version: 1.0\nmodels: []\n", "unsupported manifest version 1.0"),
    ("version-missing", "models: []\n", "missing required key"),
    ("models-missing", "version: 1\n", "models: missing required key"),
    ("models-mapping", "version: 1\nmodels: {a: 1}\n", "expected a list of models"),
    ("models-empty", "version: 1\nmodels: []\n", "the list is empty"),
    ("models-null", "version: 1\nmodels:\n", "expected a list of models"),
    ("model-a-string", doc("  - mlp-tp\n"), "models[0]: expected a mapping"),
    ("model-null", doc("  -\n"), "models[0]: expected a mapping"),
    ("unknown-top-key", "version: 1\nmodel: []\nmodels: []\n", "did you mean 'models'"),
    ("unknown-model-key", doc(model(mesh_shape="{tp: 2}")), "unknown key"),
    ("typo-model-key", doc(model(tag="[a]")), "did you mean 'tags'"),
    *[(f"missing-{k}", doc(model(**{k: None})), f"models[0].{k}: missing required key")
      for k in ("name", "reference", "distributed", "inputs", "mesh")],
    ("duplicate-top-key", "version: 1\nversion: 1\nmodels: []\n", "key written twice"),
    ("duplicate-model-key", doc(GOOD_MODEL + "    mesh: {tp: 4}\n"), "key written twice"),
    ("duplicate-name", doc(GOOD_MODEL + GOOD_MODEL), "duplicate model name 'mlp-tp'"),
    ("name-spaces", doc(model(name="'mlp tp'")), "invalid model name"),
    ("name-int", doc(model(name="7")), "invalid model name 7"),
    ("name-empty", doc(model(name="''")), "invalid model name ''"),
    ("name-list", doc(model(name="[a]")), "invalid model name"),
    ("reference-int", doc(model(reference="3")), "expected an entrypoint string"),
    ("reference-no-colon", doc(model(reference="models/mlp.py")), "is not of the form FILE.py:FUNC"),
    ("reference-empty-function", doc(model(reference="'models/mlp.py:'")), "is not of the form"),
    ("reference-bad-function", doc(model(reference="'models/mlp.py:1mlp'")), "is not of the form"),
    ("reference-missing-file", doc(model(reference="models/nope.py:mlp")), "file 'models/nope.py' does not exist"),
    ("reference-folder", doc(model(reference="models.py:mlp")), "does not exist"),
    ("reference-bad-module", doc(model(reference="'my-pkg.models:mlp'")), "neither a .py file nor a dotted module"),
    ("reference-path-escape", doc(model(reference="../../../../etc/passwd.py:x")), "does not exist"),
    ("distributed-mapping", doc(model(distributed="{a: 1}")), "expected an entrypoint string, got a mapping"),
    ("inputs-null", doc(model(inputs="")), "expected an entrypoint string, got empty"),
    ("mesh-list", doc(model(mesh="[tp, 2]")), "expected a mapping, got a list"),
    ("mesh-string", doc(model(mesh="tp=2")), "expected a mapping"),
    ("mesh-empty", doc(model(mesh="{}")), "the mesh has no axes"),
    ("mesh-zero", doc(model(mesh="{tp: 0}")), "axis size must be a positive integer, got 0"),
    ("mesh-negative", doc(model(mesh="{tp: -2}")), "got -2"),
    ("mesh-bool", doc(model(mesh="{tp: yes}")), "got a boolean"),
    ("mesh-float", doc(model(mesh="{tp: 2.0}")), "got a number"),
    ("mesh-string-size", doc(model(mesh="{tp: two}")), "got a string"),
    ("mesh-null-size", doc(model(mesh="{tp: }")), "got empty"),
    ("mesh-axis-digit", doc(model(mesh="{1tp: 2}")), "is not an identifier"),
    ("mesh-axis-int", doc(model(mesh="{1: 2}")), "is not an identifier"),
    ("mesh-too-big", doc(model(mesh="{dp: 16, tp: 16}")), "needs 256 devices"),
    ("mesh-huge-int", doc(model(mesh="{tp: 99999999999999999999999}")), "needs 99999999999999999999999 devices"),
    ("tags-string", doc(model(tags="nightly")), "expected a list of strings"),
    ("tags-int-item", doc(model(tags="[1]")), "tags[0]: expected a non-empty string"),
    ("tags-empty-item", doc(model(tags="['']")), "tags[0]: expected a non-empty string"),
    ("tags-nested", doc(model(tags="[[a]]")), "tags[0]: expected a non-empty string"),
    ("timeout-zero", doc(model(capture_timeout="0")), "capture_timeout: expected a positive number"),
    ("timeout-negative", doc(model(capture_timeout="-5")), "expected a positive number"),
    ("timeout-string", doc(model(capture_timeout="soon")), "expected a positive number"),
    ("timeout-inf", doc(model(capture_timeout=".inf")), "expected a positive number"),
    ("timeout-nan", doc(model(capture_timeout=".nan")), "expected a positive number"),
    ("timeout-bool", doc(model(capture_timeout="true")), "expected a positive number"),
    ("yaml-tab-indent", "version: 1\nmodels:\n\t- name: x\n", "not valid YAML"),
    ("yaml-unclosed-bracket", "version: 1\nmodels: [\n", "not valid YAML"),
    ("yaml-unclosed-quote", "version: 1\nmodels: 'abc\n", "not valid YAML"),
    ("yaml-bad-indent", "version: 1\n models: []\n", "not valid YAML"),
    ("yaml-python-tag", "version: 1\nmodels: !!python/object/apply:os.system ['touch pwned']\n", "not valid YAML"),
    ("yaml-unknown-tag", "version: 1\nmodels: !custom []\n", "not valid YAML"),
    ("yaml-alias-bomb", ("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                         "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
                         "version: 1\nmodels: [*d, *d, *d, *d, *d, *d, *d, *d, *d]\n"), "unknown key"),
    ("yaml-undefined-alias", "version: 1\nmodels: *nothing\n", "not valid YAML"),
    ("yaml-two-documents", "version: 1\nmodels: []\n---\nversion: 1\n", "not valid YAML"),
    ("yaml-merge-key-non-map", "version: 1\nmodels:\n  - <<: 3\n", "not valid YAML"),
    ("nested-500-lists", "version: 1\nmodels: " + "[" * 500 + "]" * 500 + "\n", "nested too deeply"),
    ("nested-500-maps", "version: 1\nmodels: " + "{a: " * 500 + "1" + "}" * 500 + "\n", "nested too deeply"),
    ("binary-garbage", bytes(range(256)) * 4, "cannot read the manifest"),
    ("latin-1", "version: 1\nmodels:\n  - name: caf\xe9\n".encode("latin-1"), "cannot read the manifest"),
    ("nul-bytes", "version: 1\x00\nmodels: []\n", "not valid YAML"),
    ("utf-16", "version: 1\nmodels: []\n".encode("utf-16"), "cannot read the manifest"),
    ("huge-line", "version: 1\nmodels: [" + "x, " * 5_000 + "]\n", "models[0]: expected a mapping"),
    ("key-is-a-list", "version: 1\n? [a, b]\n: 1\nmodels: []\n", "found a list as a key"),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("manifests")
    (root / "models").mkdir()
    for name in ("mlp.py", "mlp_tp.py"):
        (root / "models" / name).write_text("def mlp(*a): pass\ndef inputs(): return ()\n")
    return root


@pytest.mark.parametrize(("text", "phrase"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.parametrize("output", ["text", "json"])
def test_malformed_manifest(folder: Path, capsys, text: str | bytes, phrase: str, output: str) -> None:
    path = folder / "equivci.yaml"
    data = text if isinstance(text, bytes) else text.encode("utf-8")
    path.write_bytes(data)
    capsys.readouterr()
    code = run(["verify", "--manifest", str(path), "--format", output])
    out, err = capsys.readouterr()
    assert code == 2
    assert TRACEBACK not in out + err
    assert err.startswith("equivci: error: ") and phrase in err and err.count("\n") == 1, err
    if output == "json":
        assert phrase in json.loads(out)["error"]
    else:
        assert out == ""
    assert path.read_bytes() == data
    assert sorted(p.name for p in folder.iterdir()) == ["equivci.yaml", "models"]  # nothing created
