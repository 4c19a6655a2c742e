"""RWKV-style channel mixing with token shift: every token mixes its LayerNorm'd features with the
previous token's (the first token with zeros) through learned per-channel ratios, then a
squared-ReLU key, a value projection and a sigmoid receptance gate, plus the residual.

Sequence parallel over the time axis, so each chunk needs the last token of the chunk before it:
- `channel_mix_ppermute`: on {sp: 4}, a non-cyclic `ppermute` sends each chunk's last row to the
  next device (device 0 receives zeros);
- `channel_mix_gathered`: on {dp: 2, sp: 4}, the normalised sequence is all-gathered, shifted by
  one row with a zero pad and the device's chunk cut out with `dynamic_slice_in_dim`.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, F = 2, 16, 16, 32


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"ln_g": f(D), "ln_b": f(D), "mu_k": f(D), "mu_r": f(D),
              "wk": f(D, F), "wv": f(F, D), "wr": f(D, D)}
    return params, f(B, T, D)


def layer_norm(x, g, b):
    mu = jnp.mean(x, -1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), -1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + 1e-5) * g + b


def _mix(p, h, prev):
    xk = h * p["mu_k"] + prev * (1 - p["mu_k"])
    xr = h * p["mu_r"] + prev * (1 - p["mu_r"])
    kv = jnp.square(jax.nn.relu(xk @ p["wk"])) @ p["wv"]
    return jax.nn.sigmoid(xr @ p["wr"]) * kv


def channel_mix(p, x):
    h = layer_norm(x, p["ln_g"], p["ln_b"])
    prev = jnp.concatenate([jnp.zeros_like(h[:, :1]), h[:, :-1]], axis=1)
    return x + _mix(p, h, prev)


def _specs(p, x_spec):
    return ({k: P() for k in p}, x_spec)


# ---- halo by ppermute ---------------------------------------------------------------------------

def _forward_pairs(n):
    return [(i, i + 1) for i in range(n - 1)]


def _backward_pairs(n):
    return [(i + 1, i) for i in range(n - 1)]


def _ppermute_local(p, x, pairs):
    h = layer_norm(x, p["ln_g"], p["ln_b"])
    n = lax.axis_size("sp")
    halo = lax.ppermute(h[:, -1:], "sp", perm=pairs(n))
    prev = jnp.concatenate([halo, h[:, :-1]], axis=1)
    return x + _mix(p, h, prev)


def channel_mix_ppermute(p, x, mesh):
    local = lambda p, x: _ppermute_local(p, x, _forward_pairs)
    spec = P(None, "sp", None)
    return jax.shard_map(local, mesh=mesh, in_specs=_specs(p, spec), out_specs=spec,
                         check_vma=False)(p, x)


def channel_mix_ppermute_backwards(p, x, mesh):
    local = lambda p, x: _ppermute_local(p, x, _backward_pairs)
    spec = P(None, "sp", None)
    return jax.shard_map(local, mesh=mesh, in_specs=_specs(p, spec), out_specs=spec,
                         check_vma=False)(p, x)


# ---- halo from the gathered sequence ------------------------------------------------------------

def _prev_start(i, chunk):
    return i * chunk


def _prev_start_past_pad(i, chunk):
    return i * chunk + 1


def _gathered_local(p, x, start):
    h = layer_norm(x, p["ln_g"], p["ln_b"])
    chunk = h.shape[1]
    full = lax.all_gather(h, "sp", axis=1, tiled=True)
    shifted = jnp.pad(full, ((0, 0), (1, 0), (0, 0)))
    prev = lax.dynamic_slice_in_dim(shifted, start(lax.axis_index("sp"), chunk), chunk, axis=1)
    return x + _mix(p, h, prev)


def channel_mix_gathered(p, x, mesh):
    local = lambda p, x: _gathered_local(p, x, _prev_start)
    spec = P("dp", "sp", None)
    return jax.shard_map(local, mesh=mesh, in_specs=_specs(p, spec), out_specs=spec,
                         check_vma=False)(p, x)


def channel_mix_gathered_no_shift(p, x, mesh):
    local = lambda p, x: _gathered_local(p, x, _prev_start_past_pad)
    spec = P("dp", "sp", None)
    return jax.shard_map(local, mesh=mesh, in_specs=_specs(p, spec), out_specs=spec,
                         check_vma=False)(p, x)
