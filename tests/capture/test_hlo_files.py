"""Models given as HLO files (`kind: hlo`, docs/byo-hlo.md): the relation file, the capture of HLO
files, and `equivci verify` end to end on the Llama-style TP=2 dumps in tests/data/byo_hlo/."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from equivci.capture.run import capture_model
from equivci.errors import EquivciError
from equivci.manifest import load_manifest

DATA = Path(__file__).resolve().parents[1] / "data" / "byo_hlo"

MANIFEST = """\
version: 1
models:
  - name: {name}
    kind: hlo
    reference: {reference}
    distributed: {distributed}
    relations: {relations}
    mesh: {mesh}
"""

# y = 2 * x on one device; per device, a block of rows picked by a rank parameter.
REFERENCE = """\
HloModule ref
ENTRY %main (x: f32[4,8]) -> f32[4,8] {
  %x = f32[4,8] parameter(0)
  %two = f32[] constant(2)
  %b = f32[4,8] broadcast(%two), dimensions={}
  ROOT %y = f32[4,8] multiply(%x, %b)
}
"""
DISTRIBUTED = """\
HloModule dist
ENTRY %main (x: f32[4,8], rank: s32[]) -> f32[2,8] {
  %x = f32[4,8] parameter(0)
  %rank = s32[] parameter(1)
  %rows = s32[] constant(ROWS)
  %start = s32[] multiply(%rank, %rows)
  %zero = s32[] constant(0)
  %mine = f32[2,8] dynamic-slice(%x, %start, %zero), dynamic_slice_sizes={2,8}
  %two = f32[] constant(2)
  %b = f32[2,8] broadcast(%two), dimensions={}
  %y = f32[2,8] multiply(%mine, %b), metadata={source_file="dist.py" source_line=7}
  ROOT %out = f32[2,8] custom-call(%y), custom_call_target="VendorTransfer"
}
"""
RELATIONS = """\
version: 1
device_index: {parameter: rank}
custom_calls:
  VendorTransfer: identity
parameters:
  x: {reference: x}
outputs:
  0: {reference: 0, split: {0: tp}}
"""


def _model(tmp_path: Path, reference: str = REFERENCE, distributed: str = DISTRIBUTED.replace("ROWS", "2"),
           relations: str = RELATIONS, mesh: str = "{tp: 2}", name: str = "byo"):
    (tmp_path / "ref.hlo.txt").write_text(reference)
    (tmp_path / "dist.hlo.txt").write_text(distributed)
    (tmp_path / "rel.yaml").write_text(relations)
    (tmp_path / "equivci.yaml").write_text(MANIFEST.format(name=name, reference="ref.hlo.txt", distributed="dist.hlo.txt",
                                                          relations="rel.yaml", mesh=mesh))
    manifest = load_manifest(tmp_path / "equivci.yaml")
    return manifest, manifest.models[0]


def _verify(manifest, model, captured=None):
    from equivci.verify.engine import verify_model

    return verify_model(model, manifest, captured or capture_model(model, manifest))


def _cli(folder: Path, *args: str) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "equivci", "verify", "--format", "json", "--no-cache", *args],
                          cwd=folder, capture_output=True, text=True, timeout=600)
    return proc.returncode, json.loads(proc.stdout)


def test_device_index_from_a_parameter_verifies(tmp_path):
    manifest, model = _model(tmp_path)
    captured = capture_model(model, manifest)
    assert [leaf.device_slices for leaf in captured.outputs] == [(((0, 2), (0, 8)), ((2, 4), (0, 8)))]
    assert captured.sources == ("dist.hlo.txt", "ref.hlo.txt", "rel.yaml")  # what --changed-since watches
    assert _verify(manifest, model).status.value == "verified"


def test_wrong_rank_offset_is_not_verified(tmp_path):
    """Near miss of the device-index parameter: rows 1:3 on device 1 instead of 2:4."""
    manifest, model = _model(tmp_path, distributed=DISTRIBUTED.replace("ROWS", "1"))
    result = _verify(manifest, model)
    assert result.status.value == "mismatch"  # XLA ran both programs: a counterexample
    assert any("counterexample" in f.message for f in result.findings)


def test_without_the_rank_parameter_device_zero_is_not_every_device(tmp_path):
    """Near miss of `device_index`: the same program with the index from partition-id (so the rank
    parameter has no relation) is refused, not taken as device 0 everywhere."""
    with pytest.raises(EquivciError, match=r"rel.yaml: parameters: distributed parameter 1 \(rank, s32\[\]\) has no relation"):
        manifest, model = _model(tmp_path, relations=RELATIONS.replace("device_index: {parameter: rank}\n", ""))
        capture_model(model, manifest)


@pytest.mark.parametrize("change, message", [
    (("x: {reference: x}", "y: {reference: x}"), r"rel.yaml:6: parameters.y: no distributed parameter named 'y'"),
    (("x: {reference: x}", "x: {reference: w}"), r"rel.yaml:6: parameters.x.reference: no reference parameter named 'w'"),
    (("  VendorTransfer: identity\n", ""), r'dist.hlo.txt: out calls custom call "VendorTransfer", which rel.yaml does not declare under `custom_calls:`'),
    (("split: {0: tp}", "split: {0: dp}"), r"rel.yaml:8: outputs.0.split.0: 'dp' is not an axis of the model's mesh"),
    (("split: {0: tp}", "split: {1: tp}"), r"outputs.0: distributed output 0 is f32\[2,8\] but the relation makes a block"),
    (("version: 1", "version: 2"), r"rel.yaml:1: version: expected `version: 1`"),
    (("parameters:", "params:"), r"rel.yaml:5: <top level>.params: unknown key; did you mean 'parameters'"),
])
def test_bad_relation_file_is_one_paragraph_naming_file_and_key(tmp_path, change, message):
    manifest, model = _model(tmp_path, relations=RELATIONS.replace(*change))
    with pytest.raises(EquivciError, match=message) as info:
        capture_model(model, manifest)
    assert "\n" not in str(info.value)


def test_elided_constant_is_refused(tmp_path):
    elided = REFERENCE.replace("%two = f32[] constant(2)", "%two = f32[] constant({...})")
    manifest, model = _model(tmp_path, reference=elided)
    with pytest.raises(EquivciError, match=r"ref.hlo.txt:4: an elided constant .* HloModuleProto"):
        capture_model(model, manifest)


def test_missing_hlo_file_is_a_manifest_error(tmp_path):
    _model(tmp_path)
    (tmp_path / "dist.hlo.txt").unlink()
    with pytest.raises(EquivciError, match=r"equivci.yaml:6: models\[0\].distributed: file 'dist.hlo.txt' does not exist"):
        load_manifest(tmp_path / "equivci.yaml")


def test_an_hlo_model_takes_no_inputs_key(tmp_path):
    _model(tmp_path)
    text = (tmp_path / "equivci.yaml").read_text() + "    inputs: m.py:inputs\n"
    (tmp_path / "equivci.yaml").write_text(text)
    with pytest.raises(EquivciError, match=r"models\[0\].inputs: unknown key"):
        load_manifest(tmp_path / "equivci.yaml")


# x * table, with a table too large for HLO text to print (XLA elides it there); argv: FILE ELEMENT ...
PROTOS = """
import sys
import jax, jax.numpy as jnp, numpy as np
for path, element in zip(sys.argv[1::2], sys.argv[2::2]):
    table = np.arange(4096, dtype=np.float32)
    table[4000] = float(element)
    lowered = jax.jit(lambda x: x * table).lower(jax.ShapeDtypeStruct((4096,), jnp.float32))
    open(path, "wb").write(lowered.compiler_ir("hlo").as_serialized_hlo_module_proto())
"""


def test_constants_come_from_the_proto_and_two_tables_differ(tmp_path):
    """A serialized HloModuleProto gives constants in full: the same table verifies, another one
    (same shape, one element changed) does not, which elided text could not tell apart."""
    # Made in a child: jax's threads must not be in the process that forks the verifier.
    subprocess.run([sys.executable, "-c", PROTOS, "ref.pb", "4000", "same.pb", "4000", "other.pb", "-1"], cwd=tmp_path,
                   check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    (tmp_path / "rel.yaml").write_text("version: 1\nparameters:\n  0: {reference: 0}\n")
    for distributed, status in (("same.pb", "verified"), ("other.pb", "mismatch")):
        (tmp_path / "equivci.yaml").write_text(MANIFEST.format(name="proto", reference="ref.pb", distributed=distributed,
                                                              relations="rel.yaml", mesh="{tp: 1}"))
        manifest = load_manifest(tmp_path / "equivci.yaml")
        captured = capture_model(manifest.models[0], manifest)
        assert "{...}" not in captured.reference_hlo
        assert _verify(manifest, manifest.models[0], captured).status.value == status


def _llama(tmp_path: Path, distributed: str) -> Path:
    for name in ("reference.hlo.txt", distributed, "relations.yaml", "llama_tp.py"):
        shutil.copy(DATA / name, tmp_path / name)
    (tmp_path / "equivci.yaml").write_text(MANIFEST.format(name="llama-tp2", reference="reference.hlo.txt",
                                                          distributed=distributed, relations="relations.yaml",
                                                          mesh="{tp: 2}"))
    return tmp_path


def test_llama_tp2_dump_verifies_end_to_end(tmp_path):
    code, report = _cli(_llama(tmp_path, "distributed.hlo.txt"))
    (model,) = report["models"]
    assert (code, model["status"]) == (0, "verified"), model


def test_llama_tp2_wrong_k_start_is_a_mismatch_at_the_slice(tmp_path):
    """k read from q's columns of the fused weight (llama_tp.py:59-60): XLA runs both programs and
    finds a counterexample. The fused projection (line 58) is no window of one reference value (the
    relation file declares the weight a concatenation), but each of its reads is one: the finding is
    the read that takes q's window for k, with the source line from the HLO metadata."""
    code, report = _cli(_llama(tmp_path, "distributed_wrong_k.hlo.txt"))
    (model,) = report["models"]
    assert (code, model["status"]) == (1, "mismatch"), model
    error = next(f for f in model["findings"] if f["severity"] == "error")
    assert (error["path"], error["line"]) == ("llama_tp.py", 60), error
    assert "`k`" in error["message"] and "unknown line" not in error["message"], error
    assert any("counterexample: on random inputs output" in f["message"] for f in model["findings"])


def test_bad_input_is_status_error_and_exit_2(tmp_path):
    _llama(tmp_path, "distributed.hlo.txt")
    relations = (tmp_path / "relations.yaml").read_text().replace("  AwsNeuronAllReduce: {all-reduce: add, groups: [tp]}\n", "")
    (tmp_path / "relations.yaml").write_text(relations)
    code, report = _cli(tmp_path)
    (model,) = report["models"]
    assert (code, model["status"]) == (2, "error")
    assert "AwsNeuronAllReduce" in model["findings"][0]["message"] and "custom_calls" in model["findings"][0]["message"]


def test_memo_changed_since_and_precommit_follow_the_hlo_and_relation_files(tmp_path, capsys):
    """The memo serves an unchanged HLO model; `--changed-since` reuses it until its HLO or
    relation file changes; the pre-commit hook selects it by those files."""
    from equivci.cli import run
    from equivci.commands.precommit import affected_models

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=tmp_path,
                       check=True, capture_output=True)

    def verify(*args: str) -> dict:
        capsys.readouterr()
        run(["verify", "--manifest", str(tmp_path / "equivci.yaml"), "--format", "json", *args])
        (model,) = json.loads(capsys.readouterr().out)["models"]
        return model

    manifest, model = _model(tmp_path)
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "hlo model")
    first = verify()
    assert first["status"] == "verified" and first["layers"]["reused"] == 0
    again = verify()
    assert again["status"] == "verified" and again["layers"]["reused"] == again["layers"]["total"]
    assert verify("--changed-since", "HEAD")["reused"] is True
    assert [m.name for m in affected_models(manifest, manifest.models, [tmp_path / "rel.yaml"])] == ["byo"]
    assert affected_models(manifest, manifest.models, [tmp_path / "other.py"]) == []
    (tmp_path / "rel.yaml").write_text(RELATIONS.replace("x: {reference: x}", "0: {reference: 0}"))
    changed = verify("--changed-since", "HEAD")
    assert changed["reused"] is False and changed["status"] == "verified"


FUSED_REFERENCE = """\
HloModule ref
ENTRY %main (wgu: f32[8,4]) -> f32[4,4] {
  %wgu = f32[8,4] parameter(0)
  %g = f32[4,4] slice(%wgu), slice={[0:4], [0:4]}
  %u = f32[4,4] slice(%wgu), slice={[4:8], [0:4]}
  ROOT %y = f32[4,4] multiply(%g, %u)
}
"""
FUSED_DISTRIBUTED = """\
HloModule dist
ENTRY %main (g: f32[2,4], u: f32[2,4]) -> f32[2,4] {
  %g = f32[2,4] parameter(0)
  %u = f32[2,4] parameter(1)
  ROOT %y = f32[2,4] multiply(%g, %u)
}
"""
FUSED_RELATIONS = """\
version: 1
parameters:
  g: {reference: wgu, window: {0: [0, 4]}, split: {0: tp}}
  u: {reference: wgu, window: {0: [UP, UP_END]}, split: {0: tp}}
outputs:
  0: {reference: 0, split: {0: tp}}
"""


@pytest.mark.parametrize("up, status", [((4, 8), "verified"), ((0, 4), "mismatch")])
def test_windows_of_one_fused_reference_parameter(tmp_path, up, status):
    """Gate and up blocks cut from one fused reference weight (each device's block taken by its
    device index); near miss: the up window declared where the gate lives."""
    relations = FUSED_RELATIONS.replace("UP_END", str(up[1])).replace("UP", str(up[0]))
    manifest, model = _model(tmp_path, reference=FUSED_REFERENCE, distributed=FUSED_DISTRIBUTED, relations=relations)
    assert _verify(manifest, model).status.value == status


SCALE_REFERENCE = REFERENCE
SCALE_DISTRIBUTED = REFERENCE.replace("HloModule ref", "HloModule dist").replace("4,8", "1,8")  # a block of rows


@pytest.mark.parametrize("order, status", [("[dp, tp]", "verified"), ("[tp, dp]", "mismatch")])
def test_split_over_two_axes_follows_their_order(tmp_path, order, status):
    """Rows split over dp then tp (dp major) on a 2 x 2 mesh; near miss: the input declared tp
    major while the output is dp major (devices 1 and 2 swap rows)."""
    relations = (f"version: 1\nparameters:\n  x: {{reference: x, split: {{0: {order}}}}}\n"
                 "outputs:\n  0: {reference: 0, split: {0: [dp, tp]}}\n")
    manifest, model = _model(tmp_path, reference=SCALE_REFERENCE, distributed=SCALE_DISTRIBUTED, relations=relations,
                             mesh="{dp: 2, tp: 2}")
    assert _verify(manifest, model).status.value == status


TUPLE_REFERENCE = REFERENCE.replace("-> f32[4,8]", "-> (f32[4,8], f32[4,8])").replace(
    "ROOT %y = f32[4,8] multiply(%x, %b)", "%y = f32[4,8] multiply(%x, %b)\n  ROOT %t = (f32[4,8], f32[4,8]) tuple(%y, %x)")
TUPLE_DISTRIBUTED = SCALE_DISTRIBUTED.replace("1,8", "2,8").replace("-> f32[2,8]", "-> (f32[2,8], f32[2,8])").replace(
    "ROOT %y = f32[2,8] multiply(%x, %b)", "%y = f32[2,8] multiply(%x, %b)\n  ROOT %t = (f32[2,8], f32[2,8]) tuple(%x, %y)")


@pytest.mark.parametrize("mapping, status", [((1, 0), "verified"), ((0, 1), "mismatch")])
def test_outputs_are_matched_as_the_relation_file_says(tmp_path, mapping, status):
    """The distributed result lists (x, 2x), the reference's (2x, x); near miss: matched in order."""
    relations = ("version: 1\nparameters:\n  x: {reference: x, split: {0: tp}}\noutputs:\n"
                 f"  0: {{reference: {mapping[0]}, split: {{0: tp}}}}\n  1: {{reference: {mapping[1]}, split: {{0: tp}}}}\n")
    manifest, model = _model(tmp_path, reference=TUPLE_REFERENCE, distributed=TUPLE_DISTRIBUTED, relations=relations)
    assert _verify(manifest, model).status.value == status


@pytest.mark.parametrize("text, name", [("f32[4] add(f32[4] a, f32[4] b)", "float32"),
                                        ("f32[4] convert(bf16[4] a)", "bfloat16"), ("s32[4] x", "float32")])
def test_numeric_check_judges_by_the_narrowest_float_the_programs_compute_in(text, name):
    from equivci.capture.hlo_oracle import _narrowest_float

    assert _narrowest_float(text) == name
