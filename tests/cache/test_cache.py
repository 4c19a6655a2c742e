"""The memo on its own: keys, canonical texts, the store (CACHEDIR.TAG, atomic writes, corrupt
entries ignored and rebuilt, location-sensitive reuse). No JAX, no capture."""

from __future__ import annotations

import json
from pathlib import Path

from equivci import cache
from equivci.cache import Memo
from equivci.results import Finding, LayerCounts, ModelResult, Status

DATA = Path(__file__).resolve().parents[1] / "data"

VERIFIED = ModelResult("m", Status.VERIFIED, 1.5, LayerCounts(3, 3, 0))
MISMATCH = ModelResult(
    "m", Status.MISMATCH, 2.0, LayerCounts(1, 0, 0),
    (Finding("models/tp.py", 12, "error", "layers_0", "missing psum", op="dot.3"),),
)


def test_key_is_length_prefixed_and_stable() -> None:
    assert cache.key("ab", "c") != cache.key("a", "bc")
    assert cache.key("x", b"y") == cache.key("x", "y")
    assert len(cache.key()) == 64


def test_fingerprint_covers_versions_and_is_cached() -> None:
    assert cache.fingerprint() == cache.fingerprint()
    assert len(cache.fingerprint()) == 64


def test_canonical_mlir_strips_lines_keeps_names(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    a = f'%0 = stablehlo.tanh %arg0 : tensor<8xf32> loc(#loc3)\n#loc1 = loc("{root}/m.py":12:8 to :20)\n#loc3 = loc("jit(f)/layers_0/tanh"(#loc1))\n'
    b = a.replace(":12:8 to :20", ":14:8 to :20")
    c = a.replace("layers_0", "layers_1")
    assert cache.canonical_mlir(a, root) == cache.canonical_mlir(b, root)
    assert cache.canonical_mlir(a, root) != cache.canonical_mlir(c, root)
    assert cache.location_digest([a], root) != cache.location_digest([b], root)
    assert cache.repository_files(cache.named_files([a]), root) == ["m.py"]


def test_source_files_keep_repository_files_only(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    text = f'FileNames\n1 "<frozen runpy>"\n2 "/usr/lib/python3/x.py"\n3 "{root}/pkg/a.py"\n\nFunctionNames\n1 "f"\n'
    extra = [str(root / "pkg" / "b.py"), "/elsewhere/c.py"]
    assert cache.repository_files([*cache.named_files([text]), *extra], root) == ["pkg/a.py", "pkg/b.py"]


def test_store_roundtrip_writes_cachedir_tag_atomically(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    m = Memo(folder)
    k = cache.key("content")
    m.put_result(k, MISMATCH, loc_digest="L1")
    assert (folder / "CACHEDIR.TAG").read_text().startswith("Signature: 8a477f597d28d172789f06886806bc55")
    assert not [p for p in folder.rglob("*.tmp")]
    fresh = Memo(folder)  # a new run reads it from disk
    assert fresh.result(k, "L1") == MISMATCH
    assert fresh.known_results() == {k: "L1"}


def test_findings_with_lines_need_the_same_locations(tmp_path: Path) -> None:
    m = Memo(tmp_path / "cache")
    m.put_result("a" * 64, MISMATCH, loc_digest="L1")
    m.put_result("b" * 64, VERIFIED, loc_digest="L1")
    assert Memo(tmp_path / "cache").result("a" * 64, "L2") is None  # lines may have moved: recompute
    assert Memo(tmp_path / "cache").result("b" * 64, "L2") == VERIFIED  # no lines to get wrong


def test_corrupt_entries_are_ignored_and_rebuilt(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    m = Memo(folder)
    keys = [cache.key(str(i)) for i in range(5)]
    for k in keys:
        m.put_result(k, VERIFIED, "L")
    paths = [m.path("results", k) for k in keys]
    paths[0].write_bytes(b"\x00\xff garbage")
    paths[1].write_text(paths[1].read_text()[:20])  # truncated
    doc = json.loads(paths[2].read_text())
    paths[3].write_text(json.dumps({**doc, "format": 999}))  # another format
    paths[2].write_text(json.dumps({**doc, "key": keys[4]}))  # a file under the wrong name
    doc4 = json.loads(paths[4].read_text())
    doc4["payload"]["result"]["status"] = "bogus"
    paths[4].write_text(json.dumps(doc4))
    fresh = Memo(folder)
    assert [fresh.result(k, "L") for k in keys] == [None] * 5
    assert len(fresh.ignored) == 5
    fresh.put_result(keys[0], VERIFIED, "L")
    assert Memo(folder).result(keys[0], "L") == VERIFIED


def test_no_cache_memo_writes_nothing_but_remembers_the_run(tmp_path: Path) -> None:
    m = Memo(None)
    m.put_result("c" * 64, VERIFIED, "L")
    assert m.result("c" * 64, "L") == VERIFIED
    assert list(tmp_path.iterdir()) == []


def test_last_capture_record(tmp_path: Path) -> None:
    m = Memo(tmp_path / "cache")
    assert m.last_capture("equivci.yaml", "mlp") is None
    m.record_capture("equivci.yaml", "mlp", {"key": "k", "sources": ["a.py"]})
    assert Memo(tmp_path / "cache").last_capture("equivci.yaml", "mlp")["sources"] == ["a.py"]
    assert Memo(tmp_path / "cache").last_capture("other.yaml", "mlp") is None


def test_repository_files_resolve_linked_folders_and_files(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("")
    (root / "pkg" / "b.py").write_text("")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "c.py").write_text("")
    (tmp_path / "alias").symlink_to(root / "pkg")  # a linked folder into the repository
    (tmp_path / "outside" / "d.py").symlink_to(root / "pkg" / "b.py")  # a linked file
    (root / "link.py").symlink_to(tmp_path / "outside" / "c.py")  # a file in the repository linking out
    paths = [str(tmp_path / "alias" / "a.py"), str(tmp_path / "outside" / "d.py"), str(tmp_path / "outside" / "c.py"),
             str(root / "link.py"), str(root / "pkg" / ".." / "pkg" / "a.py"), "relative.py", "<frozen runpy>",
             str(root / ".equivci" / "cache" / "x.py")]
    assert cache.repository_files(paths, root) == ["pkg/a.py", "pkg/b.py"]
    assert cache.repository_files(paths, tmp_path / "alias" / "..") == ["pkg/a.py", "pkg/b.py"]  # the root is resolved too


def test_program_keys_roundtrip_and_malformed_entries_are_ignored(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    m = Memo(folder)
    m.put_program_keys("p" * 64, "c" * 64, "L", ["/repo/m.py"])
    assert Memo(folder).program_keys("p" * 64) == {"content_key": "c" * 64, "loc_digest": "L", "files": ["/repo/m.py"]}
    assert Memo(folder).program_keys("q" * 64) is None
    for bad in ({"content_key": 1, "loc_digest": "L", "files": []}, {"content_key": "c", "loc_digest": "L"},
                {"content_key": "c", "loc_digest": "L", "files": [3]}, ["not", "a", "dict"]):
        m.put("programs", "r" * 64, bad)
        fresh = Memo(folder)
        assert fresh.program_keys("r" * 64) is None and fresh.ignored == [fresh.path("programs", "r" * 64)]
