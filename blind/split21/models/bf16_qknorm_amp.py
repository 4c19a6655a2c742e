"""Mixed precision: bfloat16 activations and weights with float32 islands.

- Gemma-3-like attention with per-head RMS QK-norm: projections in bf16 with float32
  accumulation, q/k normalised in float32 with their own gains, softmax in float32, output cast to
  bf16. `qknorm_tp` on {tp: 4}: heads over tp, f32 psum of the output projection;
- AMP training step of a two-layer bf16 regressor with float32 master weights and a static loss
  scale of 1024: the scaled loss is differentiated, gradients are averaged over dp, unscaled in
  float32 and applied by SGD. `amp_step_dp` on {dp: 4}. Returns (new master weights, loss).
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, H, HD = 2, 8, 32, 4, 8
N, DI, DH = 16, 16, 32
LOSS_SCALE, LR = 1024.0, 0.05
BF = jnp.bfloat16


def qk_inputs():
    b = lambda *s: jax.ShapeDtypeStruct(s, BF)
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return b(D, H, HD), b(D, H, HD), b(D, H, HD), b(H, HD, D), f(HD), f(HD), b(B, T, D)


def _rms(x, g):
    x = x.astype(jnp.float32)
    return x * lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * g


def _qk_partial(wq, wk, wv, wo, q_gain, k_gain, x, k_norm_gain):
    proj = lambda w: jnp.einsum("btd,dhk->bthk", x, w, preferred_element_type=jnp.float32)
    q = _rms(proj(wq), q_gain).astype(BF)
    k = _rms(proj(wk), k_norm_gain(q_gain, k_gain)).astype(BF)
    v = proj(wv).astype(BF)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) / math.sqrt(HD)
    s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -1e30)
    o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1).astype(BF), v).astype(BF)
    return jnp.einsum("bqhd,hdm->bqm", o, wo, preferred_element_type=jnp.float32)


def _own_gain(q_gain, k_gain):
    return k_gain


def _q_gain_for_k(q_gain, k_gain):
    return q_gain


def qknorm(wq, wk, wv, wo, q_gain, k_gain, x):
    return _qk_partial(wq, wk, wv, wo, q_gain, k_gain, x, _own_gain).astype(BF)


def _run_qk(args, mesh, gain):
    local = lambda *a: lax.psum(_qk_partial(*a, gain), "tp").astype(BF)
    heads = P(None, "tp")
    specs = (heads, heads, heads, P("tp"), P(), P(), P())
    return jax.shard_map(local, mesh=mesh, check_vma=False, in_specs=specs, out_specs=P())(*args)


def qknorm_tp(wq, wk, wv, wo, q_gain, k_gain, x, mesh):
    return _run_qk((wq, wk, wv, wo, q_gain, k_gain, x), mesh, _own_gain)


def qknorm_tp_k_uses_q_gain(wq, wk, wv, wo, q_gain, k_gain, x, mesh):
    return _run_qk((wq, wk, wv, wo, q_gain, k_gain, x), mesh, _q_gain_for_k)


# ---- AMP step ---------------------------------------------------------------------------------

def amp_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"w1": f(DI, DH), "w2": f(DH, 1)}, f(N, DI), f(N, 1)


def _loss(master, xb, yb):
    h = jnp.tanh(xb.astype(BF) @ master["w1"].astype(BF))
    pred = (h @ master["w2"].astype(BF)).astype(jnp.float32)
    return jnp.mean(jnp.square(pred - yb))


def amp_step(master, xb, yb):
    loss, g = jax.value_and_grad(_loss)(master, xb, yb)
    return jax.tree_util.tree_map(lambda p, d: p - LR * d, master, g), loss


def _unscale(g):
    return g.astype(jnp.float32) / LOSS_SCALE


def _unscale_missing(g):
    return g.astype(jnp.float32)


def _amp_local(master, xb, yb, unscale):
    scaled = lambda p: _loss(p, xb, yb) * LOSS_SCALE
    sloss, g = jax.value_and_grad(scaled)(master)
    g = jax.tree_util.tree_map(lambda d: unscale(lax.pmean(d, "dp")), g)
    new = jax.tree_util.tree_map(lambda p, d: p - LR * d, master, g)
    return new, lax.pmean(sloss, "dp") / LOSS_SCALE


def _run_amp(master, xb, yb, mesh, unscale):
    local = lambda *a: _amp_local(*a, unscale)
    return jax.shard_map(local, mesh=mesh, check_vma=False, in_specs=(P(), P("dp"), P("dp")), out_specs=(P(), P()))(master, xb, yb)


def amp_step_dp(master, xb, yb, mesh):
    return _run_amp(master, xb, yb, mesh, _unscale)


def amp_step_dp_not_unscaled(master, xb, yb, mesh):
    return _run_amp(master, xb, yb, mesh, _unscale_missing)
