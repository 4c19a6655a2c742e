"""Windows proposed by concrete values (equivci/prove/candidates.py): hints that let a proof meet a
device's value from the reference's side; only the proof decides."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import model_package
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "soundness"))

from engine_api import capture, programs_of  # noqa: E402

from equivci.diagnose.numeric import draw_inputs  # noqa: E402
from equivci.prove.candidates import window_candidates  # noqa: E402
from equivci.prove.saturate import MAX_ITERATIONS, saturate, with_hints  # noqa: E402

MANIFEST = Path(__file__).resolve().parents[1] / "soundness" / "near_miss.yaml"


# RoPE from a table over a window of three split dims (batch over dp, sequence over sp, heads over
# tp): the rules lift an op out of windows over one or two dims, not three.
ROPE_3D = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, LEN, S, D, H, K = 2, 64, 8, 8, 4, 4


    def inputs():
        f32 = jnp.float32
        return (jax.ShapeDtypeStruct((B, S, D), f32), jax.ShapeDtypeStruct((D, H, K), f32),
                jax.ShapeDtypeStruct((D, H, K), f32))


    def _table(fn):
        inv = 1.0 / 10_000.0 ** (np.arange(0, K, 2) / K)
        return fn(np.outer(np.arange(LEN), inv)).astype(np.float32)


    def _rotate(q, cos, sin):
        q1, q2 = jnp.split(q, 2, axis=-1)
        cos, sin = cos[:, None, :], sin[:, None, :]
        return jnp.concatenate([q1 * cos - q2 * sin, q1 * sin + q2 * cos], axis=-1)


    def _scores(x, wq, wk, rows, gather=lambda k: k):
        q = _rotate(jnp.einsum("bsd,dhk->bshk", x, wq), *rows)
        k = gather(_rotate(jnp.einsum("bsd,dhk->bshk", x, wk), *rows))
        return jnp.einsum("bqhk,bthk->bhqt", q, k)


    def scores(x, wq, wk):
        return _scores(x, wq, wk, (_table(np.cos)[:S], _table(np.sin)[:S]))


    def scores_dp_sp_tp(x, wq, wk, *, mesh):
        def body(x, wq, wk):
            start = lax.axis_index("sp") * x.shape[1]
            rows = tuple(lax.dynamic_slice_in_dim(jnp.asarray(_table(fn)), start, x.shape[1]) for fn in (np.cos, np.sin))
            return _scores(x, wq, wk, rows, lambda k: lax.all_gather(k, "sp", axis=1, tiled=True))

        return jax.shard_map(body, mesh=mesh, in_specs=(P("dp", "sp"), P(None, "tp"), P(None, "tp")),
                             out_specs=P("dp", "tp", "sp"))(x, wq, wk)
    """
)
ROPE_3D_MANIFEST = """version: 1
models:
  - {name: rope-dp-sp-tp, reference: m.py:scores, distributed: m.py:scores_dp_sp_tp, inputs: m.py:inputs,
     mesh: {dp: 2, sp: 2, tp: 2}}
"""


@pytest.fixture(scope="module")
def rope(tmp_path_factory):
    manifest = model_package.write_package(tmp_path_factory.mktemp("rope3d"), "m.py", ROPE_3D, ROPE_3D_MANIFEST)
    captured = capture(manifest.path, "rope-dp-sp-tp")
    return captured, programs_of(captured)


def test_proposed_windows_complete_a_proof_the_rules_alone_do_not_find(rope):
    captured, programs = rope
    proof = saturate(programs)
    assert not proof.all_proved  # the rotation's windows nest three deep on a device
    hints = window_candidates(programs.reference_events, programs.distributed_events, programs.evaluator,
                              draw_inputs(captured.inputs))
    assert hints and all(t.op in ("slice", "reshape") for t in hints)
    assert with_hints(proof, programs, hints, MAX_ITERATIONS).all_proved


def test_near_miss_proposals_on_a_wrong_window_prove_nothing():
    """q rotated with the table's rows one position late: the values still propose windows (of the
    other values they match), and the proof with them fails."""
    captured = capture(MANIFEST, "rope-table-rows-shifted")
    programs = programs_of(captured)
    hints = window_candidates(programs.reference_events, programs.distributed_events, programs.evaluator,
                              draw_inputs(captured.inputs))
    assert hints
    assert not with_hints(saturate(programs), programs, hints, MAX_ITERATIONS).all_proved
