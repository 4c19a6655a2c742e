"""OLMo-2-style decoder layer: post-sub-layer RMSNorms (x + norm(attn(x)), h + norm(mlp(h))) and
QK-norm over the FULL query / key projection width (all heads at once, as OLMo-2 does, not per
head), causal multi-head attention, SwiGLU. Parameters are a flat dict keyed like a checkpoint.

- `layer_tp`: on {data: 2, model: 4}: batch over data, heads / FFN columns over model; the QK-norm
  statistics (sum of squares over all heads) are psum-reduced over model before the rsqrt;
- `layer_tp_gather_qk`: on {model: 8} (one head per device): the local q / k columns are
  all-gathered, normalised over the full width, and the device's own columns are cut back out with
  `lax.dynamic_slice_in_dim` at `axis_index * HD`.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H, F = 4, 8, 32, 8, 64
HD = D // H
EPS = 1e-6


def rms_norm(x, w):
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS) * w


def layer_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"attn.q_proj": f(D, H * HD), "attn.k_proj": f(D, H * HD), "attn.v_proj": f(D, H * HD),
              "attn.o_proj": f(H * HD, D), "attn.q_norm": f(H * HD), "attn.k_norm": f(H * HD),
              "post_attention_layernorm": f(D), "mlp.gate_proj": f(D, F), "mlp.up_proj": f(D, F),
              "mlp.down_proj": f(F, D), "post_feedforward_layernorm": f(D)}
    return params, f(B, S, D)


def _attend(q, k, v):
    b, s, width = q.shape
    heads = width // HD
    q, k, v = (t.reshape(b, s, heads, HD) for t in (q, k, v))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(HD).astype(q.dtype)
    causal = jnp.tril(jnp.ones((s, s), bool))
    probs = jax.nn.softmax(jnp.where(causal, scores, -1e30), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, width)


def layer(p, x):
    q = rms_norm(x @ p["attn.q_proj"], p["attn.q_norm"])
    k = rms_norm(x @ p["attn.k_proj"], p["attn.k_norm"])
    attn = _attend(q, k, x @ p["attn.v_proj"]) @ p["attn.o_proj"]
    h = x + rms_norm(attn, p["post_attention_layernorm"])
    mlp = (jax.nn.silu(h @ p["mlp.gate_proj"]) * (h @ p["mlp.up_proj"])) @ p["mlp.down_proj"]
    return h + rms_norm(mlp, p["post_feedforward_layernorm"])


# ---- tensor parallel -------------------------------------------------------------------------------

COL, ROW, VEC, REP = P(None, "model"), P("model", None), P("model"), P()
SPECS = {"attn.q_proj": COL, "attn.k_proj": COL, "attn.v_proj": COL, "attn.o_proj": ROW,
         "attn.q_norm": VEC, "attn.k_norm": VEC, "post_attention_layernorm": REP,
         "mlp.gate_proj": COL, "mlp.up_proj": COL, "mlp.down_proj": ROW,
         "post_feedforward_layernorm": REP}


def _qk_norm_sharded(t, w):
    sum_sq = lax.psum(jnp.sum(t * t, axis=-1, keepdims=True), "model")
    return t * lax.rsqrt(sum_sq / (H * HD) + EPS) * w


def _qk_norm_local_stats(t, w):
    mean_sq = jnp.mean(t * t, axis=-1, keepdims=True)
    return t * lax.rsqrt(mean_sq + EPS) * w


def _layer_local(p, x, qk_norm):
    q = qk_norm(x @ p["attn.q_proj"], p["attn.q_norm"])
    k = qk_norm(x @ p["attn.k_proj"], p["attn.k_norm"])
    attn = lax.psum(_attend(q, k, x @ p["attn.v_proj"]) @ p["attn.o_proj"], "model")
    h = x + rms_norm(attn, p["post_attention_layernorm"])
    mlp = (jax.nn.silu(h @ p["mlp.gate_proj"]) * (h @ p["mlp.up_proj"])) @ p["mlp.down_proj"]
    return h + rms_norm(lax.psum(mlp, "model"), p["post_feedforward_layernorm"])


def layer_tp(p, x, mesh):
    local = lambda p, x: _layer_local(p, x, _qk_norm_sharded)
    return jax.shard_map(local, mesh=mesh, in_specs=(SPECS, P("data")), out_specs=P("data"),
                         check_vma=False)(p, x)


def layer_tp_local_qk_stats(p, x, mesh):
    local = lambda p, x: _layer_local(p, x, _qk_norm_local_stats)
    return jax.shard_map(local, mesh=mesh, in_specs=(SPECS, P("data")), out_specs=P("data"),
                         check_vma=False)(p, x)


GATHER_SPECS = dict(SPECS, **{"attn.q_norm": REP, "attn.k_norm": REP})


def _own_columns(full):
    return lax.dynamic_slice_in_dim(full, lax.axis_index("model") * HD, HD, axis=-1)


def _gathered_qk_norm(t, w):
    full = lax.all_gather(t, "model", axis=2, tiled=True)
    return _own_columns(rms_norm(full, w))


def layer_tp_gather_qk(p, x, mesh):
    def local(p, x):
        q = _gathered_qk_norm(x @ p["attn.q_proj"], p["attn.q_norm"])
        k = _gathered_qk_norm(x @ p["attn.k_proj"], p["attn.k_norm"])
        attn = lax.psum(_attend(q, k, x @ p["attn.v_proj"]) @ p["attn.o_proj"], "model")
        h = x + rms_norm(attn, p["post_attention_layernorm"])
        mlp = (jax.nn.silu(h @ p["mlp.gate_proj"]) * (h @ p["mlp.up_proj"])) @ p["mlp.down_proj"]
        return h + rms_norm(lax.psum(mlp, "model"), p["post_feedforward_layernorm"])
    return jax.shard_map(local, mesh=mesh, in_specs=(GATHER_SPECS, P()), out_specs=P(),
                         check_vma=False)(p, x)


def layer_tp_gather_qk_norm_before_psum(p, x, mesh):
    def local(p, x):
        q = _gathered_qk_norm(x @ p["attn.q_proj"], p["attn.q_norm"])
        k = _gathered_qk_norm(x @ p["attn.k_proj"], p["attn.k_norm"])
        attn = _attend(q, k, x @ p["attn.v_proj"]) @ p["attn.o_proj"]
        h = x + lax.psum(rms_norm(attn, p["post_attention_layernorm"]), "model")
        mlp = (jax.nn.silu(h @ p["mlp.gate_proj"]) * (h @ p["mlp.up_proj"])) @ p["mlp.down_proj"]
        return h + rms_norm(lax.psum(mlp, "model"), p["post_feedforward_layernorm"])
    return jax.shard_map(local, mesh=mesh, in_specs=(GATHER_SPECS, P()), out_specs=P(),
                         check_vma=False)(p, x)
