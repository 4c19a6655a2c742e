"""Gated diagonal linear recurrence (Mamba/LRU-like): a_t = sigmoid(x_t wa), h_t = a_t * h_{t-1} +
x_t wu, y_t = h_t * silu(x_t wg). The reference runs a lax.scan over time.

Sequence parallel on {sp: 4} (the time axis split over sp), each rank scans its chunk with
lax.associative_scan from a zero state and then folds in the state carried from earlier chunks:
- `recurrence_sp_gather`: every rank all_gathers the chunk summaries (product of a, end state) and
  folds those of the chunks before it;
- `recurrence_sp_ring`: the carry is passed along the ring with ppermute, S - 1 rounds.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, S = 2, 32, 16, 4
TL = T // S


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"wa": f(D, D), "wu": f(D, D), "wg": f(D, D)}, f(B, T, D)


def recurrence(p, x):
    a, u = jax.nn.sigmoid(x @ p["wa"]), x @ p["wu"]

    def step(h, au):
        h = au[0] * h + au[1]
        return h, h

    _, hs = lax.scan(step, jnp.zeros((B, D)), (a.swapaxes(0, 1), u.swapaxes(0, 1)))
    return hs.swapaxes(0, 1) * jax.nn.silu(x @ p["wg"])


def _combine(l, r):
    return l[0] * r[0], r[0] * l[1] + r[1]


def _chunk(p, x):
    a, u = jax.nn.sigmoid(x @ p["wa"]), x @ p["wu"]
    return lax.associative_scan(_combine, (a, u), axis=1)


def _local_gather(p, x, before):
    acum, hloc = _chunk(p, x)
    idx = lax.axis_index("sp")
    atot = lax.all_gather(acum[:, -1], "sp")
    htot = lax.all_gather(hloc[:, -1], "sp")
    carry = jnp.zeros((B, D))
    for j in range(S):
        carry = jnp.where(before(j, idx), atot[j] * carry + htot[j], carry)
    h = hloc + acum * carry[:, None]
    return h * jax.nn.silu(x @ p["wg"])


def _run(fn, p, x, mesh):
    return jax.shard_map(fn, mesh=mesh, in_specs=(P(), P(None, "sp")), out_specs=P(None, "sp"),
                         check_vma=False)(p, x)


def recurrence_sp_gather(p, x, mesh):
    return _run(lambda p, x: _local_gather(p, x, lambda j, idx: j < idx), p, x, mesh)


def recurrence_sp_gather_own_chunk_folded(p, x, mesh):
    return _run(lambda p, x: _local_gather(p, x, lambda j, idx: j <= idx), p, x, mesh)


def _local_ring(p, x):
    acum, hloc = _chunk(p, x)
    idx = lax.axis_index("sp")
    ring = [(i, (i + 1) % S) for i in range(S)]
    carry = jnp.zeros((B, D))
    for _ in range(S - 1):
        incoming = lax.ppermute(acum[:, -1] * carry + hloc[:, -1], "sp", ring)
        carry = jnp.where(idx == 0, 0.0, incoming)
    return (hloc + acum * carry[:, None]) * jax.nn.silu(x @ p["wg"])


def recurrence_sp_ring(p, x, mesh):
    return _run(_local_ring, p, x, mesh)


def _local_ring_wraps(p, x):
    acum, hloc = _chunk(p, x)
    ring = [(i, (i + 1) % S) for i in range(S)]
    carry = jnp.zeros((B, D))
    for _ in range(S - 1):
        carry = lax.ppermute(acum[:, -1] * carry + hloc[:, -1], "sp", ring)
    return (hloc + acum * carry[:, None]) * jax.nn.silu(x @ p["wg"])


def recurrence_sp_ring_wraps(p, x, mesh):
    return _run(_local_ring_wraps, p, x, mesh)
