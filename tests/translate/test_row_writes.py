"""An overwriting scatter of one window per row at a data position, as a select (row_writes.py):

    x.at[arange(B), c].set(u)[b, w, ...] = u[b, ...] if c[b] == w else x[b, w, ...]

for every c (a c outside the dim writes nothing, as no w equals it; a negative one is wrapped by
JAX's own index arithmetic first). Checked against XLA on four styles (the `.at[rows, c]` write, the
same with a free dim between rows and c, a vmapped `dynamic_update_slice` whose clamp stays where c
may leave the dim, also where c's bounds are wider than the dim, and c out of range; an add is no
select), and end to end: a ring-buffer cache written at `pos % W` on
batch shards (local row numbers) verifies against the reference's write, against a write spelled
as `where(arange(W) == slot, u, cache)` and against a vmapped `dynamic_update_slice` (its clamp
dropped: `pos % W` is in [0, W), bounds.bound_enumerated); the slot one later, `pos % (W - 1)` and rows out of order
are `mismatch`.
"""

from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import model_package
import numpy as np
import pytest
from jax import lax
from model_package import verify_named as _verify
from one_device import op_names as _ops
from one_device import programs as _programs

from equivci.results import Status
from equivci.terms.semantics import evaluate

RNG = np.random.default_rng(13)
CACHE = RNG.standard_normal((4, 5, 3)).astype(np.float32)
NEW = RNG.standard_normal((4, 3)).astype(np.float32)


def _dus(c, u, s):
    return lax.dynamic_update_slice(c, u[None], (s, 0))


STYLES = {
    "at-rows": (lambda c, u, s: c.at[jnp.arange(4), s].set(u), CACHE),
    "at-rows-free-dim-between": (lambda c, u, s: c.at[jnp.arange(4), :, s].set(u), CACHE.transpose(0, 2, 1).copy()),
    "vmapped-dynamic-update": (lambda c, u, s: jax.vmap(_dus)(c, u, s), CACHE),
    # s % 8 is in [0, 8): the clamp into [0, 4] stays
    "vmapped-dynamic-update-of-modulus": (lambda c, u, s: jax.vmap(_dus)(c, u, s % 8), CACHE),
}
SLOTS = {"inside": np.array([0, 4, 2, 2], np.int32), "outside": np.array([-1, 5, 7, -6], np.int32)}


@pytest.mark.parametrize("slots", SLOTS)
@pytest.mark.parametrize("style", STYLES)
def test_a_row_write_is_a_select_and_computes_what_xla_computes(style, slots) -> None:
    fn, cache = STYLES[style]
    args = (cache, NEW, SLOTS[slots])
    programs, want, _ = _programs(fn, args)
    out = programs.reference_outputs[0]
    assert "opaque" not in _ops(out) and "ternary" in _ops(out), _ops(out)
    np.testing.assert_array_equal(evaluate(out, dict(enumerate(args)), programs.evaluator.values), want)


def test_a_row_add_is_no_select() -> None:
    """A scatter that adds its updates keeps what x holds there: no overwrite."""
    args = (CACHE, NEW, SLOTS["inside"])
    programs, _, _ = _programs(lambda c, u, s: c.at[jnp.arange(4), s].add(u), args)
    assert programs.reference_outputs[0].op == "opaque"


def test_rows_out_of_order_are_no_row_write() -> None:
    """Rows written at a permutation of their positions are no select of the rows' own values."""
    args = (CACHE, NEW, SLOTS["inside"])
    programs, _, _ = _programs(lambda c, u, s: c.at[jnp.array([1, 0, 2, 3]), s].set(u), args)
    assert "opaque" in _ops(programs.reference_outputs[0])


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    B, W, D, E = 8, 4, 8, 8


    def inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
        return f(B, W, E), f(B, D), f(D, E), jax.ShapeDtypeStruct((B,), jnp.int32)


    def _read(cache, x):
        return jnp.einsum("bwe,bd->bw", cache, x)


    def ring_write(cache, x, w, pos):
        cache = cache.at[jnp.arange(B), pos % W].set(jnp.tanh(x @ w))
        return cache, _read(cache, x)


    def _sharded(write):
        def run(cache, x, w, pos, *, mesh):
            def body(cache, x, w, pos):
                cache = write(cache, jnp.tanh(x @ w), pos)
                return cache, _read(cache, x)

            specs = (P("dp"), P("dp"), P(), P("dp"))
            return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=(P("dp"), P("dp")))(cache, x, w, pos)

        return run


    def _where(c, u, slot):
        return jnp.where((jnp.arange(W)[None, :] == slot[:, None])[:, :, None], u[:, None, :], c)


    def _vmapped(c, u, slot):
        return jax.vmap(lambda c, u, s: jax.lax.dynamic_update_slice(c, u[None], (s, 0)))(c, u, slot)


    at_rows = _sharded(lambda c, u, pos: c.at[jnp.arange(c.shape[0]), pos % W].set(u))
    where_slot = _sharded(lambda c, u, pos: _where(c, u, pos % W))
    vmapped_update = _sharded(lambda c, u, pos: _vmapped(c, u, pos % W))
    slot_after = _sharded(lambda c, u, pos: c.at[jnp.arange(c.shape[0]), (pos + 1) % W].set(u))
    ring_short = _sharded(lambda c, u, pos: c.at[jnp.arange(c.shape[0]), pos % (W - 1)].set(u))
    rows_reversed = _sharded(lambda c, u, pos: c.at[jnp.arange(c.shape[0])[::-1], pos % W].set(u))
    """
)

CASES = {
    "at-rows": ("at_rows", Status.VERIFIED),
    "where-slot": ("where_slot", Status.VERIFIED),
    "vmapped-update": ("vmapped_update", Status.VERIFIED),
    "slot-after": ("slot_after", Status.MISMATCH),
    "ring-short": ("ring_short", Status.MISMATCH),
    "rows-reversed": ("rows_reversed", Status.MISMATCH),
}
MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {name}, reference: m.py:ring_write, distributed: m.py:{fn}, inputs: m.py:inputs, mesh: {{dp: 2}}}}\n"
    for name, (fn, _) in CASES.items()
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("row_writes"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", CASES)
def test_a_ring_cache_written_on_batch_shards(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is CASES[name][1], (result.status, result.findings)
