"""Manifest v1: every malformed manifest fails through the CLI with exit 2 and a message naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from equivci.cli import run
from equivci.errors import EquivciError
from equivci.manifest import load_manifest


def _model(**overrides):
    model = {
        "name": "llama-tp",
        "reference": "models/llama.py:forward",
        "distributed": "models/llama_tp.py:forward",
        "inputs": "models/llama.py:inputs",
        "mesh": {"tp": 4},
    }
    model.update(overrides)
    return {k: v for k, v in model.items() if v is not _DROP}


_DROP = object()


def _doc(*models, **top):
    doc = {"version": 1, "models": list(models) or [_model()]}
    doc.update(top)
    return yaml.safe_dump({k: v for k, v in doc.items() if v is not _DROP}, sort_keys=False)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "models").mkdir()
    for name in ("llama.py", "llama_tp.py"):
        (tmp_path / "models" / name).write_text("def forward(x):\n    return x\n")
    return tmp_path


def _verify(manifest: Path, capsys) -> tuple[int, str]:
    code = run(["verify", "--manifest", str(manifest)])
    out, err = capsys.readouterr()
    return code, out + err


BAD = [
    # (id, manifest text, text that must appear in the message)
    ("not-yaml", "version: 1\nmodels: [\n  - {name: a\n", ":3: not valid YAML"),
    ("not-a-mapping", "- version\n- models\n", "<top level>"),
    ("missing-version", _doc(version=_DROP), "version: missing required key"),
    ("unsupported-version", _doc(version=2), "version: unsupported manifest version 2"),
    ("string-version", _doc(version="1"), "version: unsupported manifest version '1'"),
    ("missing-models", _doc(models=_DROP), "models: missing required key"),
    ("empty-models", "version: 1\nmodels: []\n", "models: the list is empty"),
    ("models-not-list", "version: 1\nmodels: {name: a}\n", "models: expected a list"),
    ("unknown-top-key", _doc(model=[]), "model: unknown key; did you mean 'models'?"),
    ("model-not-mapping", "version: 1\nmodels:\n  - llama-tp\n", "models[0]: expected a mapping"),
    ("missing-key", _doc(_model(), _model(name="b", mesh=_DROP)), "models[1].mesh: missing required key"),
    ("unknown-key", _doc(_model(distribted="x.py:f")), "models[0].distribted: unknown key; did you mean 'distributed'?"),
    ("reference-not-string", _doc(_model(reference=3)), "models[0].reference: expected an entrypoint string"),
    ("bad-name", _doc(_model(name="llama tp")), "models[0].name: invalid model name 'llama tp'"),
    ("name-not-string", _doc(_model(name=12)), "models[0].name: invalid model name 12"),
    ("duplicate-names", _doc(_model(), _model()), "models[1].name: duplicate model name 'llama-tp'"),
    ("mesh-empty", _doc(_model(mesh={})), "models[0].mesh: the mesh has no axes"),
    ("mesh-not-mapping", _doc(_model(mesh=[4])), "models[0].mesh: expected a mapping"),
    ("mesh-zero", _doc(_model(), _model(name="b", mesh={"dp": 2, "tp": 0})), "models[1].mesh.tp: axis size must be a positive integer, got 0"),
    ("mesh-negative", _doc(_model(mesh={"tp": -2})), "models[0].mesh.tp: axis size must be a positive integer, got -2"),
    ("mesh-float", _doc(_model(mesh={"tp": 2.5})), "models[0].mesh.tp: axis size must be a positive integer, got a number"),
    ("mesh-string", _doc(_model(mesh={"tp": "4"})), "models[0].mesh.tp: axis size must be a positive integer, got a string"),
    ("mesh-bool", "version: 1\nmodels:\n  - name: a\n    reference: models/llama.py:forward\n"
     "    distributed: models/llama_tp.py:forward\n    inputs: models/llama.py:inputs\n    mesh: {tp: yes}\n",
     "models[0].mesh.tp: axis size must be a positive integer, got a boolean"),
    ("mesh-too-many-devices", _doc(_model(mesh={"dp": 8, "tp": 16})), "models[0].mesh: the mesh dp=8 x tp=16 needs 128 devices"),
    ("mesh-bad-axis-name", _doc(_model(mesh={"t p": 2})), "models[0].mesh.t p: axis name 't p' is not an identifier"),
    ("mesh-duplicate-axis", "version: 1\nmodels:\n  - name: a\n    reference: models/llama.py:forward\n"
     "    distributed: models/llama_tp.py:forward\n    inputs: models/llama.py:inputs\n    mesh: {tp: 2, tp: 4}\n",
     ":7: tp: key written twice"),
    ("entrypoint-no-colon", _doc(_model(distributed="models/llama_tp.py")), "models[0].distributed: 'models/llama_tp.py' is not of the form FILE.py:FUNC"),
    ("entrypoint-bad-function", _doc(_model(reference="models/llama.py:for-ward")), "models[0].reference: 'models/llama.py:for-ward' is not of the form"),
    ("entrypoint-bad-module", _doc(_model(inputs="my-pkg.models:inputs")), "models[0].inputs: 'my-pkg.models' is neither a .py file nor a dotted module"),
    ("entrypoint-file-missing", _doc(_model(inputs="models/missing.py:inputs")), "models[0].inputs: file 'models/missing.py' does not exist"),
    ("kind-unknown", _doc(_model(kind="onnx")), "models[0].kind: unknown model kind 'onnx'"),
    ("hlo-without-relations", _doc(_model(kind="hlo", inputs=_DROP, reference="models/llama.py", distributed="models/llama_tp.py")),
     "models[0].relations: missing required key"),
    ("tags-not-list", _doc(_model(tags="nightly")), "models[0].tags: expected a list of strings"),
    ("tags-not-strings", _doc(_model(tags=["nightly", 3])), "models[0].tags[1]: expected a non-empty string"),
    ("oracle-not-mapping", _doc(_model(oracle=0.01)), "models[0].oracle: expected a mapping, got a number"),
    ("assume-valid-indices-string", _doc(_model(assume_valid_indices="no")),
     "models[0].assume_valid_indices: expected true or false, got a string ('no')"),
    ("int-range-one-number", _doc(_model(int_range=24)),
     "models[0].int_range: expected [lo, hi] with integers lo < hi, got an integer (24)"),
    ("int-range-empty", _doc(_model(int_range=[5, 5])),
     "models[0].int_range: expected [lo, hi] with integers lo < hi, got a list"),
    ("oracle-unknown-key", _doc(_model(oracle={"rtole": 0.1})), "models[0].oracle.rtole: unknown key; did you mean 'rtol'?"),
    ("oracle-negative-rtol", _doc(_model(oracle={"rtol": -1})), "models[0].oracle.rtol: expected a non-negative number, got an integer (-1)"),
    ("oracle-string-atol", _doc(_model(oracle={"atol": "1e-3"})), "models[0].oracle.atol: expected a non-negative number, got a string"),
    ("oracle-inputs-missing-file", _doc(_model(oracle={"inputs": "models/small.py:inputs"})),
     "models[0].oracle.inputs: file 'models/small.py' does not exist"),
]


@pytest.mark.parametrize("text,expected", [(t, e) for _, t, e in BAD], ids=[i for i, _, _ in BAD])
def test_bad_manifest_exits_2_naming_the_key(project: Path, capsys, text: str, expected: str) -> None:
    manifest = project / "equivci.yaml"
    manifest.write_text(text)
    code, output = _verify(manifest, capsys)
    assert code == 2
    assert expected in output
    assert str(manifest) in output  # names the manifest file
    assert "Traceback" not in output
    # One paragraph: the whole message is on the `equivci: error:` line.
    assert output.startswith("equivci: error: ") and output.count("\n") == 1


def test_missing_manifest_file(tmp_path: Path, capsys) -> None:
    code, output = _verify(tmp_path / "nope.yaml", capsys)
    assert code == 2
    assert "nope.yaml: manifest not found" in output and "--manifest" in output
    assert "Traceback" not in output


def test_unknown_key_without_close_match_lists_allowed_keys(project: Path) -> None:
    (project / "equivci.yaml").write_text(_doc(_model(zzz=1)))
    with pytest.raises(EquivciError, match=r"models\[0\]\.zzz: unknown key; remove it; the allowed keys are name,"):
        load_manifest(project / "equivci.yaml")


def test_error_names_the_line(project: Path) -> None:
    (project / "equivci.yaml").write_text(_doc(_model(), _model(name="b", mesh={"tp": 0})))
    with pytest.raises(EquivciError) as info:
        load_manifest(project / "equivci.yaml")
    text = (project / "equivci.yaml").read_text().splitlines()
    line = int(str(info.value).split(":")[1])
    assert text[line - 1].strip().startswith("tp: 0")


def test_valid_manifest(project: Path) -> None:
    manifest = project / "sub" / "equivci.yaml"
    manifest.parent.mkdir()
    (project / "sub" / "m.py").write_text("")
    manifest.write_text(
        _doc(
            _model(reference="m.py:forward", distributed="m.py:dist", inputs="m.py:inputs", mesh={"dp": 2, "tp": 4}, tags=["nightly"]),
            _model(name="pkg.model_2", reference="mypkg.models:forward", distributed="../models/llama_tp.py:forward",
                   inputs="m.py:inputs", mesh={"tp": 1}),
        )
    )
    loaded = load_manifest(manifest)
    assert loaded.path == manifest and loaded.root == manifest.parent
    first, second = loaded.models
    assert first.reference.file == (project / "sub" / "m.py").resolve() and first.reference.module is None
    assert first.reference.function == "forward" and first.reference.spec == "m.py:forward"
    assert first.mesh == (("dp", 2), ("tp", 4)) and first.num_devices == 8
    assert first.tags == ("nightly",)
    assert second.reference.module == "mypkg.models" and second.reference.file is None
    assert second.distributed.file == (project / "models" / "llama_tp.py").resolve()
    assert second.tags == ()


def test_mesh_order_is_kept_as_written(project: Path) -> None:
    (project / "equivci.yaml").write_text(_doc(_model(mesh={"tp": 2, "dp": 4, "sp": 2})))
    assert load_manifest(project / "equivci.yaml").models[0].mesh == (("tp", 2), ("dp", 4), ("sp", 2))


def test_oracle_settings(project: Path) -> None:
    (project / "equivci.yaml").write_text(_doc(
        _model(oracle={"rtol": 0.02, "inputs": "models/llama.py:small"}), _model(name="b")))
    first, second = load_manifest(project / "equivci.yaml").models
    assert (first.oracle.rtol, first.oracle.atol, first.oracle.tolerance_set) == (0.02, None, True)
    assert first.oracle.inputs is not None and first.oracle.inputs.function == "small"
    assert not second.oracle.tolerance_set and second.oracle.inputs is None


def test_int_range_is_optional(project: Path) -> None:
    (project / "equivci.yaml").write_text(_doc(_model(int_range=[0, 24]), _model(name="b")))
    first, second = load_manifest(project / "equivci.yaml").models
    assert (first.int_range, second.int_range) == ((0, 24), None)


def test_assume_valid_indices_defaults_to_true(project: Path) -> None:
    (project / "equivci.yaml").write_text(_doc(_model(assume_valid_indices=False), _model(name="b")))
    first, second = load_manifest(project / "equivci.yaml").models
    assert (first.assume_valid_indices, second.assume_valid_indices) == (False, True)
