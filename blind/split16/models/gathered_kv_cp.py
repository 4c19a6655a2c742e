"""Pre-LN GPT block written for ONE sequence ([S, D] in, [S, D] out) and `jax.vmap`-ed over the
batch: LayerNorm with bias, causal multi-head attention, GELU MLP, two residuals.

Context parallel on {batch: 2, seq: 4}: each device holds a contiguous chunk of S/4 tokens.

- `cp_gather_kv`: local q, k, v; k and v all-gathered over `seq` (tiled); the causal mask compares
  global query positions (`axis_index * chunk + iota`) with global key positions;
- `cp_gather_x`: the normalised activations are all-gathered untiled ([seq, chunk, D] reshaped),
  k and v are computed from the whole sequence, queries from the local chunk only.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H, F = 4, 16, 32, 4, 64
HD = D // H
SP = 4
C = S // SP


def block_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {
        "ln1": {"g": f(D), "b": f(D)}, "ln2": {"g": f(D), "b": f(D)},
        "attn": {"wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD), "wo": f(H, HD, D)},
        "mlp": {"w_in": f(D, F), "b_in": f(F), "w_out": f(F, D), "b_out": f(D)},
    }
    return params, f(B, S, D)


def layer_norm(p, x):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + 1e-5) * p["g"] + p["b"]


def mlp(p, x):
    return jax.nn.gelu(x @ p["w_in"] + p["b_in"]) @ p["w_out"] + p["b_out"]


def attend(p, xq, xkv, q_pos, k_pos):
    q = jnp.einsum("sd,dhe->hse", xq, p["wq"])
    k = jnp.einsum("sd,dhe->hse", xkv, p["wk"])
    v = jnp.einsum("sd,dhe->hse", xkv, p["wv"])
    logits = jnp.einsum("hqe,hke->hqk", q, k) / jnp.sqrt(jnp.float32(HD))
    logits = jnp.where(q_pos[:, None] >= k_pos[None, :], logits, -jnp.inf)
    o = jnp.einsum("hqk,hke->hqe", jax.nn.softmax(logits, axis=-1), v)
    return jnp.einsum("hqe,hed->qd", o, p["wo"])


def block_one(params, x):
    pos = jnp.arange(x.shape[0])
    h = layer_norm(params["ln1"], x)
    x = x + attend(params["attn"], h, h, pos, pos)
    return x + mlp(params["mlp"], layer_norm(params["ln2"], x))


def block(params, x):
    return jax.vmap(block_one, in_axes=(None, 0))(params, x)


# ---- gather k/v --------------------------------------------------------------------------------------

def _attend_gathered_kv(p, h, q_pos):
    q = jnp.einsum("sd,dhe->hse", h, p["wq"])
    k = lax.all_gather(jnp.einsum("sd,dhe->hse", h, p["wk"]), "seq", axis=1, tiled=True)
    v = lax.all_gather(jnp.einsum("sd,dhe->hse", h, p["wv"]), "seq", axis=1, tiled=True)
    k_pos = jnp.arange(S)
    logits = jnp.einsum("hqe,hke->hqk", q, k) / jnp.sqrt(jnp.float32(HD))
    logits = jnp.where(q_pos[:, None] >= k_pos[None, :], logits, -jnp.inf)
    o = jnp.einsum("hqk,hke->hqe", jax.nn.softmax(logits, axis=-1), v)
    return jnp.einsum("hqe,hed->qd", o, p["wo"])


def _chunk_one_gather_kv(params, x):
    q_pos = lax.axis_index("seq") * C + jnp.arange(C)
    h = layer_norm(params["ln1"], x)
    x = x + _attend_gathered_kv(params["attn"], h, q_pos)
    return x + mlp(params["mlp"], layer_norm(params["ln2"], x))


def _chunk_one_gather_kv_unscaled(params, x):
    q_pos = lax.axis_index("seq") + jnp.arange(C)
    h = layer_norm(params["ln1"], x)
    x = x + _attend_gathered_kv(params["attn"], h, q_pos)
    return x + mlp(params["mlp"], layer_norm(params["ln2"], x))


def _cp(chunk_fn, params, x, mesh):
    local = jax.vmap(chunk_fn, in_axes=(None, 0))
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("batch", "seq")),
                         out_specs=P("batch", "seq"))(params, x)


def cp_gather_kv(params, x, mesh):
    return _cp(_chunk_one_gather_kv, params, x, mesh)


def cp_gather_kv_position_offset(params, x, mesh):
    return _cp(_chunk_one_gather_kv_unscaled, params, x, mesh)


# ---- gather the normalised activations -------------------------------------------------------------

def _gathered_positions():
    return lax.axis_index("seq") * C + jnp.arange(C), jnp.arange(S)


def _chunk_one_gather_x(params, x):
    q_pos, k_pos = _gathered_positions()
    h = layer_norm(params["ln1"], x)
    h_all = lax.all_gather(h, "seq").reshape(S, D)
    x = x + attend(params["attn"], h, h_all, q_pos, k_pos)
    return x + mlp(params["mlp"], layer_norm(params["ln2"], x))


def _chunk_one_gather_x_no_residual(params, x):
    q_pos, k_pos = _gathered_positions()
    h = layer_norm(params["ln1"], x)
    h_all = lax.all_gather(h, "seq").reshape(S, D)
    x = attend(params["attn"], h, h_all, q_pos, k_pos)
    return x + mlp(params["mlp"], layer_norm(params["ln2"], x))


def cp_gather_x(params, x, mesh):
    return _cp(_chunk_one_gather_x, params, x, mesh)


def cp_gather_x_no_residual(params, x, mesh):
    return _cp(_chunk_one_gather_x_no_residual, params, x, mesh)
