"""Weight-only float8 (e4m3) quantised MLP: each weight matrix is quantised per OUTPUT channel
(scale = max |w| over the input dim / 448, q = (w / scale) cast to float8_e4m3fn) and dequantised
at use (q.astype(f32) * scale); activations and accumulation stay in f32; GELU MLP.

`fp8_mlp_tp` on {tp: 4}: w1 column-parallel (each device's output channels are whole, so its scales
are local), w2 row-parallel: a device holds a slice of every output channel's input dim, so the
channel max is `pmax`-reduced over tp before the scale is taken; partial outputs psum-reduced.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, D, F = 16, 32, 64
FP8_MAX = 448.0


def mlp_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"w1": f(D, F), "w2": f(F, D)}, f(B, D)


def _fake_quant(w, channel_max):
    scale = channel_max / FP8_MAX
    q = (w / scale).astype(jnp.float8_e4m3fn)
    return q.astype(jnp.float32) * scale


def fp8_mlp(p, x):
    w1 = _fake_quant(p["w1"], jnp.max(jnp.abs(p["w1"]), axis=0, keepdims=True))
    w2 = _fake_quant(p["w2"], jnp.max(jnp.abs(p["w2"]), axis=0, keepdims=True))
    return jax.nn.gelu(x @ w1) @ w2


def fp8_mlp_tp(p, x, mesh):
    def local(p, x):
        w1 = _fake_quant(p["w1"], jnp.max(jnp.abs(p["w1"]), axis=0, keepdims=True))
        w2_max = lax.pmax(jnp.max(jnp.abs(p["w2"]), axis=0, keepdims=True), "tp")
        w2 = _fake_quant(p["w2"], w2_max)
        return lax.psum(jax.nn.gelu(x @ w1) @ w2, "tp")
    return jax.shard_map(local, mesh=mesh, in_specs=({"w1": P(None, "tp"), "w2": P("tp", None)}, P()),
                         out_specs=P(), check_vma=False)(p, x)


def fp8_mlp_tp_local_scale(p, x, mesh):
    def local(p, x):
        w1 = _fake_quant(p["w1"], jnp.max(jnp.abs(p["w1"]), axis=0, keepdims=True))
        w2_max = jnp.max(jnp.abs(p["w2"]), axis=0, keepdims=True)
        w2 = _fake_quant(p["w2"], w2_max)
        return lax.psum(jax.nn.gelu(x @ w1) @ w2, "tp")
    return jax.shard_map(local, mesh=mesh, in_specs=({"w1": P(None, "tp"), "w2": P("tp", None)}, P()),
                         out_specs=P(), check_vma=False)(p, x)
