"""Learned relative-position attention biases.

FIRE (functional interpolation): bias[h, i, j] = mlp(psi(i - j) / psi(max(i, L_THR)))[h] with
psi(r) = log(C * r + 1), causal. `fire_sp`: shard_map on {sp: 4}; query rows split over sp with
positions offset by axis_index, keys and values all_gathered.

Kerple-log over given integer position ids (packed documents): bias = -r1[h] * log(1 + r2[h] *
|pos_i - pos_j|), r = softplus(raw). `kerple_tp`: shard_map on {tp: 4}; heads over tp, every rank
cuts its slopes out of the replicated parameter vectors at axis_index * HL.
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, H, HD, HID = 2, 32, 16, 4, 8, 16
L_THR, C = 4.0, 0.5
S = 4
TL = T // S


def fire_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD), "m1": f(1, HID), "mb": f(HID),
            "m2": f(HID, H)}, f(B, T, D)


def _psi(r):
    return jnp.log(C * r + 1.0)


def _fire_bias(p, qpos, kpos, norm_pos):
    rel = jnp.maximum(qpos[:, None] - kpos[None, :], 0).astype(jnp.float32)
    z = _psi(rel) / _psi(jnp.maximum(norm_pos, L_THR))[:, None]
    bias = jax.nn.gelu(z[..., None] @ p["m1"] + p["mb"]) @ p["m2"]
    return jnp.moveaxis(bias, -1, 0)


def _fire_attend(p, xq, xk, qpos, kpos, norm_pos):
    q = jnp.einsum("btd,dhk->bhtk", xq, p["wq"])
    k = jnp.einsum("btd,dhk->bhtk", xk, p["wk"])
    v = jnp.einsum("btd,dhk->bhtk", xk, p["wv"])
    s = jnp.einsum("bhqk,bhsk->bhqs", q, k) / math.sqrt(HD) + _fire_bias(p, qpos, kpos, norm_pos)
    s = jnp.where(qpos[:, None] >= kpos[None, :], s, -1e9)
    return jnp.einsum("bhqs,bhsk->bqhk", jax.nn.softmax(s, -1), v).reshape(xq.shape[0], -1, H * HD)


def fire(p, x):
    pos = jnp.arange(T).astype(jnp.float32)
    return _fire_attend(p, x, x, pos, pos, pos)


def _fire_local(p, x):
    qpos = (lax.axis_index("sp") * TL + jnp.arange(TL)).astype(jnp.float32)
    xk = lax.all_gather(x, "sp", axis=1, tiled=True)
    return _fire_attend(p, x, xk, qpos, jnp.arange(T).astype(jnp.float32), qpos)


def _fire_local_norm_unshifted(p, x):
    qpos = (lax.axis_index("sp") * TL + jnp.arange(TL)).astype(jnp.float32)
    xk = lax.all_gather(x, "sp", axis=1, tiled=True)
    return _fire_attend(p, x, xk, qpos, jnp.arange(T).astype(jnp.float32), jnp.arange(TL).astype(jnp.float32))


def _fire_run(fn, p, x, mesh):
    return jax.shard_map(fn, mesh=mesh, in_specs=(P(), P(None, "sp")), out_specs=P(None, "sp"),
                         check_vma=False)(p, x)


def fire_sp(p, x, mesh):
    return _fire_run(_fire_local, p, x, mesh)


def fire_sp_norm_unshifted(p, x, mesh):
    return _fire_run(_fire_local_norm_unshifted, p, x, mesh)


HL = H // 4


def kerple_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return ({"wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD), "wo": f(H, HD, D), "r1": f(H),
             "r2": f(H)}, f(B, T, D), jax.ShapeDtypeStruct((B, T), jnp.int32))


def _kerple_attend(x, pos, wq, wk, wv, wo, r1, r2):
    q = jnp.einsum("btd,dhk->bhtk", x, wq)
    k = jnp.einsum("btd,dhk->bhtk", x, wk)
    v = jnp.einsum("btd,dhk->bhtk", x, wv)
    dist = jnp.abs(pos[:, :, None] - pos[:, None, :]).astype(jnp.float32)
    bias = -jax.nn.softplus(r1)[None, :, None, None] * jnp.log1p(
        jax.nn.softplus(r2)[None, :, None, None] * dist[:, None])
    s = jnp.einsum("bhqk,bhsk->bhqs", q, k) / math.sqrt(HD) + bias
    return jnp.einsum("bhqs,bhsk,hkd->bqd", jax.nn.softmax(s, -1), v, wo)


def kerple(p, x, pos):
    return _kerple_attend(x, pos, p["wq"], p["wk"], p["wv"], p["wo"], p["r1"], p["r2"])


def _kerple_local(p, x, pos):
    h0 = lax.axis_index("tp") * HL
    r1 = lax.dynamic_slice_in_dim(p["r1"], h0, HL)
    r2 = lax.dynamic_slice_in_dim(p["r2"], h0, HL)
    return lax.psum(_kerple_attend(x, pos, p["wq"], p["wk"], p["wv"], p["wo"], r1, r2), "tp")


def _kerple_local_r2_first_heads(p, x, pos):
    h0 = lax.axis_index("tp") * HL
    r1 = lax.dynamic_slice_in_dim(p["r1"], h0, HL)
    r2 = p["r2"][:HL]
    return lax.psum(_kerple_attend(x, pos, p["wq"], p["wk"], p["wv"], p["wo"], r1, r2), "tp")


def _kerple_run(fn, p, x, pos, mesh):
    heads = P(None, "tp", None)
    specs = {"wq": heads, "wk": heads, "wv": heads, "wo": P("tp", None, None), "r1": P(), "r2": P()}
    return jax.shard_map(fn, mesh=mesh, in_specs=(specs, P(), P()), out_specs=P(), check_vma=False)(p, x, pos)


def kerple_tp(p, x, pos, mesh):
    return _kerple_run(_kerple_local, p, x, pos, mesh)


def kerple_tp_r2_first_heads(p, x, pos, mesh):
    return _kerple_run(_kerple_local_r2_first_heads, p, x, pos, mesh)
