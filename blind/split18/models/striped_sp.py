"""Sequence parallelism in two styles, on {sp: 4} (batch replicated).

1. Striped causal attention (Brandon et al., load-balanced context parallelism): token t lives on
   device t % 4, so every device holds every 4th token and gets the same causal work. The wrapper
   permutes the tokens into striped order, each device projects its tokens, all-gathers K / V over
   sp (they arrive device-major, so gathered key j is token (j % S_LOCAL) * 4 + j // S_LOCAL) and
   masks with those token positions; the output is permuted back.
2. Megatron-SP MLP sub-layer: activations sharded on the sequence between sub-layers; LayerNorm on
   the local tokens, all-gather over the sequence, column/row-parallel GELU MLP over the same
   axis, `psum_scatter` back onto the sequence, then the residual; a final LayerNorm.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, NH, F = 2, 16, 32, 2, 64
HD = D // NH
N = 4
S_LOCAL = S // N
EPS = 1e-5


def attn_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"wq": f(D, D), "wk": f(D, D), "wv": f(D, D), "wo": f(D, D)}, f(B, S, D)


def _heads(t):
    return t.reshape(t.shape[0], t.shape[1], NH, HD)


def _masked_attention(q, k, v, allowed):
    scores = jnp.einsum("bqhd,bkhd->bhqk", _heads(q), _heads(k)) / jnp.sqrt(jnp.float32(HD))
    probs = jax.nn.softmax(jnp.where(allowed, scores, -jnp.inf), axis=-1)
    ctx = jnp.einsum("bhqk,bkhd->bqhd", probs, _heads(v))
    return ctx.reshape(q.shape[0], q.shape[1], D)


def causal_attention(p, x):
    pos = jnp.arange(S)
    allowed = pos[None, :] <= pos[:, None]
    return _masked_attention(x @ p["wq"], x @ p["wk"], x @ p["wv"], allowed) @ p["wo"]


def _to_striped(x):
    return x.reshape(B, S_LOCAL, N, D).swapaxes(1, 2).reshape(B, S, D)


def _from_striped(x):
    return x.reshape(B, N, S_LOCAL, D).swapaxes(1, 2).reshape(B, S, D)


def _striped_local(p, x):
    k = lax.all_gather(x @ p["wk"], "sp", axis=1, tiled=True)
    v = lax.all_gather(x @ p["wv"], "sp", axis=1, tiled=True)
    q_pos = jnp.arange(S_LOCAL) * N + lax.axis_index("sp")
    j = jnp.arange(S)
    k_pos = (j % S_LOCAL) * N + j // S_LOCAL
    return _masked_attention(x @ p["wq"], k, v, k_pos[None, :] <= q_pos[:, None]) @ p["wo"]


def _striped_local_contiguous_keys(p, x):
    k = lax.all_gather(x @ p["wk"], "sp", axis=1, tiled=True)
    v = lax.all_gather(x @ p["wv"], "sp", axis=1, tiled=True)
    q_pos = jnp.arange(S_LOCAL) * N + lax.axis_index("sp")
    k_pos = jnp.arange(S)
    return _masked_attention(x @ p["wq"], k, v, k_pos[None, :] <= q_pos[:, None]) @ p["wo"]


def striped_attention(p, x, mesh):
    out = jax.shard_map(_striped_local, mesh=mesh, in_specs=(P(), P(None, "sp")),
                        out_specs=P(None, "sp"), check_vma=False)(p, _to_striped(x))
    return _from_striped(out)


def striped_attention_contiguous_keys(p, x, mesh):
    out = jax.shard_map(_striped_local_contiguous_keys, mesh=mesh, in_specs=(P(), P(None, "sp")),
                        out_specs=P(None, "sp"), check_vma=False)(p, _to_striped(x))
    return _from_striped(out)


# ---- Megatron-SP MLP sub-layer ----------------------------------------------------------------------

def mlp_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"ln1_g": f(D), "ln1_b": f(D), "fc1": f(D, F), "fc1_b": f(F), "fc2": f(F, D), "fc2_b": f(D),
            "lnf_g": f(D), "lnf_b": f(D)}, f(B, S, D)


def layer_norm(x, g, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + EPS) * g + b


def mlp_block(p, x):
    h = jax.nn.gelu(layer_norm(x, p["ln1_g"], p["ln1_b"]) @ p["fc1"] + p["fc1_b"])
    x = x + h @ p["fc2"] + p["fc2_b"]
    return layer_norm(x, p["lnf_g"], p["lnf_b"])


MLP_SPECS = {"ln1_g": P(), "ln1_b": P(), "fc1": P(None, "sp"), "fc1_b": P("sp"), "fc2": P("sp", None),
             "fc2_b": P(), "lnf_g": P(), "lnf_b": P()}


def mlp_block_sp(p, x, mesh):
    def local(p, x):
        h = lax.all_gather(layer_norm(x, p["ln1_g"], p["ln1_b"]), "sp", axis=1, tiled=True)
        h = jax.nn.gelu(h @ p["fc1"] + p["fc1_b"])
        out = lax.psum_scatter(h @ p["fc2"], "sp", scatter_dimension=1, tiled=True)
        x = x + out + p["fc2_b"]
        return layer_norm(x, p["lnf_g"], p["lnf_b"])
    return jax.shard_map(local, mesh=mesh, in_specs=(MLP_SPECS, P(None, "sp")),
                         out_specs=P(None, "sp"), check_vma=False)(p, x)


def mlp_block_sp_residual_in_scatter(p, x, mesh):
    def local(p, x):
        gathered = lax.all_gather(x, "sp", axis=1, tiled=True)
        h = jax.nn.gelu(layer_norm(gathered, p["ln1_g"], p["ln1_b"]) @ p["fc1"] + p["fc1_b"])
        x = lax.psum_scatter(gathered + h @ p["fc2"], "sp", scatter_dimension=1, tiled=True)
        x = x + p["fc2_b"]
        return layer_norm(x, p["lnf_g"], p["lnf_b"])
    return jax.shard_map(local, mesh=mesh, in_specs=(MLP_SPECS, P(None, "sp")),
                         out_specs=P(None, "sp"), check_vma=False)(p, x)
