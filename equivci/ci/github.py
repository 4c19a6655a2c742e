"""A small GitHub REST client on the standard library (urllib), and the few calls equivci makes.

- Works against github.com, GitHub Enterprise Server (`GITHUB_API_URL=https://HOST/api/v3`) and any
  stand-in server: every URL is built from the configured API root.
- Every request has a timeout. 429, 5xx, connection errors and rate-limit 403s are retried with
  exponential backoff, honoring `Retry-After` and `X-RateLimit-Reset`.
- Lists are paginated by following the `Link: <...>; rel="next"` header, only to the same origin, so
  the token is never sent to another host.
- The token is never printed: it is not part of any message, repr or exception, and is redacted
  from error bodies just in case.
"""

from __future__ import annotations

import dataclasses
import email.utils
import json
import random
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

from equivci import __version__

DEFAULT_API_URL = "https://api.github.com"
USER_AGENT = f"equivci/{__version__}"

_LINK_RE = re.compile(r'<([^>]+)>\s*;\s*rel="?([^";]+)"?')


class GitHubError(Exception):
    """An HTTP error from the API (after retries), or a transport failure (status 0)."""

    def __init__(self, method: str, path: str, status: int, message: str, headers: dict[str, str] | None = None):
        self.method = method
        self.path = path
        self.status = status
        self.message = message
        self.headers = headers or {}
        super().__init__(f"{method} {path}: HTTP {status}: {message}" if status else f"{method} {path}: {message}")

    @property
    def forbidden(self) -> bool:
        """A permission refusal (read-only token, e.g. a pull request from a fork), not a rate limit."""
        return self.status == 403

    @property
    def unprocessable(self) -> bool:
        return self.status == 422


@dataclasses.dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]  # lower-case names
    data: Any  # decoded JSON, or None for an empty body

    def next_url(self) -> str | None:
        return parse_link_header(self.headers.get("link", "")).get("next")


def parse_link_header(value: str) -> dict[str, str]:
    """`<url1>; rel="next", <url2>; rel="last"` -> {"next": url1, "last": url2}."""
    links: dict[str, str] = {}
    for url, rels in _LINK_RE.findall(value or ""):
        for rel in rels.split():
            links.setdefault(rel, url)
    return links


def _error_message(body: bytes) -> str:
    try:
        doc = json.loads(body.decode("utf-8", "replace"))
    except ValueError:
        text = body.decode("utf-8", "replace").strip()
        return text[:300] or "no message"
    if isinstance(doc, dict):
        message = str(doc.get("message") or "no message")
        errors = doc.get("errors")
        if errors:
            details = [e if isinstance(e, str) else e.get("message") or json.dumps(e) for e in errors]
            message += " (" + "; ".join(str(d) for d in details) + ")"
        return message
    return str(doc)[:300]


def is_rate_limited(status: int, headers: dict[str, str], message: str) -> bool:
    """GitHub answers primary rate limits with 403/429 and X-RateLimit-Remaining: 0, secondary ones
    with 403/429 and Retry-After or a message naming the rate limit."""
    if status == 429:
        return True
    if status != 403:
        return False
    return headers.get("x-ratelimit-remaining") == "0" or "retry-after" in headers or "rate limit" in message.lower()


def retry_delay(headers: dict[str, str], attempt: int, backoff: float, now: float | None = None) -> float:
    """Seconds to wait before retry number `attempt` (0-based)."""
    retry_after = headers.get("retry-after")
    if retry_after:
        try:
            return max(0.0, float(retry_after))
        except ValueError:
            parsed = email.utils.parsedate_to_datetime(retry_after) if retry_after else None
            if parsed is not None:
                return max(0.0, parsed.timestamp() - (time.time() if now is None else now))
    if headers.get("x-ratelimit-remaining") == "0" and headers.get("x-ratelimit-reset"):
        try:
            reset = float(headers["x-ratelimit-reset"])
        except ValueError:
            pass
        else:
            return max(0.0, reset - (time.time() if now is None else now)) + 1.0
    return backoff * (2**attempt) * (1.0 + 0.25 * random.random())


class GitHubClient:
    def __init__(
        self,
        api_url: str | None,
        token: str | None,
        *,
        timeout: float = 20.0,
        max_retries: int = 4,
        backoff: float = 1.0,
        max_delay: float = 120.0,
        sleep: Callable[[float], None] = time.sleep,
        log: Callable[[str], None] | None = None,
    ):
        self.api_url = (api_url or DEFAULT_API_URL).rstrip("/")
        self._token = token or None
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_delay = max_delay
        self._sleep = sleep
        self._log = log or (lambda _msg: None)
        self._origin = urllib.parse.urlsplit(self.api_url)[:2]

    def __repr__(self) -> str:  # never shows the token
        return f"GitHubClient({self.api_url!r}, token={'***' if self._token else None})"

    def _redact(self, text: str) -> str:
        return text.replace(self._token, "***") if self._token else text

    def _url(self, path_or_url: str, params: dict[str, Any] | None) -> str:
        if path_or_url.startswith(("http://", "https://")):
            url = path_or_url
            if urllib.parse.urlsplit(url)[:2] != self._origin:
                raise GitHubError(
                    "GET", urllib.parse.urlsplit(url).path, 0, "refusing to follow a link to another host"
                )
        else:
            url = self.api_url + "/" + path_or_url.lstrip("/")
        if params:
            url += ("&" if "?" in url else "?") + urllib.parse.urlencode(params)
        return url

    def request(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None) -> Response:
        url = self._url(path, params)
        shown = urllib.parse.urlsplit(url).path  # for messages: no query, no host, no token
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):  # retrying cannot help
            raise GitHubError(method, shown, 0, self._redact(f"GITHUB_API_URL={self.api_url!r} is not an http(s) URL"))
        data = None if body is None else json.dumps(body).encode("utf-8")
        headers = {
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": "2022-11-28",
            "User-Agent": USER_AGENT,
        }
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        attempt = 0
        while True:
            try:
                req = urllib.request.Request(url, data=data, method=method, headers=headers)
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    raw = resp.read()
                    resp_headers = {k.lower(): v for k, v in resp.headers.items()}
                    try:
                        data = json.loads(raw) if raw.strip() else None
                    except ValueError:
                        raise GitHubError(
                            method,
                            shown,
                            resp.status,
                            f"the answer is not JSON (is GITHUB_API_URL={self.api_url} the API?)",
                        ) from None
                    return Response(resp.status, resp_headers, data)
            except urllib.error.HTTPError as exc:
                resp_headers = {k.lower(): v for k, v in (exc.headers or {}).items()}
                raw = exc.read() or b""
                message = self._redact(_error_message(raw))
                status = exc.code
                retryable = status >= 500 or is_rate_limited(status, resp_headers, message)
                error = GitHubError(method, shown, status, message, resp_headers)
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                resp_headers = {}
                retryable = True
                error = GitHubError(method, shown, 0, self._redact(f"cannot reach {self.api_url}: {reason}"))
            except ValueError as exc:  # a URL urllib cannot use (say, a bad port): retrying cannot help
                raise GitHubError(method, shown, 0, self._redact(f"GITHUB_API_URL={self.api_url!r}: {exc}")) from None
            if not retryable or attempt >= self.max_retries:
                raise error
            delay = min(self.max_delay, retry_delay(resp_headers, attempt, self.backoff))
            self._log(f"equivci: {error}; retrying in {delay:.1f} s ({attempt + 1}/{self.max_retries})")
            self._sleep(delay)
            attempt += 1

    def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        return self.request("GET", path, params=params).data

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body=body).data

    def patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body=body).data

    def paginate(self, path: str, params: dict[str, Any] | None = None, max_pages: int = 100) -> Iterator[Any]:
        """Every item of a list endpoint, following Link rel="next" (per_page=100 unless given)."""
        params = {"per_page": 100, **(params or {})}
        resp = self.request("GET", path, params=params)
        pages = 1
        while True:
            items = resp.data or []
            if isinstance(items, dict):  # a few endpoints wrap the list; none used here, but be lenient
                items = next((v for v in items.values() if isinstance(v, list)), [])
            yield from items
            nxt = resp.next_url()
            if not nxt or pages >= max_pages:
                return
            resp = self.request("GET", nxt)
            pages += 1


# --- the calls equivci makes ----------------------------------------------------------------------


def find_comment(client: GitHubClient, repo: str, number: int, marker: str) -> dict[str, Any] | None:
    """The first issue comment on the pull request whose body contains the hidden marker."""
    for comment in client.paginate(f"/repos/{repo}/issues/{number}/comments"):
        if marker in (comment.get("body") or ""):
            return comment
    return None


def upsert_comment(
    client: GitHubClient, repo: str, number: int, marker: str, body: str, *, create: bool = True
) -> tuple[str, dict[str, Any] | None]:
    """Edit the sticky comment in place, or create it the first time (unless `create` is false):
    ("updated" | "created" | "skipped", comment)."""
    existing = find_comment(client, repo, number, marker)
    if existing is not None:
        return "updated", client.patch(f"/repos/{repo}/issues/comments/{existing['id']}", {"body": body})
    if not create:
        return "skipped", None
    return "created", client.post(f"/repos/{repo}/issues/{number}/comments", {"body": body})


def review_comment_bodies(client: GitHubClient, repo: str, number: int) -> list[dict[str, Any]]:
    """Existing review (line) comments of the pull request."""
    return list(client.paginate(f"/repos/{repo}/pulls/{number}/comments"))


def edit_review_comment(client: GitHubClient, repo: str, comment_id: int, body: str) -> dict[str, Any]:
    return client.patch(f"/repos/{repo}/pulls/comments/{comment_id}", {"body": body})


def pull_files(client: GitHubClient, repo: str, number: int) -> list[dict[str, Any]]:
    return list(client.paginate(f"/repos/{repo}/pulls/{number}/files"))


def create_review(
    client: GitHubClient, repo: str, number: int, commit_id: str | None, body: str, comments: list[dict[str, Any]]
) -> dict[str, Any]:
    payload: dict[str, Any] = {"event": "COMMENT", "body": body, "comments": comments}
    if commit_id:
        payload["commit_id"] = commit_id
    return client.post(f"/repos/{repo}/pulls/{number}/reviews", payload)
