"""Two layers sharded by jit alone (no shard_map, no hand-written collectives) on {data: 2, model: 4},
logical dim names mapped to mesh axes by a MaxText-style rule table.

1. `glu_explicit`: RMSNorm + SwiGLU block with a residual in explicit-sharding mode: the code builds
   an Explicit-axes mesh over the devices it is handed, `reshard`s inputs and weights to their
   logical shardings, runs the norm under `auto_axes`, and every einsum states its `out_sharding`
   ("embed" dims replicated, "mlp" over model).
2. `attention_jit`: bidirectional multi-head attention; every activation and parameter goes through
   `constrain(x, logical_axes)` (`jax.lax.with_sharding_constraint`), the probabilities come from a
   nested `jax.jit` with `out_shardings` and are kept in a key-major [batch, heads, key, query]
   layout (so the softmax runs over axis -2).
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import AxisType, Mesh, NamedSharding, auto_axes, reshard
from jax.sharding import PartitionSpec as P

B, S, D, F, NH = 4, 8, 32, 64, 4
HD = D // NH
EPS = 1e-6
RULES = {"batch": "data", "mlp": "model", "heads": "model", "embed": None, "seq": None, "kv": None,
         "q_seq": None, "k_seq": None}


def _spec(names):
    return P(*(RULES[n] for n in names))


def constrain(x, names, mesh):
    return lax.with_sharding_constraint(x, NamedSharding(mesh, _spec(names)))


def _rms(x, g):
    return x * lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + EPS) * g


def glu_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"norm": f(D), "wi_0": f(D, F), "wi_1": f(D, F), "wo": f(F, D)}, f(B, S, D)


def glu_block(p, x):
    h = _rms(x, p["norm"])
    return x + (jax.nn.silu(h @ p["wi_0"]) * (h @ p["wi_1"])) @ p["wo"]


def _explicit_mesh(mesh):
    """The same devices with Explicit axes: shardings become part of the array types."""
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Explicit,) * len(mesh.axis_names))


def _glu_explicit(p, x, mesh, act):
    with jax.sharding.use_abstract_mesh(_explicit_mesh(mesh).abstract_mesh):
        x = reshard(x, _spec(("batch", "seq", "embed")))
        wi_0 = reshard(p["wi_0"], _spec(("embed", "mlp")))
        wi_1 = reshard(p["wi_1"], _spec(("embed", "mlp")))
        wo = reshard(p["wo"], _spec(("mlp", "embed")))
        h = auto_axes(_rms, out_sharding=_spec(("batch", "seq", "embed")))(x, reshard(p["norm"], P()))
        hidden = _spec(("batch", "seq", "mlp"))
        gate = jnp.einsum("bsd,df->bsf", h, wi_0, out_sharding=hidden)
        up = jnp.einsum("bsd,df->bsf", h, wi_1, out_sharding=hidden)
        y = jnp.einsum("bsf,fd->bsd", act(gate, up), wo, out_sharding=_spec(("batch", "seq", "embed")))
        return x + y


def glu_explicit(p, x, mesh):
    return _glu_explicit(p, x, mesh, lambda gate, up: jax.nn.silu(gate) * up)


def glu_explicit_swapped_gate(p, x, mesh):
    return _glu_explicit(p, x, mesh, lambda gate, up: jax.nn.silu(up) * gate)


# ---- attention ---------------------------------------------------------------------------------------

def attn_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"q": f(D, NH, HD), "k": f(D, NH, HD), "v": f(D, NH, HD), "o": f(NH, HD, D)}, f(B, S, D)


def attention(p, x):
    q, k, v = (jnp.einsum("bsd,dnh->bsnh", x, p[n]) for n in "qkv")
    logits = jnp.einsum("bqnh,bknh->bnqk", q, k) / jnp.sqrt(jnp.float32(HD))
    ctx = jnp.einsum("bnqk,bknh->bqnh", jax.nn.softmax(logits, axis=-1), v)
    return jnp.einsum("bqnh,nhd->bqd", ctx, p["o"])


def _attention_sharded(p, x, mesh, softmax_axis):
    c = functools.partial(constrain, mesh=mesh)
    x = c(x, ("batch", "seq", "embed"))
    q, k, v = (c(jnp.einsum("bsd,dnh->bsnh", x, c(p[n], ("embed", "heads", "kv"))),
                 ("batch", "seq", "heads", "kv")) for n in "qkv")

    @functools.partial(jax.jit, out_shardings=NamedSharding(mesh, _spec(("batch", "heads", "k_seq", "q_seq"))))
    def key_major_probs(q, k):
        logits = jnp.einsum("bqnh,bknh->bnkq", q, k) / jnp.sqrt(jnp.float32(HD))
        return jax.nn.softmax(logits, axis=softmax_axis)

    probs = key_major_probs(q, k)
    ctx = c(jnp.einsum("bnkq,bknh->bqnh", probs, v), ("batch", "seq", "heads", "kv"))
    return c(jnp.einsum("bqnh,nhd->bqd", ctx, c(p["o"], ("heads", "kv", "embed"))),
             ("batch", "seq", "embed"))


def attention_jit(p, x, mesh):
    return _attention_sharded(p, x, mesh, softmax_axis=-2)


def attention_jit_softmax_last_axis(p, x, mesh):
    return _attention_sharded(p, x, mesh, softmax_axis=-1)
