"""A real HTTP server on 127.0.0.1 standing in for the GitHub REST API, for tests.

It records every request and implements the handful of endpoints equivci uses, with GitHub's
behaviour where it matters:
- issue comments: list (paginated with a Link header), create, edit;
- pull request review comments: list, edit; reviews: create, answered 422 *as a whole* when any comment's
  line is not in the pull request's diff (new side, inside a hunk);
- pull request files with their `patch`;
- a read-only mode answering 403 "Resource not accessible by integration" to every write, like the
  token GitHub gives to workflows of pull requests from forks;
- injected failures (429, 5xx, rate-limit 403) served before the normal answer.

The diff check is written independently of equivci.ci.diff on purpose.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclasses.dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any


@dataclasses.dataclass
class Injected:
    status: int
    headers: dict[str, str]
    body: Any
    method: str | None = None
    path_contains: str | None = None


def _patch_lines(patch: str) -> set[int]:
    """New-side line numbers that appear in the patch's hunks (added or context)."""
    lines: set[int] = set()
    new = 0
    for raw in patch.split("\n"):
        m = re.match(r"@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@", raw)
        if m:
            new = int(m.group(1))
        elif raw.startswith("-") or raw.startswith("\\"):
            continue
        elif new:
            lines.add(new)
            new += 1
    return lines


def pull_files_from_git(repo: Path, base: str, head: str) -> list[dict[str, Any]]:
    """The pulls/{n}/files answer GitHub would give for base...head of a real repository."""

    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "core.quotepath=off", *args], cwd=repo, check=True, capture_output=True, text=True).stdout

    files = []
    fields = [f for f in git("diff", "--name-status", "-z", "--no-renames", f"{base}...{head}").split("\0") if f]
    for status, name in zip(fields[::2], fields[1::2]):
        text = git("diff", "--no-color", "--no-renames", f"{base}...{head}", "--", name)
        patch = text[text.index("@@"):] if "@@" in text else ""
        files.append(
            {
                "filename": name,
                "status": {"A": "added", "D": "removed", "M": "modified"}.get(status[0], "modified"),
                "patch": patch.rstrip("\n"),
            }
        )
    return files


class FakeGitHub:
    def __init__(self, repo: str = "octo/widgets", token: str = "ghs_fake_token_0123456789", per_page_cap: int = 100):
        self.repo = repo
        self.token = token
        self.per_page_cap = per_page_cap
        self.read_only = False
        self.requests: list[Recorded] = []
        self.issue_comments: dict[int, list[dict[str, Any]]] = {}
        self.review_comments: dict[int, list[dict[str, Any]]] = {}
        self.reviews: dict[int, list[dict[str, Any]]] = {}
        self.files: dict[int, list[dict[str, Any]]] = {}
        self.injected: list[Injected] = []
        self._next_id = 1000
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    # --- lifecycle ---
    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeGitHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # --- test helpers ---
    def inject(self, status: int, body: Any = None, headers: dict[str, str] | None = None, *, method: str | None = None, path_contains: str | None = None, times: int = 1) -> None:
        for _ in range(times):
            self.injected.append(Injected(status, headers or {}, body if body is not None else {"message": "injected"}, method, path_contains))

    def set_pull_files(self, number: int, files: list[dict[str, Any]]) -> None:
        self.files[number] = files

    def add_issue_comment(self, number: int, body: str, login: str = "someone") -> dict[str, Any]:
        return self._new_comment(number, body, login)

    def writes(self) -> list[Recorded]:
        return [r for r in self.requests if r.method in ("POST", "PATCH", "PUT", "DELETE")]

    def _new_comment(self, number: int, body: str, login: str) -> dict[str, Any]:
        self._next_id += 1
        comment = {
            "id": self._next_id,
            "body": body,
            "user": {"login": login, "type": "Bot"},
            "html_url": f"https://github.example/{self.repo}/pull/{number}#issuecomment-{self._next_id}",
        }
        self.issue_comments.setdefault(number, []).append(comment)
        return comment

    # --- HTTP ---
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                split = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(split.query)
                with fake._lock:
                    fake.requests.append(
                        Recorded(self.command, split.path, query, {k.lower(): v for k, v in self.headers.items()}, body)
                    )
                    status, headers, payload = fake._route(self.command, split.path, query, body, self.headers)
                data = b"" if payload is None else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

        return Handler

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: Any, headers: Any) -> tuple[int, dict[str, str], Any]:
        for i, inj in enumerate(self.injected):
            if (inj.method is None or inj.method == method) and (inj.path_contains is None or inj.path_contains in path):
                del self.injected[i]
                return inj.status, inj.headers, inj.body
        if headers.get("Authorization") != f"Bearer {self.token}":
            return 401, {}, {"message": "Bad credentials"}
        if method != "GET" and self.read_only:
            return 403, {}, {"message": "Resource not accessible by integration"}
        prefix = f"/repos/{self.repo}"
        if not path.startswith(prefix + "/"):
            return 404, {}, {"message": "Not Found"}
        rest = path[len(prefix):]
        m = re.fullmatch(r"/issues/(\d+)/comments", rest)
        if m:
            number = int(m.group(1))
            if method == "GET":
                return self._page(self.issue_comments.get(number, []), path, query)
            if method == "POST":
                return 201, {}, self._new_comment(number, body["body"], "github-actions[bot]")
        m = re.fullmatch(r"/(issues|pulls)/comments/(\d+)", rest)
        if m and method == "PATCH":
            kind = self.issue_comments if m.group(1) == "issues" else self.review_comments
            for comments in kind.values():
                for c in comments:
                    if c["id"] == int(m.group(2)):
                        c["body"] = body["body"]
                        return 200, {}, c
            return 404, {}, {"message": "Not Found"}
        m = re.fullmatch(r"/pulls/(\d+)/comments", rest)
        if m and method == "GET":
            return self._page(self.review_comments.get(int(m.group(1)), []), path, query)
        m = re.fullmatch(r"/pulls/(\d+)/files", rest)
        if m and method == "GET":
            return self._page(self.files.get(int(m.group(1)), []), path, query)
        m = re.fullmatch(r"/pulls/(\d+)/reviews", rest)
        if m and method == "POST":
            return self._create_review(int(m.group(1)), body)
        return 404, {}, {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}

    def _create_review(self, number: int, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
        diff = {f["filename"]: _patch_lines(f.get("patch") or "") for f in self.files.get(number, [])}
        comments = body.get("comments") or []
        for c in comments:
            if c.get("line") not in diff.get(c.get("path"), set()) or c.get("side", "RIGHT") != "RIGHT":
                # GitHub rejects the whole review.
                return 422, {}, {
                    "message": "Unprocessable Entity",
                    "errors": ["Pull request review thread line must be part of the diff"],
                    "status": "422",
                }
        self._next_id += 1
        review = {"id": self._next_id, "body": body.get("body"), "event": body.get("event"), "commit_id": body.get("commit_id")}
        self.reviews.setdefault(number, []).append(review)
        for c in comments:
            self._next_id += 1
            self.review_comments.setdefault(number, []).append(
                {"id": self._next_id, "pull_request_review_id": review["id"], **c}
            )
        return 200, {}, review

    def _page(self, items: list[Any], path: str, query: dict[str, list[str]]) -> tuple[int, dict[str, str], Any]:
        per_page = min(int(query.get("per_page", ["30"])[0]), self.per_page_cap)
        page = int(query.get("page", ["1"])[0])
        chunk = items[(page - 1) * per_page: page * per_page]
        headers = {}
        if page * per_page < len(items):
            q = urllib.parse.urlencode({"per_page": per_page, "page": page + 1})
            headers["Link"] = f'<{self.url}{path}?{q}>; rel="next"'
        return 200, headers, chunk


# --- a real pull request: a git repository with base and head commits, and the Actions environment ---

MLP_REFERENCE = '''\
"""Single-device reference: a two-layer MLP and its abstract inputs."""

import jax
import jax.numpy as jnp


def mlp(x, w1, w2):
    return jnp.tanh(x @ w1) @ w2


def inputs():
    f32 = jnp.float32
    return (
        jax.ShapeDtypeStruct((8, 16), f32),
        jax.ShapeDtypeStruct((16, 32), f32),
        jax.ShapeDtypeStruct((32, 16), f32),
    )
'''

MLP_TP = '''\
"""Megatron tensor-parallel MLP: column-parallel w1, row-parallel w2, one psum."""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P


def mlp(x, w1, w2, *, mesh):
    def body(x, w1, w2):
        h = jnp.tanh(x @ w1)
        return jax.lax.psum(h @ w2, "tp")

    return jax.shard_map(
        body, mesh=mesh,
        in_specs=(P(), P(None, "tp"), P("tp", None)),
        out_specs=P(), check_vma=False,
    )(x, w1, w2)
'''

PSUM_LINE = '        return jax.lax.psum(h @ w2, "tp")'
NO_PSUM_LINE = "        return h @ w2  # the psum was dropped"

MANIFEST = """\
version: 1
models:
  - name: mlp-tp
    reference: models/mlp.py:mlp
    distributed: models/mlp_tp.py:mlp
    inputs: models/mlp.py:inputs
    mesh: {tp: 2}
  - name: mlp-tp-edited
    reference: models/mlp.py:mlp
    distributed: models/mlp_tp_edited.py:mlp
    inputs: models/mlp.py:inputs
    mesh: {tp: 2}
"""


@dataclasses.dataclass(frozen=True)
class PrRepo:
    path: Path
    base: str
    head: str
    edited: str = "models/mlp_tp_edited.py"  # the file the pull request changes
    bug_line: int = MLP_TP.splitlines().index(PSUM_LINE) + 1


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def make_pr_repo(root: Path, *, buggy: bool = True) -> PrRepo:
    """Base commit: two correct TP MLPs. Head commit (branch `feature`): mlp_tp_edited.py loses its
    psum on one line (or, with buggy=False, only gets a harmless comment edit)."""
    repo = root / "repo"
    (repo / "models").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.email", "dev@example.invalid")
    _git(repo, "config", "user.name", "dev")
    _git(repo, "config", "commit.gpgsign", "false")
    (repo / "equivci.yaml").write_text(MANIFEST)
    (repo / "models" / "mlp.py").write_text(MLP_REFERENCE)
    (repo / "models" / "mlp_tp.py").write_text(MLP_TP)
    (repo / "models" / "mlp_tp_edited.py").write_text(MLP_TP)
    (repo / ".gitignore").write_text(".equivci/\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "base: tensor-parallel MLPs")
    base = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "-b", "feature")
    new_line = NO_PSUM_LINE if buggy else PSUM_LINE + "  # reduce the partial sums"
    (repo / "models" / "mlp_tp_edited.py").write_text(MLP_TP.replace(PSUM_LINE, new_line))
    _git(repo, "commit", "-q", "-am", "head: edit the TP MLP")
    head = _git(repo, "rev-parse", "HEAD")
    return PrRepo(repo, base, head)


def write_pr_event(path: Path, repo_name: str, number: int, base: str, head: str, head_repo: str | None = None) -> Path:
    event = {
        "action": "synchronize",
        "number": number,
        "pull_request": {
            "number": number,
            "html_url": f"https://github.example/{repo_name}/pull/{number}",
            "base": {"ref": "main", "sha": base, "repo": {"full_name": repo_name}},
            "head": {"ref": "feature", "sha": head, "repo": {"full_name": head_repo or repo_name}},
        },
        "repository": {"full_name": repo_name},
    }
    path.write_text(json.dumps(event))
    return path


def actions_env(tmp: Path, fake: FakeGitHub, event_path: Path | None, *, event_name: str = "pull_request", token: str | None = None) -> dict[str, str]:
    """The standard variables GitHub Actions sets for a step (files created empty, as the runner does)."""
    summary, output = tmp / "step_summary.md", tmp / "github_output.txt"
    summary.touch()
    output.touch()
    (tmp / "runner_temp").mkdir(exist_ok=True)
    env = {
        "GITHUB_ACTIONS": "true",
        "CI": "true",
        "GITHUB_EVENT_NAME": event_name,
        "GITHUB_REPOSITORY": fake.repo,
        "GITHUB_API_URL": fake.url,
        "GITHUB_SERVER_URL": "https://github.example",
        "GITHUB_RUN_ID": "4242",
        "GITHUB_STEP_SUMMARY": str(summary),
        "GITHUB_OUTPUT": str(output),
        "RUNNER_TEMP": str(tmp / "runner_temp"),
        "GITHUB_TOKEN": fake.token if token is None else token,
    }
    if event_path is not None:
        env["GITHUB_EVENT_PATH"] = str(event_path)
    return env


GITHUB_VARS = (
    "GITHUB_ACTIONS", "GITHUB_EVENT_NAME", "GITHUB_EVENT_PATH", "GITHUB_REPOSITORY", "GITHUB_API_URL",
    "GITHUB_SERVER_URL", "GITHUB_RUN_ID", "GITHUB_STEP_SUMMARY", "GITHUB_OUTPUT", "RUNNER_TEMP", "GITHUB_TOKEN",
    "GITHUB_SHA", "GITHUB_WORKSPACE", "INPUT_TOKEN",
)


def read_outputs(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
