"""T5-style decoder cross-attention sub-block + ReLU FFN (RMS "layer norm" without mean or bias, no
1/sqrt(d) logit scaling, as in T5), with the encoder output normalised by the encoder's final norm.

Sharded by jit alone on {data: 2, model: 4} (no shard_map):
- `cross_block_jit`: one `jax.jit` with `in_shardings` / `out_shardings` of NamedShardings (batch
  over data, heads and FFN hidden over model) and `with_sharding_constraint` on q/k/v heads;
- `cross_block_cached_kv`: serving-style split in two jitted functions under `jax.named_scope`:
  the encoder K/V projections computed once (`out_shardings` on the head axis), then the decoder
  step consumes them; constraints through a small logical-axis rule table.
"""
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

B, SD, SE, D, H, HD, F = 4, 8, 12, 32, 4, 8, 64


def cross_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"enc_norm": f(D), "ln_cross": f(D), "ln_ff": f(D),
              "q": f(D, H, HD), "k": f(D, H, HD), "v": f(D, H, HD), "o": f(H, HD, D),
              "wi": f(D, F), "wo": f(F, D)}
    return params, f(B, SD, D), f(B, SE, D)


def t5_norm(x, w):
    return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + 1e-6) * w


def _attend(q, k, v):
    w = jax.nn.softmax(jnp.einsum("bqhk,bshk->bhqs", q, k), axis=-1)
    return jnp.einsum("bhqs,bshk->bqhk", w, v)


def cross_block(p, dec, enc):
    enc = t5_norm(enc, p["enc_norm"])
    h = t5_norm(dec, p["ln_cross"])
    q = jnp.einsum("bsd,dhk->bshk", h, p["q"])
    k = jnp.einsum("bsd,dhk->bshk", enc, p["k"])
    v = jnp.einsum("bsd,dhk->bshk", enc, p["v"])
    dec = dec + jnp.einsum("bqhk,hkd->bqd", _attend(q, k, v), p["o"])
    h = t5_norm(dec, p["ln_ff"])
    return dec + jax.nn.relu(h @ p["wi"]) @ p["wo"]


# ---- one jit with in/out shardings -------------------------------------------------------------

def _param_specs():
    heads = P(None, "model")
    return {"enc_norm": P(), "ln_cross": P(), "ln_ff": P(), "q": heads, "k": heads, "v": heads,
            "o": P("model"), "wi": P(None, "model"), "wo": P("model")}


def _block_constrained(mesh, key_axis):
    def heads(t):
        return jax.lax.with_sharding_constraint(t, NamedSharding(mesh, P("data", None, "model")))

    def block(p, dec, enc):
        enc = t5_norm(enc, p["enc_norm"])
        h = t5_norm(dec, p["ln_cross"])
        q = heads(jnp.einsum("bsd,dhk->bshk", h, p["q"]))
        k = heads(jnp.einsum("bsd,dhk->bshk", enc, p["k"]))
        v = heads(jnp.einsum("bsd,dhk->bshk", enc, p["v"]))
        w = jax.nn.softmax(jnp.einsum("bqhk,bshk->bhqs", q, k), axis=key_axis)
        dec = dec + jnp.einsum("bqhk,hkd->bqd", jnp.einsum("bhqs,bshk->bqhk", w, v), p["o"])
        h = t5_norm(dec, p["ln_ff"])
        return dec + jax.nn.relu(h @ p["wi"]) @ p["wo"]
    return block


def _jit_block(key_axis, p, dec, enc, mesh):
    ns = lambda spec: NamedSharding(mesh, spec)
    fn = jax.jit(_block_constrained(mesh, key_axis),
                 in_shardings=(jax.tree_util.tree_map(ns, _param_specs()), ns(P("data")), ns(P("data"))),
                 out_shardings=ns(P("data")))
    return fn(p, dec, enc)


def cross_block_jit(p, dec, enc, mesh):
    return _jit_block(-1, p, dec, enc, mesh)


def cross_block_jit_query_softmax(p, dec, enc, mesh):
    return _jit_block(-2, p, dec, enc, mesh)


# ---- encoder K/V cached once, decoder step separately -------------------------------------------

RULES = {"batch": "data", "heads": "model", "mlp": "model", "seq": None, "embed": None, "kv": None}


def _logical(mesh, *names):
    return NamedSharding(mesh, P(*(RULES[n] for n in names)))


def _encoder_kv(p, enc, mesh, normalise):
    @jax.named_scope("encoder_kv")
    def project(p, enc):
        if normalise:
            enc = t5_norm(enc, p["enc_norm"])
        return (jnp.einsum("bsd,dhk->bshk", enc, p["k"]), jnp.einsum("bsd,dhk->bshk", enc, p["v"]))

    kv_sharding = _logical(mesh, "batch", "seq", "heads", "kv")
    return jax.jit(project, out_shardings=(kv_sharding, kv_sharding))(p, enc)


def _decoder_step(p, dec, k, v, mesh):
    @jax.named_scope("decoder_cross")
    def step(p, dec, k, v):
        h = t5_norm(dec, p["ln_cross"])
        q = jax.lax.with_sharding_constraint(jnp.einsum("bsd,dhk->bshk", h, p["q"]),
                                             _logical(mesh, "batch", "seq", "heads", "kv"))
        dec = dec + jnp.einsum("bqhk,hkd->bqd", _attend(q, k, v), p["o"])
        h = t5_norm(dec, p["ln_ff"])
        mid = jax.lax.with_sharding_constraint(jax.nn.relu(h @ p["wi"]),
                                               _logical(mesh, "batch", "seq", "mlp"))
        return dec + mid @ p["wo"]

    return jax.jit(step, out_shardings=_logical(mesh, "batch", "seq", "embed"))(p, dec, k, v)


def cross_block_cached_kv(p, dec, enc, mesh):
    k, v = _encoder_kv(p, enc, mesh, normalise=True)
    return _decoder_step(p, dec, k, v, mesh)


def cross_block_cached_kv_no_enc_norm(p, dec, enc, mesh):
    k, v = _encoder_kv(p, enc, mesh, normalise=False)
    return _decoder_step(p, dec, k, v, mesh)
