"""The REST client against a real local HTTP server: retries, backoff headers, pagination, secrecy."""

from __future__ import annotations

import time

import pytest
from fake_github import FakeGitHub

from equivci.ci import github
from equivci.ci.github import GitHubClient, GitHubError, parse_link_header, retry_delay

TOKEN = "ghs_fake_token_0123456789"


@pytest.fixture
def fake():
    with FakeGitHub(token=TOKEN) as server:
        yield server


def client_for(fake: FakeGitHub, sleeps: list[float], logs: list[str] | None = None, **kw) -> GitHubClient:
    return GitHubClient(fake.url, TOKEN, sleep=sleeps.append, log=(logs.append if logs is not None else None), timeout=5, **kw)


def test_sends_token_and_api_headers(fake):
    sleeps: list[float] = []
    client = client_for(fake, sleeps)
    created = client.post(f"/repos/{fake.repo}/issues/7/comments", {"body": "hi"})
    assert created["body"] == "hi"
    req = fake.requests[-1]
    assert req.headers["authorization"] == f"Bearer {TOKEN}"
    assert req.headers["accept"] == "application/vnd.github+json"
    assert req.headers["x-github-api-version"] == "2022-11-28"
    assert req.headers["user-agent"].startswith("equivci/")
    assert sleeps == []


def test_api_root_with_path_prefix_like_enterprise(fake):
    # GHES serves the API under /api/v3; the client must keep the prefix.
    client = GitHubClient(fake.url + "/api/v3/", TOKEN, sleep=lambda s: None)
    with pytest.raises(GitHubError) as info:
        client.get("/repos/octo/widgets/issues/1/comments")
    assert fake.requests[-1].path == "/api/v3/repos/octo/widgets/issues/1/comments"
    assert info.value.status == 404


def test_retries_429_honoring_retry_after(fake):
    fake.inject(429, {"message": "slow down"}, {"Retry-After": "7"})
    sleeps: list[float] = []
    logs: list[str] = []
    client = client_for(fake, sleeps, logs)
    assert client.get(f"/repos/{fake.repo}/issues/1/comments") == []
    assert sleeps == [7.0]
    assert len(fake.requests) == 2
    assert "HTTP 429" in logs[0] and "retrying in 7.0 s" in logs[0]


def test_retries_5xx_with_exponential_backoff(fake):
    fake.inject(502, {"message": "bad gateway"}, times=2)
    fake.inject(503, {"message": "unavailable"})
    sleeps: list[float] = []
    client = client_for(fake, sleeps, backoff=0.5)
    assert client.get(f"/repos/{fake.repo}/issues/1/comments") == []
    assert len(sleeps) == 3
    # 0.5, 1, 2 seconds, each with at most 25 % jitter
    for got, base in zip(sleeps, (0.5, 1.0, 2.0)):
        assert base <= got <= base * 1.25


def test_rate_limit_403_waits_until_reset(fake):
    reset = int(time.time()) + 30
    fake.inject(403, {"message": "API rate limit exceeded for installation"}, {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(reset)})
    sleeps: list[float] = []
    client = client_for(fake, sleeps)
    client.get(f"/repos/{fake.repo}/issues/1/comments")
    assert len(sleeps) == 1 and 25 <= sleeps[0] <= 33


def test_secondary_rate_limit_403_is_retried(fake):
    fake.inject(403, {"message": "You have exceeded a secondary rate limit"}, {"Retry-After": "3"})
    sleeps: list[float] = []
    client_for(fake, sleeps).post(f"/repos/{fake.repo}/issues/1/comments", {"body": "x"})
    assert sleeps == [3.0]
    assert len(fake.issue_comments[1]) == 1


def test_permission_403_is_not_retried(fake):
    fake.read_only = True
    sleeps: list[float] = []
    with pytest.raises(GitHubError) as info:
        client_for(fake, sleeps).post(f"/repos/{fake.repo}/issues/1/comments", {"body": "x"})
    assert info.value.forbidden and info.value.status == 403
    assert "Resource not accessible by integration" in str(info.value)
    assert sleeps == [] and len(fake.requests) == 1


def test_gives_up_after_max_retries(fake):
    fake.inject(500, {"message": "boom"}, times=10)
    sleeps: list[float] = []
    with pytest.raises(GitHubError) as info:
        client_for(fake, sleeps, max_retries=2).get(f"/repos/{fake.repo}/issues/1/comments")
    assert info.value.status == 500 and len(sleeps) == 2 and len(fake.requests) == 3


def test_422_is_not_retried_and_carries_github_errors(fake):
    fake.set_pull_files(3, [{"filename": "a.py", "status": "modified", "patch": "@@ -1,1 +1,1 @@\n-x\n+y"}])
    sleeps: list[float] = []
    with pytest.raises(GitHubError) as info:
        github.create_review(client_for(fake, sleeps), fake.repo, 3, "abc", "b", [{"path": "a.py", "line": 9, "side": "RIGHT", "body": "no"}])
    assert info.value.unprocessable
    assert "must be part of the diff" in info.value.message
    assert sleeps == []


def test_connection_errors_are_retried_then_reported_without_token():
    sleeps: list[float] = []
    client = GitHubClient("http://127.0.0.1:9", TOKEN, sleep=sleeps.append, max_retries=1, timeout=2)
    with pytest.raises(GitHubError) as info:
        client.get("/repos/o/r/issues/1/comments")
    assert info.value.status == 0 and len(sleeps) == 1
    assert TOKEN not in str(info.value)


def test_timeout_is_applied():
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # accepts the connection but never answers
    try:
        client = GitHubClient(f"http://127.0.0.1:{listener.getsockname()[1]}", TOKEN, sleep=lambda s: None, max_retries=0, timeout=0.5)
        t0 = time.monotonic()
        with pytest.raises(GitHubError):
            client.get("/x")
        assert time.monotonic() - t0 < 5
    finally:
        listener.close()


def test_pagination_follows_link_header(fake):
    fake.per_page_cap = 2
    for i in range(5):
        fake.add_issue_comment(4, f"comment {i}")
    client = client_for(fake, [])
    bodies = [c["body"] for c in client.paginate(f"/repos/{fake.repo}/issues/4/comments")]
    assert bodies == [f"comment {i}" for i in range(5)]
    pages = [r for r in fake.requests if r.path.endswith("/issues/4/comments")]
    assert len(pages) == 3
    assert pages[0].query["per_page"] == ["100"]


def test_pagination_refuses_links_to_other_hosts(fake):
    client = client_for(fake, [])
    with pytest.raises(GitHubError, match="another host"):
        client.request("GET", "https://evil.example/steal")
    assert fake.requests == []


def test_token_never_in_repr_or_errors(fake):
    # An error body echoing the token must not leak it.
    fake.inject(400, {"message": f"bad header Bearer {TOKEN}"})
    client = client_for(fake, [])
    assert TOKEN not in repr(client)
    with pytest.raises(GitHubError) as info:
        client.get("/repos/x/y")
    assert TOKEN not in str(info.value) and "***" in str(info.value)


def test_sticky_comment_upsert_edits_in_place(fake):
    client = client_for(fake, [])
    fake.add_issue_comment(9, "unrelated")
    action, first = github.upsert_comment(client, fake.repo, 9, "<!-- m -->", "<!-- m -->\nv1")
    assert action == "created"
    action, second = github.upsert_comment(client, fake.repo, 9, "<!-- m -->", "<!-- m -->\nv2")
    assert action == "updated" and second["id"] == first["id"]
    assert [c["body"] for c in fake.issue_comments[9]] == ["unrelated", "<!-- m -->\nv2"]


def test_parse_link_header_and_retry_delay_forms():
    links = parse_link_header('<https://a/x?page=2>; rel="next", <https://a/x?page=9>; rel="last"')
    assert links == {"next": "https://a/x?page=2", "last": "https://a/x?page=9"}
    assert retry_delay({"retry-after": "4"}, 3, 1.0) == 4.0
    assert retry_delay({"x-ratelimit-remaining": "0", "x-ratelimit-reset": "1010"}, 0, 1.0, now=1000) == 11.0
    assert retry_delay({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0, 1.0) == 0.0  # in the past
