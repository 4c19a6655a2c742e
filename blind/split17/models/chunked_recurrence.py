"""Gated diagonal linear recurrence (LRU/RetNet-like, h_t = a * h_{t-1} + u_t per channel with
a = sigmoid(decay)) followed by a SiLU gate and an output projection; the reference runs one
`lax.scan` over the whole sequence.

Sequence parallel over `sp` (batch over `dp`): every device scans its own chunk from a zero state,
then corrects its chunk with the state carried in from the previous chunks, h_t += a^(t+1) * h_in.

- `recurrence_gathered_carry`: the chunk-final states are all-gathered over sp and every device
  sums the earlier chunks' states decayed by a^(chunk * distance) ({dp: 2, sp: 4});
- `recurrence_ring_carry`: the carry is passed down the chunk chain with sp - 1 `ppermute` hops
  ({sp: 4}).
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, C = 4, 32, 16, 32


def rec_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"w_in": f(D, C), "w_gate": f(D, C), "decay": f(C), "w_out": f(C, D)}, f(B, S, D)


def _linear_scan(u, a):
    def step(h, u_t):
        h = a * h + u_t
        return h, h
    _, hs = lax.scan(step, jnp.zeros((u.shape[0], u.shape[2]), u.dtype), jnp.swapaxes(u, 0, 1))
    return jnp.swapaxes(hs, 0, 1)


def _readout(p, x, h):
    return (h * jax.nn.silu(x @ p["w_gate"])) @ p["w_out"]


def recurrence(p, x):
    a = jax.nn.sigmoid(p["decay"])
    return _readout(p, x, _linear_scan(x @ p["w_in"], a))


# ---- all-gathered chunk states --------------------------------------------------------------------

def _gathered_local(p, x):
    a = jax.nn.sigmoid(p["decay"])
    h = _linear_scan(x @ p["w_in"], a)
    chunk = x.shape[1]
    ends = lax.all_gather(h[:, -1], "sp")  # [n, b, C]
    i = lax.axis_index("sp")
    j = jnp.arange(ends.shape[0])
    distance = jnp.maximum(i - 1 - j, 0).astype(jnp.float32) * chunk
    weight = jnp.where((j < i)[:, None], a[None, :] ** distance[:, None], 0.0)  # [n, C]
    h_in = jnp.einsum("nbc,nc->bc", ends, weight)
    t = jnp.arange(chunk, dtype=jnp.float32)
    h = h + a[None, None, :] ** (t[None, :, None] + 1.0) * h_in[:, None, :]
    return _readout(p, x, h)


def _gathered_local_inclusive(p, x):
    a = jax.nn.sigmoid(p["decay"])
    h = _linear_scan(x @ p["w_in"], a)
    chunk = x.shape[1]
    ends = lax.all_gather(h[:, -1], "sp")  # [n, b, C]
    i = lax.axis_index("sp")
    j = jnp.arange(ends.shape[0])
    distance = jnp.maximum(i - 1 - j, 0).astype(jnp.float32) * chunk
    weight = jnp.where((j <= i)[:, None], a[None, :] ** distance[:, None], 0.0)  # [n, C]
    h_in = jnp.einsum("nbc,nc->bc", ends, weight)
    t = jnp.arange(chunk, dtype=jnp.float32)
    h = h + a[None, None, :] ** (t[None, :, None] + 1.0) * h_in[:, None, :]
    return _readout(p, x, h)


def _gathered(local, p, x, mesh):
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("dp", "sp")),
                         out_specs=P("dp", "sp"), check_vma=False)(p, x)


def recurrence_gathered_carry(p, x, mesh):
    return _gathered(_gathered_local, p, x, mesh)


def recurrence_gathered_carry_inclusive(p, x, mesh):
    return _gathered(_gathered_local_inclusive, p, x, mesh)


# ---- carry passed along a ppermute chain -----------------------------------------------------------

def _ring_local(p, x, first_power):
    a = jax.nn.sigmoid(p["decay"])
    h = _linear_scan(x @ p["w_in"], a)
    n, chunk = lax.axis_size("sp"), x.shape[1]
    end, h_in = h[:, -1], jnp.zeros_like(h[:, -1])
    for _ in range(n - 1):
        h_in = lax.ppermute(end + a ** chunk * h_in, "sp", [(k, k + 1) for k in range(n - 1)])
    powers = a[None, :] ** (jnp.arange(chunk, dtype=jnp.float32)[:, None] + first_power)
    return _readout(p, x, h + powers[None] * h_in[:, None, :])


def _ring(p, x, mesh, first_power):
    return jax.shard_map(lambda p_, x_: _ring_local(p_, x_, first_power), mesh=mesh,
                         in_specs=(P(), P(None, "sp")), out_specs=P(None, "sp"),
                         check_vma=False)(p, x)


def recurrence_ring_carry(p, x, mesh):
    return _ring(p, x, mesh, first_power=1.0)


def recurrence_ring_carry_power_from_zero(p, x, mesh):
    return _ring(p, x, mesh, first_power=0.0)
