"""A hand-written named-axis layer (Penzai-like `Named` arrays: every dim has a name, einsums and
reductions are by name) with MaxText-style logical axis rules mapping dim names to mesh axes.

The references are the original positional jnp code. The sharded versions are the team's refactor to
named arrays, sharded by jit alone: in/out shardings and with_sharding_constraint derived from the
logical rules on {data: 2, model: 4} (batch over data, mlp hidden units / heads over model).
"""
import dataclasses
import math
import string

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

B, S, E, M, H, K = 4, 8, 16, 64, 4, 8
RULES = {"batch": "data", "mlp": "model", "heads": "model"}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Named:
    array: jax.Array
    names: tuple[str, ...] = dataclasses.field(metadata=dict(static=True))

    def rename(self, **renames):
        return Named(self.array, tuple(renames.get(n, n) for n in self.names))


def nmap(fn, *xs):
    """Elementwise op over named arrays with identical names."""
    return Named(fn(*(x.array for x in xs)), xs[0].names)


def align(x, names):
    return Named(jnp.transpose(x.array, [x.names.index(n) for n in names]), tuple(names))


def contract(a, b, out):
    letters = {n: string.ascii_letters[i] for i, n in enumerate(dict.fromkeys(a.names + b.names))}
    spec = "".join(letters[n] for n in a.names) + "," + "".join(letters[n] for n in b.names)
    return Named(jnp.einsum(spec + "->" + "".join(letters[n] for n in out), a.array, b.array), out)


def reduce(fn, x, name):
    axis = x.names.index(name)
    return Named(fn(x.array, axis=axis, keepdims=True), x.names[:axis] + ("_",) + x.names[axis + 1:])


def broadcast_to(x, like):
    """Drop the reduced "_" dims and broadcast to `like`'s names."""
    kept = tuple(n for n in x.names if n != "_")
    arr = jnp.squeeze(x.array, axis=tuple(i for i, n in enumerate(x.names) if n == "_"))
    arr = jnp.transpose(arr, [kept.index(n) for n in like.names if n in kept])
    arr = jnp.expand_dims(arr, tuple(i for i, n in enumerate(like.names) if n not in kept))
    return Named(jnp.broadcast_to(arr, like.array.shape), like.names)


def logical_spec(names):
    return P(*(RULES.get(n) for n in names))


def constrain(x, mesh):
    return Named(jax.lax.with_sharding_constraint(x.array, NamedSharding(mesh, logical_spec(x.names))),
                 x.names)


# ---- 1. LayerNorm + GELU MLP ----------------------------------------------------------------------

def mlp_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"w1": f(E, M), "b1": f(M), "w2": f(M, E)}, f(B, S, E)


def mlp_block(p, x):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    h = (x - mu) / jnp.sqrt(var + 1e-5)
    return x + jax.nn.gelu(h @ p["w1"] + p["b1"]) @ p["w2"]


def _named_layer_norm(x, over):
    mu = broadcast_to(reduce(jnp.mean, x, over), x)
    centred = nmap(jnp.subtract, x, mu)
    var = broadcast_to(reduce(jnp.mean, nmap(jnp.square, centred), over), x)
    return nmap(lambda c, v: c / jnp.sqrt(v + 1e-5), centred, var)


def _named_mlp(p, x, mesh, norm_over):
    x = constrain(Named(x, ("batch", "seq", "embed")), mesh)
    w1, w2 = Named(p["w1"], ("embed", "mlp")), Named(p["w2"], ("mlp", "embed"))
    h = _named_layer_norm(x, norm_over)
    up = contract(h, w1, ("batch", "seq", "mlp"))
    up = constrain(nmap(lambda u, b: jax.nn.gelu(u + b), up, broadcast_to(Named(p["b1"], ("mlp",)), up)),
                   mesh)
    down = contract(up, w2, ("batch", "seq", "embed"))
    return nmap(jnp.add, x, down).array


def _jit_mlp(p, x, mesh, norm_over):
    shard = lambda names: NamedSharding(mesh, logical_spec(names))
    p_shardings = {"w1": shard(("embed", "mlp")), "b1": shard(("mlp",)), "w2": shard(("mlp", "embed"))}
    fn = jax.jit(lambda p, x: _named_mlp(p, x, mesh, norm_over),
                 in_shardings=(p_shardings, shard(("batch", "seq", "embed"))),
                 out_shardings=shard(("batch", "seq", "embed")))
    return fn(p, x)


def mlp_block_named(p, x, mesh):
    return _jit_mlp(p, x, mesh, norm_over="embed")


def mlp_block_named_norm_axis(p, x, mesh):
    return _jit_mlp(p, x, mesh, norm_over="seq")


# ---- 2. causal self-attention ---------------------------------------------------------------------

def attn_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"wq": f(E, H, K), "wk": f(E, H, K), "wv": f(E, H, K), "wo": f(H, K, E)}, f(B, S, E)


def attention(p, x):
    q, k, v = (jnp.einsum("bse,ehk->bhsk", x, p[n]) for n in ("wq", "wk", "wv"))
    logits = jnp.einsum("bhqk,bhtk->bhqt", q, k) / math.sqrt(K)
    logits = jnp.where(jnp.tril(jnp.ones((S, S), bool)), logits, -1e30)
    ctx = jnp.einsum("bhqt,bhtk->bhqk", jax.nn.softmax(logits, axis=-1), v)
    return jnp.einsum("bhsk,hke->bse", ctx, p["wo"])


def _scaled(logits):
    return nmap(lambda a: a * (1.0 / math.sqrt(K)), logits)


def _unscaled(logits):
    return logits


def _named_attention(p, x, mesh, scale):
    x = constrain(Named(x, ("batch", "seq", "embed")), mesh)
    w = {n: Named(p[n], ("embed", "heads", "head_dim")) for n in ("wq", "wk", "wv")}
    qkv_names = ("batch", "heads", "seq", "head_dim")
    q, k, v = (constrain(contract(x, w[n], qkv_names), mesh) for n in ("wq", "wk", "wv"))
    k, v = k.rename(seq="kv_seq"), v.rename(seq="kv_seq")
    logits = scale(contract(q, k, ("batch", "heads", "seq", "kv_seq")))
    causal = jnp.arange(S)[:, None] >= jnp.arange(S)[None, :]
    logits = nmap(lambda a: jnp.where(causal, a, -1e30), logits)
    probs = align(nmap(lambda a: jax.nn.softmax(a, axis=-1), logits), ("batch", "heads", "seq", "kv_seq"))
    ctx = contract(probs, v, ("batch", "seq", "heads", "head_dim"))
    out = contract(ctx, Named(p["wo"], ("heads", "head_dim", "embed")), ("batch", "seq", "embed"))
    return constrain(out, mesh).array


def _jit_attention(p, x, mesh, scale):
    shard = lambda names: NamedSharding(mesh, logical_spec(names))
    w_shard = shard(("embed", "heads", "head_dim"))
    fn = jax.jit(lambda p, x: _named_attention(p, x, mesh, scale),
                 in_shardings=({"wq": w_shard, "wk": w_shard, "wv": w_shard,
                                "wo": shard(("heads", "head_dim", "embed"))},
                               shard(("batch", "seq", "embed"))),
                 out_shardings=shard(("batch", "seq", "embed")))
    return fn(p, x)


def attention_named(p, x, mesh):
    return _jit_attention(p, x, mesh, _scaled)


def attention_named_unscaled(p, x, mesh):
    return _jit_attention(p, x, mesh, _unscaled)
