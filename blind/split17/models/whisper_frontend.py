"""Whisper-style audio front end in bf16: two 1-D convolutions over mel frames (kernel 3, the second
with stride 2) in bf16 with f32 accumulation (`preferred_element_type`), f32 biases and GELU,
sinusoidal positions, an f32 LayerNorm and a bf16 output. Parameters are f32 master copies cast to
bf16 at use.

- `frontend_channels`: on {model: 4}: conv1's output channels over model, conv2's input channels over
  model with its f32 partial sums psum'd;
- `frontend_time`: on {dp: 2, time: 2}: frames over time, the kernel-3 convolutions fed by one-frame
  halos exchanged with `ppermute` (zeros at the sequence ends stand for the padding), positions
  generated at axis_index * frames offsets.
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, C_IN, DM = 2, 32, 16, 32
DN = ("NWC", "WIO", "NWC")


def frontend_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"conv1_w": f(3, C_IN, DM), "conv1_b": f(DM), "conv2_w": f(3, DM, DM), "conv2_b": f(DM),
              "ln_g": f(DM), "ln_b": f(DM)}
    return params, f(B, T, C_IN)


def _conv(x, w, stride, padding):
    return lax.conv_general_dilated(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), (stride,), padding,
                                    dimension_numbers=DN, preferred_element_type=jnp.float32)


def sinusoids(positions, channels, max_timescale=10000.0):
    increment = math.log(max_timescale) / (channels // 2 - 1)
    inv = jnp.exp(-increment * jnp.arange(channels // 2, dtype=jnp.float32))
    scaled = positions.astype(jnp.float32)[:, None] * inv[None, :]
    return jnp.concatenate([jnp.sin(scaled), jnp.cos(scaled)], axis=1)


def _finish(p, h, positions):
    h = h + sinusoids(positions, DM)[None]
    mu = h.mean(-1, keepdims=True)
    var = ((h - mu) ** 2).mean(-1, keepdims=True)
    return ((h - mu) * lax.rsqrt(var + 1e-5) * p["ln_g"] + p["ln_b"]).astype(jnp.bfloat16)


def frontend(p, mel):
    h = jax.nn.gelu(_conv(mel, p["conv1_w"], 1, [(1, 1)]) + p["conv1_b"]).astype(jnp.bfloat16)
    h = jax.nn.gelu(_conv(h, p["conv2_w"], 2, [(1, 1)]) + p["conv2_b"])
    return _finish(p, h, jnp.arange(T // 2))


# ---- channels over model ----------------------------------------------------------------------------

def _channels_local(p, mel):
    h = jax.nn.gelu(_conv(mel, p["conv1_w"], 1, [(1, 1)]) + p["conv1_b"]).astype(jnp.bfloat16)
    partial = _conv(h, p["conv2_w"], 2, [(1, 1)])
    h = jax.nn.gelu(lax.psum(partial, "model") + p["conv2_b"])
    return _finish(p, h, jnp.arange(T // 2))


def _channels_local_conv2_unreduced(p, mel):
    h = jax.nn.gelu(_conv(mel, p["conv1_w"], 1, [(1, 1)]) + p["conv1_b"]).astype(jnp.bfloat16)
    partial = _conv(h, p["conv2_w"], 2, [(1, 1)])
    h = jax.nn.gelu(partial + p["conv2_b"])
    return _finish(p, h, jnp.arange(T // 2))


def _channels(local, p, mel, mesh):
    specs = {"conv1_w": P(None, None, "model"), "conv1_b": P("model"), "conv2_w": P(None, "model", None),
             "conv2_b": P(), "ln_g": P(), "ln_b": P()}
    return jax.shard_map(local, mesh=mesh, in_specs=(specs, P()), out_specs=P(), check_vma=False)(p, mel)


def frontend_channels(p, mel, mesh):
    return _channels(_channels_local, p, mel, mesh)


def frontend_channels_conv2_unreduced(p, mel, mesh):
    return _channels(_channels_local_conv2_unreduced, p, mel, mesh)


# ---- frames over time, ppermute halos ------------------------------------------------------------------

def _from_left(x, n):
    return lax.ppermute(x[:, -1:], "time", [(i, i + 1) for i in range(n - 1)])


def _from_right(x, n):
    return lax.ppermute(x[:, :1], "time", [(i + 1, i) for i in range(n - 1)])


def _time_local(p, mel, right_halo):
    n = lax.axis_size("time")
    padded = jnp.concatenate([_from_left(mel, n), mel, right_halo(mel, n)], axis=1)
    h = jax.nn.gelu(_conv(padded, p["conv1_w"], 1, "VALID") + p["conv1_b"]).astype(jnp.bfloat16)
    h = jnp.concatenate([_from_left(h, n), h], axis=1)
    h = jax.nn.gelu(_conv(h, p["conv2_w"], 2, "VALID") + p["conv2_b"])
    frames = h.shape[1]
    return _finish(p, h, lax.axis_index("time") * frames + jnp.arange(frames))


def _time(p, mel, mesh, right_halo):
    return jax.shard_map(lambda p_, m_: _time_local(p_, m_, right_halo), mesh=mesh,
                         in_specs=(P(), P("dp", "time")), out_specs=P("dp", "time"),
                         check_vma=False)(p, mel)


def frontend_time(p, mel, mesh):
    return _time(p, mel, mesh, right_halo=_from_right)


def frontend_time_right_halo_from_left(p, mel, mesh):
    return _time(p, mel, mesh, right_halo=lambda x, n: lax.ppermute(x[:, :1], "time", [(i, i + 1) for i in range(n - 1)]))
