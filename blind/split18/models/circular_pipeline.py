"""An 8-layer residual tanh-MLP stack (h <- h + tanh(h @ w_in[l]) @ w_out[l]) on a batch of 8 rows,
pipelined over 4 devices with 4 microbatches of 2 rows.

- `pipeline_interleaved` on {pp: 4}: interleaved / circular schedule (2 virtual stages per device):
  device d owns layers d and d + 4, so the stacked weights are re-laid out as [pp, rounds, ...]
  before sharding. A `lax.scan` over 11 ticks: device 0 injects microbatch t for t < 4 and otherwise
  takes what the last device sent around the ring (`ppermute` i -> i + 1 mod 4); the last device
  writes finished microbatches in its second round; a masked psum broadcasts them.
- `pipeline_gpipe_indexed` on {dp: 2, pp: 4}: GPipe with replicated weights; every stage picks its
  two consecutive layers with `lax.dynamic_index_in_dim` at its `axis_index`, ticks in a Python loop,
  activations moved with a non-wrapping `ppermute`; batch over dp (2 microbatches of 2 rows).
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BATCH, D, F, L = 8, 16, 32, 8
PP = 4
ROUNDS = L // PP
M = 4
MB = BATCH // M


def stack_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"w_in": f(L, D, F), "w_out": f(L, F, D)}, f(BATCH, D)


def _layer(h, w_in, w_out):
    return h + jnp.tanh(h @ w_in) @ w_out


def stack(p, x):
    def body(h, w):
        return _layer(h, *w), None
    return lax.scan(body, x, (p["w_in"], p["w_out"]))[0]


# ---- interleaved (circular) schedule ---------------------------------------------------------------

def _interleave(w):
    return w.reshape(ROUNDS, PP, *w.shape[1:]).swapaxes(0, 1)


def _consecutive(w):
    return w.reshape(PP, ROUNDS, *w.shape[1:])


def _circular_local(w_in, w_out, x):
    w_in, w_out = w_in[0], w_out[0]  # [ROUNDS, ...] of this device
    d = lax.axis_index("pp")
    micro = x.reshape(M, MB, D)
    ring = [(i, (i + 1) % PP) for i in range(PP)]

    def tick(carry, t):
        sent, outputs = carry
        received = lax.ppermute(sent, "pp", ring)
        inp = jnp.where((d == 0) & (t < M), micro[jnp.minimum(t, M - 1)], received)
        rnd = jnp.clip((t - d) // PP, 0, ROUNDS - 1)
        out = _layer(inp, w_in[rnd], w_out[rnd])
        m = t - d - PP * rnd
        done = (d == PP - 1) & (rnd == ROUNDS - 1) & (m >= 0) & (m < M)
        outputs = jnp.where(done, outputs.at[jnp.clip(m, 0, M - 1)].set(out), outputs)
        return (out, outputs), None

    init = (jnp.zeros((MB, D)), jnp.zeros((M, MB, D)))
    (_, outputs), _ = lax.scan(tick, init, jnp.arange(M * ROUNDS + PP - 1))
    return lax.psum(jnp.where(d == PP - 1, outputs, 0.0), "pp").reshape(BATCH, D)


def pipeline_interleaved(p, x, mesh):
    w_in, w_out = _interleave(p["w_in"]), _interleave(p["w_out"])
    return jax.shard_map(_circular_local, mesh=mesh, in_specs=(P("pp"), P("pp"), P()), out_specs=P(),
                         check_vma=False)(w_in, w_out, x)


def pipeline_interleaved_consecutive_layout(p, x, mesh):
    w_in, w_out = _consecutive(p["w_in"]), _consecutive(p["w_out"])
    return jax.shard_map(_circular_local, mesh=mesh, in_specs=(P("pp"), P("pp"), P()), out_specs=P(),
                         check_vma=False)(w_in, w_out, x)


# ---- GPipe with replicated weights indexed by stage -------------------------------------------------

M_DP = 2


def _stage(h, w_in, w_out):
    for j in range(ROUNDS):
        h = _layer(h, w_in[j], w_out[j])
    return h


def pipeline_gpipe_indexed(p, x, mesh):
    def local(p, x):
        s = lax.axis_index("pp")
        w_in = lax.dynamic_index_in_dim(p["w_in"].reshape(PP, ROUNDS, D, F), s, keepdims=False)
        w_out = lax.dynamic_index_in_dim(p["w_out"].reshape(PP, ROUNDS, F, D), s, keepdims=False)
        micro = x.reshape(M_DP, -1, D)
        state = jnp.zeros_like(micro[0])
        outputs = jnp.zeros_like(micro)
        for t in range(M_DP + PP - 1):
            inp = jnp.where(s == 0, micro[min(t, M_DP - 1)], state)
            out = _stage(inp, w_in, w_out)
            if t >= PP - 1:
                outputs = outputs.at[t - (PP - 1)].set(jnp.where(s == PP - 1, out, 0.0))
            state = lax.ppermute(out, "pp", [(i, i + 1) for i in range(PP - 1)])
        return lax.psum(outputs, "pp").reshape(x.shape)
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("dp")), out_specs=P("dp"),
                         check_vma=False)(p, x)


def pipeline_gpipe_indexed_drain_off_by_one(p, x, mesh):
    def local(p, x):
        s = lax.axis_index("pp")
        w_in = lax.dynamic_index_in_dim(p["w_in"].reshape(PP, ROUNDS, D, F), s, keepdims=False)
        w_out = lax.dynamic_index_in_dim(p["w_out"].reshape(PP, ROUNDS, F, D), s, keepdims=False)
        micro = x.reshape(M_DP, -1, D)
        state = jnp.zeros_like(micro[0])
        outputs = jnp.zeros_like(micro)
        for t in range(M_DP + PP - 1):
            inp = jnp.where(s == 0, micro[min(t, M_DP - 1)], state)
            out = _stage(inp, w_in, w_out)
            if t >= PP - 1:
                outputs = outputs.at[t - PP].set(jnp.where(s == PP - 1, out, 0.0))
            state = lax.ppermute(out, "pp", [(i, i + 1) for i in range(PP - 1)])
        return lax.psum(outputs, "pp").reshape(x.shape)
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("dp")), out_specs=P("dp"),
                         check_vma=False)(p, x)
