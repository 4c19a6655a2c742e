"""A ring whose ppermute lacks its wrap-around pair: the device no pair sends to receives zeros, and
sent along the chain closed into a ring every output would be the reference's. The finding is the
line that writes the pairs, also when they reach the ppermute as an argument of the factory that
built the step (a closure run later by shard_map: the factory's call is on no op's stack).

Two styles: a ring of pipeline stages inside a fori_loop, and a ring shift of sequence blocks (each
device takes its left neighbour's block, `jnp.roll` in the reference). Near misses: the closed rings
verify."""

from __future__ import annotations

import textwrap

import pytest
from model_package import line_of, verify_named, write_package

from equivci.diagnose.localize import alternative_pairs
from equivci.results import Status

MODEL = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    S, D, MB = 4, 8, 2


    def ring_inputs():
        f = jnp.float32
        return jax.ShapeDtypeStruct((2 * S, D, D), f), jax.ShapeDtypeStruct((S * MB, D), f)


    def stack(w, x):
        for k in range(w.shape[0]):
            x = jnp.tanh(x @ w[k])
        return x


    def _circular(ring):
        def stage_fn(w, x):
            s = lax.axis_index("pp")
            micro = x.reshape(S, MB, D)

            def tick(t, carry):
                state, outputs = carry
                r = jnp.clip((t - s) // S, 0, 1)
                inp = jnp.where((s == 0) & (t < S), micro[jnp.minimum(t, S - 1)], state)
                y = jnp.tanh(inp @ w[r, 0])
                done = (s == S - 1) & (t - s >= S) & (t - s < 2 * S)
                outputs = jnp.where(done, lax.dynamic_update_index_in_dim(outputs, y, (t - s) % S, 0), outputs)
                return lax.ppermute(y, "pp", ring), outputs

            init = lax.pcast((jnp.zeros((MB, D)), jnp.zeros((S, MB, D))), "pp", to="varying")
            _, outputs = lax.fori_loop(0, 3 * S - 1, tick, init)
            return lax.psum(outputs, "pp").reshape(S * MB, D)
        return stage_fn


    def _run(stage_fn, w, x, mesh):
        w = w.reshape(2, S, D, D)
        return jax.shard_map(stage_fn, mesh=mesh, in_specs=(P(None, "pp"), P()), out_specs=P())(w, x)


    def stack_ring(w, x, *, mesh):
        ring = [(i, (i + 1) % S) for i in range(S)]
        return _run(_circular(ring), w, x, mesh)


    def stack_chain(w, x, *, mesh):
        ring = [(i, i + 1) for i in range(S - 1)]  # MARK:chain
        return _run(_circular(ring), w, x, mesh)


    def shift_inputs():
        return (jax.ShapeDtypeStruct((16, 4), jnp.float32),)


    def shifted(x):
        return jnp.roll(x, 4, axis=0) * 2.0


    def shifted_ring(x, *, mesh):
        def body(x):
            return lax.ppermute(x, "sp", [(i, (i + 1) % 4) for i in range(4)]) * 2.0
        return jax.shard_map(body, mesh=mesh, in_specs=P("sp"), out_specs=P("sp"))(x)


    def shifted_chain(x, *, mesh):
        def body(x):
            return lax.ppermute(x, "sp", [(i, i + 1) for i in range(3)]) * 2.0  # MARK:shift_chain
        return jax.shard_map(body, mesh=mesh, in_specs=P("sp"), out_specs=P("sp"))(x)
    """
).lstrip()

_RING = "reference: model.py:stack, inputs: model.py:ring_inputs, mesh: {pp: 4}"
_SHIFT = "reference: model.py:shifted, inputs: model.py:shift_inputs, mesh: {sp: 4}"
MANIFEST = (
    "version: 1\nmodels:\n"
    + "".join(f"  - {{name: {n}, distributed: model.py:{n}, {_RING}}}\n" for n in ("stack_ring", "stack_chain"))
    + "".join(f"  - {{name: {n}, distributed: model.py:{n}, {_SHIFT}}}\n" for n in ("shifted_ring", "shifted_chain"))
)


def test_a_chain_is_offered_closed_into_a_ring():
    chain = [(0, 1), (1, 2), (2, 3)]
    assert [(0, 1), (1, 2), (2, 3), (3, 0)] in alternative_pairs(chain)
    # Two chains (one per group of a 2-D mesh) close each into its own ring.
    two = [(0, 1), (1, 2), (4, 5), (5, 6)]
    assert [(0, 1), (1, 2), (2, 0), (4, 5), (5, 6), (6, 4)] in alternative_pairs(two)


def test_a_ring_is_not_offered_a_pair_it_has():
    ring = [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert all(set(candidate) != set(ring) for candidate in alternative_pairs(ring))


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("ring_pairs"), "model.py", MODEL, MANIFEST)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["stack_ring", "shifted_ring"])
def test_near_miss_the_closed_rings_verify(manifest, name):
    assert verify_named(manifest, name).status == Status.VERIFIED


@pytest.mark.slow
@pytest.mark.parametrize(("name", "mark"), [("stack_chain", "chain"), ("shifted_chain", "shift_chain")])
def test_a_ring_without_its_wrap_pair_blames_the_pairs(manifest, name, mark):
    result = verify_named(manifest, name)
    assert result.status == Status.MISMATCH
    lead = result.findings[0]
    assert (lead.path, lead.line) == ("model.py", line_of(MODEL, mark)), result.findings
    assert "{3->0}" in lead.message and "wrap-around pair" in lead.message, lead.message
