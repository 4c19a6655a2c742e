"""BERT-style post-LN encoder (2 layers, biases everywhere, GELU FFN) with word + position +
token-type embeddings; token types are derived from the ids as BERT builds them (0 up to and
including the first [SEP], 1 after it). Sharded by jit alone, no shard_map.

- `encoder_rules`: on {data: 2, model: 4}: parameters constrained by t5x-style regex partition
  rules matched against the parameter paths (`tree_map_with_path`), activations by
  `with_sharding_constraint` hooks passed into the shared layer code;
- `encoder_explicit`: on {data: 2, model: 2}: the encoder runs inside
  `jax.sharding.explicit_axes` with `in_sharding` for the inputs and `jax.sharding.reshard` of the
  activations between sub-layers.
"""
import re

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

B, S, D, H, F, V, MAX_POS, LAYERS = 4, 16, 32, 4, 64, 16, 32, 2
HD = D // H
SEP = 3


def bert_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    ln = lambda: {"g": f(D), "b": f(D)}
    layer = lambda: {"wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD), "wo": f(H, HD, D),
                     "bo": f(D), "ln1": ln(), "w1": f(D, F), "b1": f(F), "w2": f(F, D), "b2": f(D),
                     "ln2": ln()}
    params = {"word": f(V, D), "pos": f(MAX_POS, D), "type": f(2, D), "emb_ln": ln(),
              "layers": [layer() for _ in range(LAYERS)]}
    return params, jax.ShapeDtypeStruct((B, S), jnp.int32)


def layer_norm(x, p):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + 1e-12) * p["g"] + p["b"]


def token_types(tokens):
    is_sep = (tokens == SEP).astype(jnp.int32)
    return jnp.minimum(jnp.cumsum(is_sep, axis=1) - is_sep, 1)


def embed(p, tokens, positions):
    x = p["word"][tokens] + p["pos"][positions][None] + p["type"][token_types(tokens)]
    return layer_norm(x, p["emb_ln"])


def _no_constraint(kind, value):
    return value


def self_attention(p, x, constrain):
    q = constrain("heads", jnp.einsum("bsd,dhk->bshk", x, p["wq"]))
    k = constrain("heads", jnp.einsum("bsd,dhk->bshk", x, p["wk"]))
    v = constrain("heads", jnp.einsum("bsd,dhk->bshk", x, p["wv"]))
    probs = jax.nn.softmax(jnp.einsum("bqhk,bshk->bhqs", q, k) / jnp.sqrt(HD * 1.0), axis=-1)
    return jnp.einsum("bhqs,bshk,hkd->bqd", probs, v, p["wo"]) + p["bo"]


def encoder_layer(p, x, constrain=_no_constraint):
    x = constrain("hidden", layer_norm(x + self_attention(p, x, constrain), p["ln1"]))
    h = constrain("ffn", jax.nn.gelu(x @ p["w1"] + p["b1"]))
    return constrain("hidden", layer_norm(x + h @ p["w2"] + p["b2"], p["ln2"]))


def encoder(p, tokens):
    x = embed(p, tokens, jnp.arange(S))
    for lp in p["layers"]:
        x = encoder_layer(lp, x)
    return x


# ---- regex partition rules + with_sharding_constraint ---------------------------------------------------

PARAM_RULES = [
    (r"layers/\d+/w[qkv]$", P(None, "model", None)),
    (r"layers/\d+/wo$", P("model", None, None)),
    (r"layers/\d+/w1$", P(None, "model")),
    (r"layers/\d+/b1$", P("model")),
    (r"layers/\d+/w2$", P("model", None)),
    (r"(word|pos)$", P(None, "model")),
    (r".*", P()),
]
ACTIVATION_RULES = {"heads": P("data", None, "model", None), "ffn": P("data", None, "model"),
                    "hidden": P("data", None, None)}


def _path_name(path):
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def _spec_for(path):
    name = _path_name(path)
    return next(spec for pattern, spec in PARAM_RULES if re.search(pattern, name))


def _encoder_with_rules(p, tokens, mesh, positions):
    p = jax.tree_util.tree_map_with_path(
        lambda path, v: jax.lax.with_sharding_constraint(v, NamedSharding(mesh, _spec_for(path))), p)
    tokens = jax.lax.with_sharding_constraint(tokens, NamedSharding(mesh, P("data", None)))
    constrain = lambda kind, v: jax.lax.with_sharding_constraint(
        v, NamedSharding(mesh, ACTIVATION_RULES[kind]))
    x = constrain("hidden", embed(p, tokens, positions))
    for lp in p["layers"]:
        x = encoder_layer(lp, x, constrain)
    return x


def encoder_rules(p, tokens, mesh):
    return _encoder_with_rules(p, tokens, mesh, positions=jnp.arange(S))


def encoder_rules_position_offset(p, tokens, mesh):
    return _encoder_with_rules(p, tokens, mesh, positions=jnp.arange(S) + 1)


# ---- explicit axes + reshard ---------------------------------------------------------------------------

def _embed_explicit(p, tokens):
    rows = P("data", None, None)
    x = (p["word"].at[tokens].get(out_sharding=rows) + p["pos"][:S][None]
         + p["type"].at[token_types(tokens)].get(out_sharding=rows))
    return layer_norm(x, p["emb_ln"])


def _explicit_body(p, tokens):
    x = _embed_explicit(p, tokens)
    for lp in p["layers"]:
        attn = self_attention(lp, x, lambda kind, v: jax.sharding.reshard(v, P("data", None, "model", None)))
        x = jax.sharding.reshard(layer_norm(x + attn, lp["ln1"]), P("data", None, None))
        h = jax.sharding.reshard(jax.nn.gelu(x @ lp["w1"] + lp["b1"]), P("data", None, "model"))
        x = jax.sharding.reshard(layer_norm(x + h @ lp["w2"] + lp["b2"], lp["ln2"]), P("data", None, None))
    return x


def _explicit_body_ffn_without_residual(p, tokens):
    x = _embed_explicit(p, tokens)
    for lp in p["layers"]:
        attn = self_attention(lp, x, lambda kind, v: jax.sharding.reshard(v, P("data", None, "model", None)))
        x = jax.sharding.reshard(layer_norm(x + attn, lp["ln1"]), P("data", None, None))
        h = jax.sharding.reshard(jax.nn.gelu(x @ lp["w1"] + lp["b1"]), P("data", None, "model"))
        x = jax.sharding.reshard(layer_norm(h @ lp["w2"] + lp["b2"], lp["ln2"]), P("data", None, None))
    return x


def _explicit(body, p, tokens):
    in_specs = (jax.tree_util.tree_map(lambda _: P(), p), P("data", None))
    return jax.sharding.explicit_axes(body, axes=("data", "model"), in_sharding=in_specs)(p, tokens)


def encoder_explicit(p, tokens, mesh):
    return _explicit(_explicit_body, p, tokens)


def encoder_explicit_ffn_without_residual(p, tokens, mesh):
    return _explicit(_explicit_body_ffn_without_residual, p, tokens)
