"""`--format sarif`: SARIF 2.1.0 for GitHub code scanning (github/codeql-action/upload-sarif).

- One rule per kind of verdict, with stable ids (`EQV001`...) and help text; a result's `ruleId` is
  the kind of its model's verdict (mismatch, unproven, error), or `EQV004` for a non-error note.
- Result locations are repository-relative URIs with `uriBaseId: %SRCROOT%`, as code scanning wants,
  percent-encoded (`tp ü.py` is `tp%20%C3%BC.py`); a finding without a file is placed on the manifest
  (code scanning needs a location).
- One run per file, and one category per manifest (`automationDetails.id`): code scanning refuses
  an upload with two runs of one tool and category, and replaces the alerts of a category as a
  whole, so two manifests of one repository must not share one.
- `partialFingerprints` keep alerts stable across runs when lines shift elsewhere in the file.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

from equivci import __version__
from equivci.results import Finding, ModelResult, Report, Status

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
INFO_URI = "https://github.com/equivci/equivci"

RULES: tuple[dict[str, Any], ...] = (
    {
        "id": "EQV001",
        "name": "DistributedMismatch",
        "status": Status.MISMATCH,
        "level": "error",
        "short": "The distributed entrypoint computes a different function than its reference.",
        "help": (
            "equivci showed that the sharded program differs from the single-device reference: a "
            "concrete counterexample on random inputs, or a refutation. Typical causes are a missing "
            "or doubled all-reduce (psum), a wrong slice offset (axis_index times the wrong block), a "
            "shard taken from the wrong tensor, or a changed dtype. Fix the line the finding points at."
        ),
    },
    {
        "id": "EQV002",
        "name": "EquivalenceUnproven",
        "status": Status.UNPROVEN,
        "level": "error",
        "short": "equivci could not prove the distributed entrypoint equivalent to its reference.",
        "help": (
            "Neither a proof nor a counterexample was found. The finding names the first distributed "
            "op whose value is not related to any reference value. Check that op; if the code is "
            "correct, the pattern may not be supported yet."
        ),
    },
    {
        "id": "EQV003",
        "name": "VerificationError",
        "status": Status.ERROR,
        "level": "error",
        "short": "The manifest, an import, tracing or capture failed.",
        "help": (
            "equivci could not check this model: the message says what to fix (manifest key, "
            "entrypoint, or an exception while tracing). Rerun `equivci verify --debug` locally "
            "for the traceback."
        ),
    },
    {
        "id": "EQV004",
        "name": "VerificationNote",
        "status": None,
        "level": "note",
        "short": "Additional information about a verification result.",
        "help": "Context for another finding, such as the downstream op where a defect shows.",
    },
)

_LEVEL = {"error": "error", "warning": "warning", "note": "note"}


def rule_for(model: ModelResult, finding: Finding) -> dict[str, Any]:
    if finding.severity == "note" or model.status is Status.VERIFIED:
        return RULES[3]
    return next(r for r in RULES if r["status"] is model.status)


def _rule_doc(rule: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": rule["id"],
        "name": rule["name"],
        "shortDescription": {"text": rule["short"]},
        "fullDescription": {"text": rule["help"]},
        "help": {"text": rule["help"], "markdown": rule["help"]},
        "helpUri": f"{INFO_URI}#{rule['name'].lower()}",
        "defaultConfiguration": {"level": rule["level"]},
        "properties": {"tags": ["correctness", "distributed", "jax"], "precision": "high"},
    }


def _fingerprint(model: ModelResult, f: Finding) -> str:
    key = "\0".join([model.name, f.path or "", f.layer or "", f.op or "", f.message])
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


def category(manifest_path: str | None) -> str:
    """`equivci/` for the default manifest (the category of earlier releases, so existing alerts
    stay theirs), `equivci/PATH/` for any other."""
    if manifest_path in (None, "equivci.yaml"):
        return "equivci/"
    return f"equivci/{manifest_path}/"


def to_sarif(report: Report, repo_root: str | Path | None = None, manifest_path: str | None = None) -> dict[str, Any]:
    rule_index = {r["id"]: i for i, r in enumerate(RULES)}
    results = []
    for model in report.models:
        for f in model.findings:
            rule = rule_for(model, f)
            path = f.path or manifest_path or "equivci.yaml"
            region = {"startLine": f.line if f.line and f.line > 0 else 1}
            result: dict[str, Any] = {
                "ruleId": rule["id"],
                "ruleIndex": rule_index[rule["id"]],
                "level": _LEVEL.get(f.severity, "warning") if rule["id"] != "EQV004" else "note",
                "message": {"text": f"{model.name}: {f.message}"},
                "locations": [
                    {
                        "physicalLocation": {
                            "artifactLocation": {
                                "uri": quote(Path(path).as_posix(), safe="/"),
                                "uriBaseId": "%SRCROOT%",
                            },
                            "region": region,
                        }
                    }
                ],
                "partialFingerprints": {"equivciFinding/v1": _fingerprint(model, f)},
                "properties": {"model": model.name, "status": model.status.value},
            }
            if f.layer:
                result["properties"]["layer"] = f.layer
            if f.op:
                result["properties"]["op"] = f.op
            results.append(result)
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "equivci",
                "version": __version__,
                "semanticVersion": __version__,
                "informationUri": INFO_URI,
                "rules": [_rule_doc(r) for r in RULES],
            }
        },
        "automationDetails": {"id": category(manifest_path)},
        "results": results,
        "columnKind": "unicodeCodePoints",
    }
    if repo_root is not None:
        uri = Path(repo_root).resolve().as_uri().rstrip("/") + "/"
        run["originalUriBaseIds"] = {"%SRCROOT%": {"uri": uri}}
    return {"$schema": SCHEMA, "version": "2.1.0", "runs": [run]}


def render(report: Report, repo_root: str | Path | None = None, manifest_path: str | None = None) -> str:
    return json.dumps(to_sarif(report, repo_root, manifest_path), indent=2) + "\n"
