"""Gated linear-recurrence block (Mamba / RG-LRU flavoured): u, gate = split(x @ w_in); decay
a = sigmoid(x @ w_a) in (0, 1); per channel h_t = a_t * h_{t-1} + (1 - a_t) * u_t with h_{-1} = 0;
out = x + (h * silu(gate)) @ w_out. The reference runs the recurrence with a sequential `lax.scan`.
Sharded by jit alone on {data: 2, model: 4} (batch over data, recurrence channels over model).

- `recurrence_assoc_jit`: `lax.associative_scan` over the sequence of (a, b) pairs under a jit with
  `out_shardings`, channel tensors pinned by `with_sharding_constraint`;
- `recurrence_chunked_jit`: chunked (SSD-style) form: within chunks of 4 steps the decays are
  cumulative log-sums turned into a lower-triangular [4, 4] transfer matrix, the state is carried
  across chunks by a `lax.scan`; the jit takes `in_shardings` for the batch and the channel tensors
  are constrained with bare PartitionSpecs (resolved against the current mesh).
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

B, S, D, C = 4, 16, 16, 32
CHUNK = 4


def rec_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"w_in": f(D, 2 * C), "w_a": f(D, C), "w_out": f(C, D)}, f(B, S, D)


def _gates(p, x):
    u, gate = jnp.split(x @ p["w_in"], 2, axis=-1)
    a = jax.nn.sigmoid(x @ p["w_a"])
    return a, (1.0 - a) * u, gate


def _readout(p, x, h, gate):
    return x + (h * jax.nn.silu(gate)) @ p["w_out"]


def recurrence_block(p, x):
    a, b, gate = _gates(p, x)

    def step(h, ab):
        h = ab[0] * h + ab[1]
        return h, h

    _, hs = lax.scan(step, jnp.zeros((B, C)), (a.swapaxes(0, 1), b.swapaxes(0, 1)))
    return _readout(p, x, hs.swapaxes(0, 1), gate)


# ---- associative scan under jit -----------------------------------------------------------------

def _compose(left, right):
    a_l, b_l = left
    a_r, b_r = right
    return a_l * a_r, a_r * b_l + b_r


def _compose_wrong_decay(left, right):
    a_l, b_l = left
    a_r, b_r = right
    return a_l * a_r, a_l * b_l + b_r


def _assoc_jit(compose, mesh):
    channels = NamedSharding(mesh, P("data", None, "model"))

    def body(p, x):
        a, b, gate = _gates(p, x)
        a = lax.with_sharding_constraint(a, channels)
        b = lax.with_sharding_constraint(b, channels)
        _, h = lax.associative_scan(compose, (a, b), axis=1)
        return _readout(p, x, h, gate)

    return jax.jit(body, out_shardings=NamedSharding(mesh, P("data")))


def recurrence_assoc_jit(p, x, mesh):
    return _assoc_jit(_compose, mesh)(p, x)


def recurrence_assoc_jit_wrong_decay(p, x, mesh):
    return _assoc_jit(_compose_wrong_decay, mesh)(p, x)


# ---- chunked transfer matrices --------------------------------------------------------------------

def _chunk_state(carry, log_a, b, decay_carry):
    # log_a, b: [B, CHUNK, C]; carry: [B, C]
    cum = jnp.cumsum(log_a, axis=1)
    diff = cum[:, :, None, :] - cum[:, None, :, :]
    causal = jnp.tril(jnp.ones((CHUNK, CHUNK), bool))[None, :, :, None]
    transfer = jnp.where(causal, jnp.exp(jnp.where(causal, diff, 0.0)), 0.0)
    h = jnp.einsum("btsc,bsc->btc", transfer, b)
    return h + decay_carry(cum, carry)


def _decayed_carry(cum, carry):
    return jnp.exp(cum) * carry[:, None, :]


def _undecayed_carry(cum, carry):
    return carry[:, None, :]


def _chunked_jit(decay_carry, mesh):
    def body(p, x):
        a, b, gate = _gates(p, x)
        a = lax.with_sharding_constraint(a, P("data", None, "model"))
        b = lax.with_sharding_constraint(b, P("data", None, "model"))
        n = S // CHUNK
        log_a = jnp.log(a).reshape(B, n, CHUNK, C).swapaxes(0, 1)
        b = b.reshape(B, n, CHUNK, C).swapaxes(0, 1)

        def step(carry, chunk):
            h = _chunk_state(carry, chunk[0], chunk[1], decay_carry)
            return h[:, -1], h

        _, h = lax.scan(step, jnp.zeros((B, C)), (log_a, b))
        return _readout(p, x, h.swapaxes(0, 1).reshape(B, S, C), gate)

    return jax.jit(body, in_shardings=(None, NamedSharding(mesh, P("data"))))


def recurrence_chunked_jit(p, x, mesh):
    return _chunked_jit(_decayed_carry, mesh)(p, x)


def recurrence_chunked_jit_undecayed_carry(p, x, mesh):
    return _chunked_jit(_undecayed_carry, mesh)(p, x)
