"""The GitHub Actions context: the standard environment variables and the event payload, typed.

Only the standard variables are read, so the same command runs on github.com, on GitHub Enterprise
Server and against a stand-in server (GITHUB_API_URL pointing anywhere).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from equivci.errors import EquivciError

PULL_REQUEST_EVENTS = ("pull_request", "pull_request_target")


@dataclasses.dataclass(frozen=True)
class PullRequest:
    number: int
    base_sha: str
    head_sha: str
    base_ref: str | None = None
    head_ref: str | None = None
    head_repo: str | None = None  # owner/name of the head repository (differs for forks)
    html_url: str | None = None


@dataclasses.dataclass(frozen=True)
class ActionsContext:
    event_name: str | None
    repository: str | None  # owner/name
    api_url: str
    server_url: str
    token: str | None = dataclasses.field(default=None, repr=False)  # never shown
    step_summary: Path | None = None
    output: Path | None = None
    workspace: Path | None = None
    sha: str | None = None
    run_id: str | None = None
    runner_temp: Path | None = None
    pull_request: PullRequest | None = None
    payload: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def in_actions(self) -> bool:
        return self.event_name is not None

    @property
    def run_url(self) -> str | None:
        if self.repository and self.run_id:
            return f"{self.server_url}/{self.repository}/actions/runs/{self.run_id}"
        return None

    def blob_url(self, sha: str | None = None) -> str | None:
        """Base URL for links to files at a commit: `{blob_url}/{path}#L{line}`."""
        sha = sha or (self.pull_request.head_sha if self.pull_request else None) or self.sha
        if self.repository and sha:
            return f"{self.server_url}/{self.repository}/blob/{sha}"
        return None


def _pull_request(payload: dict[str, Any]) -> PullRequest | None:
    pr = payload.get("pull_request")
    if not isinstance(pr, dict):
        return None
    try:
        raw: Any = pr.get("number") or payload.get("number")  # None fails int(): no pull request
        number = int(raw)
        base = pr["base"]
        head = pr["head"]
        base_sha, head_sha = str(base["sha"]), str(head["sha"])
    except (KeyError, TypeError, ValueError) as exc:
        raise EquivciError(
            f"the pull_request event payload lacks {exc}; equivci ci needs pull_request.number, "
            "base.sha and head.sha (is GITHUB_EVENT_PATH the file GitHub Actions wrote?)."
        ) from None
    head_repo = (head.get("repo") or {}).get("full_name") if isinstance(head.get("repo"), dict) else None
    return PullRequest(
        number=number,
        base_sha=base_sha,
        head_sha=head_sha,
        base_ref=base.get("ref"),
        head_ref=head.get("ref"),
        head_repo=head_repo,
        html_url=pr.get("html_url"),
    )


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


def load_context(env: Mapping[str, str] | None = None) -> ActionsContext:
    """Read GITHUB_* variables and, when GITHUB_EVENT_PATH is set, the event JSON."""
    env = os.environ if env is None else env
    event_name = env.get("GITHUB_EVENT_NAME") or None
    payload: dict[str, Any] = {}
    event_path = env.get("GITHUB_EVENT_PATH")
    if event_path:
        try:
            payload = json.loads(Path(event_path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise EquivciError(
                f"GITHUB_EVENT_PATH={event_path}: cannot read the event file ({exc.strerror})."
            ) from None
        except ValueError as exc:
            raise EquivciError(f"GITHUB_EVENT_PATH={event_path}: not valid JSON ({exc}).") from None
        if not isinstance(payload, dict):
            raise EquivciError(f"GITHUB_EVENT_PATH={event_path}: the event payload is not a JSON object.")
    pr = _pull_request(payload) if event_name in PULL_REQUEST_EVENTS else None
    repository = env.get("GITHUB_REPOSITORY") or (payload.get("repository") or {}).get("full_name")
    return ActionsContext(
        event_name=event_name,
        repository=repository,
        api_url=(env.get("GITHUB_API_URL") or "https://api.github.com").rstrip("/"),
        server_url=(env.get("GITHUB_SERVER_URL") or "https://github.com").rstrip("/"),
        token=env.get("GITHUB_TOKEN") or env.get("INPUT_TOKEN") or None,
        step_summary=_path(env.get("GITHUB_STEP_SUMMARY")),
        output=_path(env.get("GITHUB_OUTPUT")),
        workspace=_path(env.get("GITHUB_WORKSPACE")),
        sha=env.get("GITHUB_SHA") or None,
        run_id=env.get("GITHUB_RUN_ID") or None,
        runner_temp=_path(env.get("RUNNER_TEMP")),
        pull_request=pr,
        payload=payload,
    )
