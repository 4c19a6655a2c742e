"""Which frame of an op made inside a library a finding lands on.

JAX leaves its own frames out of an op's stack, so the frames outside the repository are a
library's. Through an adapter line the reference runs too, the distributed program differs only
in how it reaches the adapter: the outermost of its own frames. Elsewhere nothing moves.
"""

from __future__ import annotations

from equivci.diagnose.frames import library_call
from equivci.hlo.ir import Instruction, SourceLoc


def op(*frames: SourceLoc) -> Instruction:
    return Instruction("add.1", "add", None, (), {}, stack=frames)  # type: ignore[arg-type]


def test_through_a_shared_adapter_the_distributed_call_chain_start_leads(tmp_path):
    lib = SourceLoc("/usr/lib/python3/site-packages/lib/layers.py", 10, "apply")
    adapter = SourceLoc(str(tmp_path / "adapter.py"), 5, "forward")
    body = SourceLoc(str(tmp_path / "dist.py"), 20, "body")
    entry = SourceLoc(str(tmp_path / "dist.py"), 40, "variant")
    shared = frozenset({(adapter.file, adapter.line), (str(tmp_path / "ref.py"), 3)})
    assert library_call(op(lib, adapter, body, entry), str(tmp_path), shared) == (adapter, lib, entry)


def test_repository_code_run_by_the_library_moves_too(tmp_path):
    # A layer of the repository's own, which the library calls back while the adapter runs.
    own_layer = SourceLoc(str(tmp_path / "adapter.py"), 30, "__call__")
    lib = SourceLoc("/opt/site-packages/lib/combinators.py", 61, "__call__")
    adapter = SourceLoc(str(tmp_path / "adapter.py"), 5, "forward")
    entry = SourceLoc(str(tmp_path / "dist.py"), 40, "variant")
    shared = frozenset({(adapter.file, adapter.line)})
    assert library_call(op(own_layer, lib, adapter, entry), str(tmp_path), shared) == (adapter, lib, entry)


def test_a_distributed_only_call_into_the_library_stays(tmp_path):
    lib = SourceLoc("/opt/site-packages/lib/layers.py", 10, "apply")
    call = SourceLoc(str(tmp_path / "dist.py"), 20, "body")
    entry = SourceLoc(str(tmp_path / "dist.py"), 40, "variant")
    assert library_call(op(lib, call, entry), str(tmp_path), frozenset()) is None


def test_a_shared_helper_without_a_library_stays(tmp_path):
    helper = SourceLoc(str(tmp_path / "common.py"), 7, "rms_norm")
    body = SourceLoc(str(tmp_path / "dist.py"), 20, "body")
    shared = frozenset({(helper.file, helper.line)})
    assert library_call(op(helper, body), str(tmp_path), shared) is None
