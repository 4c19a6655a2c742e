"""Rotary position embeddings in two layouts, inside causal attention.

1. GPT-J interleaved pairs (dims 2i, 2i+1 rotate together) from a precomputed [T, HD/2] cos/sin
   table; the sequence is split over `seq` on a {dp: 2, seq: 2} mesh (batch over dp), each rank
   slices its rows of the table, rotates its local q/k and all-gathers the rotated keys/values.
2. NeoX half rotation on the first ROT dims of each head only (partial rotary), angles computed on
   the fly from integer position ids (packed sequences); heads split over {tp: 4}. The sharded
   block uses a fused rotate (roll the halves, multiply by a signed sin) instead of rotate_half.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, H, HD = 4, 8, 16, 2, 8
BASE = 10000.0


def _pair_table(n):
    inv = BASE ** (-jnp.arange(0, HD, 2, dtype=jnp.float32) / HD)
    ang = jnp.arange(n, dtype=jnp.float32)[:, None] * inv[None, :]
    return jnp.cos(ang), jnp.sin(ang)                                # [n, HD/2]


def rotate_pairs(x, cos, sin):
    """x: [B, t, H, HD]; cos/sin: [t, HD/2]."""
    x2 = x.reshape(*x.shape[:-1], HD // 2, 2)
    c, s = cos[:, None, :], sin[:, None, :]
    a, b = x2[..., 0], x2[..., 1]
    return jnp.stack([a * c - b * s, a * s + b * c], axis=-1).reshape(x.shape)


def pairs_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD), "wo": f(H, HD, D)}, f(B, T, D)


def pairs_attention(params, x):
    cos, sin = _pair_table(T)
    q = rotate_pairs(jnp.einsum("btd,dhe->bthe", x, params["wq"]), cos, sin)
    k = rotate_pairs(jnp.einsum("btd,dhe->bthe", x, params["wk"]), cos, sin)
    v = jnp.einsum("btd,dhe->bthe", x, params["wv"])
    s = jnp.einsum("bqhe,bkhe->bhqk", q, k) / jnp.sqrt(float(HD))
    s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -jnp.inf)
    o = jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(s, axis=-1), v)
    return x + jnp.einsum("bqhe,hed->bqd", o, params["wo"])


def _pairs_seq_local(params, x, offset_axis):
    t_local = x.shape[1]
    cos, sin = _pair_table(T)
    cos = lax.dynamic_slice_in_dim(cos, lax.axis_index(offset_axis) * t_local, t_local)
    sin = lax.dynamic_slice_in_dim(sin, lax.axis_index(offset_axis) * t_local, t_local)
    q = rotate_pairs(jnp.einsum("btd,dhe->bthe", x, params["wq"]), cos, sin)
    k = rotate_pairs(jnp.einsum("btd,dhe->bthe", x, params["wk"]), cos, sin)
    v = jnp.einsum("btd,dhe->bthe", x, params["wv"])
    k = lax.all_gather(k, "seq", axis=1, tiled=True)
    v = lax.all_gather(v, "seq", axis=1, tiled=True)
    q_pos = lax.axis_index("seq") * t_local + jnp.arange(t_local)
    s = jnp.einsum("bqhe,bkhe->bhqk", q, k) / jnp.sqrt(float(HD))
    s = jnp.where(q_pos[:, None] >= jnp.arange(T)[None, :], s, -jnp.inf)
    o = jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(s, axis=-1), v)
    return x + jnp.einsum("bqhe,hed->bqd", o, params["wo"])


def pairs_attention_seq(params, x, mesh):
    body = lambda p, x: _pairs_seq_local(p, x, offset_axis="seq")
    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P("dp", "seq")),
                         out_specs=P("dp", "seq"))(params, x)


def pairs_attention_seq_table_axis(params, x, mesh):
    body = lambda p, x: _pairs_seq_local(p, x, offset_axis="dp")
    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P("dp", "seq")),
                         out_specs=P("dp", "seq"))(params, x)


# ---- partial NeoX rotary from position ids, heads over tp ----------------------------------------

H2, HD2, ROT = 4, 16, 8


def partial_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"wq": f(D, H2, HD2), "wk": f(D, H2, HD2), "wv": f(D, H2, HD2), "wo": f(H2, HD2, D)}
    return params, f(B, T, D), jax.ShapeDtypeStruct((B, T), jnp.int32)


def _angles(positions):
    inv = BASE ** (-jnp.arange(0, ROT, 2, dtype=jnp.float32) / ROT)
    ang = positions.astype(jnp.float32)[..., None] * inv               # [B, T, ROT/2]
    return jnp.cos(ang)[:, :, None, :], jnp.sin(ang)[:, :, None, :]


def rotate_half(x):
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def _partial_rope(x, cos, sin):
    rot, keep = x[..., :ROT], x[..., ROT:]
    cos, sin = jnp.concatenate([cos, cos], -1), jnp.concatenate([sin, sin], -1)
    return jnp.concatenate([rot * cos + rotate_half(rot) * sin, keep], axis=-1)


def partial_rope_attention(params, x, positions):
    cos, sin = _angles(positions)
    q = _partial_rope(jnp.einsum("btd,dhe->bthe", x, params["wq"]), cos, sin)
    k = _partial_rope(jnp.einsum("btd,dhe->bthe", x, params["wk"]), cos, sin)
    v = jnp.einsum("btd,dhe->bthe", x, params["wv"])
    s = jnp.einsum("bqhe,bkhe->bhqk", q, k) / jnp.sqrt(float(HD2))
    s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -jnp.inf)
    o = jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(s, axis=-1), v)
    return x + jnp.einsum("bqhe,hed->bqd", o, params["wo"])


def _fused_rope(t, cos, sin):
    cos2 = jnp.concatenate([cos, cos], -1)
    signed_sin = jnp.concatenate([-sin, sin], -1)
    rot = t[..., :ROT]
    swapped = jnp.roll(rot, ROT // 2, axis=-1)
    return jnp.concatenate([rot * cos2 + swapped * signed_sin, t[..., ROT:]], axis=-1)


def _fused_rope_sign(t, cos, sin):
    cos2 = jnp.concatenate([cos, cos], -1)
    signed_sin = jnp.concatenate([sin, -sin], -1)
    rot = t[..., :ROT]
    swapped = jnp.roll(rot, ROT // 2, axis=-1)
    return jnp.concatenate([rot * cos2 + swapped * signed_sin, t[..., ROT:]], axis=-1)


def _heads_local(params, x, positions, rope):
    cos, sin = _angles(positions)
    q = rope(jnp.einsum("btd,dhe->bthe", x, params["wq"]), cos, sin)
    k = rope(jnp.einsum("btd,dhe->bthe", x, params["wk"]), cos, sin)
    v = jnp.einsum("btd,dhe->bthe", x, params["wv"])
    s = jnp.einsum("bqhe,bkhe->bhqk", q, k) * HD2 ** -0.5
    t = x.shape[1]
    s = jnp.where(jnp.arange(t)[:, None] >= jnp.arange(t)[None, :], s, -jnp.inf)
    o = jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(s, axis=-1), v)
    return x + lax.psum(jnp.einsum("bqhe,hed->bqd", o, params["wo"]), "tp")


_TP_SPECS = ({"wq": P(None, "tp"), "wk": P(None, "tp"), "wv": P(None, "tp"), "wo": P("tp")}, P(), P())


def partial_rope_attention_tp(params, x, positions, mesh):
    body = lambda p, x, pos: _heads_local(p, x, pos, _fused_rope)
    return jax.shard_map(body, mesh=mesh, in_specs=_TP_SPECS, out_specs=P())(params, x, positions)


def partial_rope_attention_tp_sign(params, x, positions, mesh):
    body = lambda p, x, pos: _heads_local(p, x, pos, _fused_rope_sign)
    return jax.shard_map(body, mesh=mesh, in_specs=_TP_SPECS, out_specs=P())(params, x, positions)
