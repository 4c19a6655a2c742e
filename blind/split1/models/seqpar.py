"""Pre-LN transformer block with Megatron sequence parallelism.

Outside the TP regions the activations are split along the sequence; each TP region starts with an
all-gather over the sequence and ends with a reduce-scatter back to sequence shards.
"""

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H, HD, FF = 2, 16, 32, 4, 8, 64


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class BlockParams:
    ln1: jax.Array
    wq: jax.Array   # [D, H, HD]
    wk: jax.Array
    wv: jax.Array
    wo: jax.Array   # [H, HD, D]
    ln2: jax.Array
    w1: jax.Array   # [D, FF]
    w2: jax.Array   # [FF, D]


def layer_norm(x, scale, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + eps) * scale


def _attend(p, h):
    q = jnp.einsum("bsd,dhk->bshk", h, p.wq)
    k = jnp.einsum("bsd,dhk->bshk", h, p.wk)
    v = jnp.einsum("bsd,dhk->bshk", h, p.wv)
    logits = jnp.einsum("bqhk,bthk->bhqt", q, k) * HD ** -0.5
    probs = jax.nn.softmax(logits, axis=-1)
    ctx = jnp.einsum("bhqt,bthk->bqhk", probs, v)
    return jnp.einsum("bqhk,hkd->bqd", ctx, p.wo)


def block(p: BlockParams, x):
    x = x + _attend(p, layer_norm(x, p.ln1))
    return x + jax.nn.relu(layer_norm(x, p.ln2) @ p.w1) @ p.w2


def block_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return (BlockParams(ln1=f(D), wq=f(D, H, HD), wk=f(D, H, HD), wv=f(D, H, HD),
                        wo=f(H, HD, D), ln2=f(D), w1=f(D, FF), w2=f(FF, D)),
            f(B, S, D))


_SPECS = BlockParams(ln1=P(), wq=P(None, "tp"), wk=P(None, "tp"), wv=P(None, "tp"),
                     wo=P("tp"), ln2=P(), w1=P(None, "tp"), w2=P("tp"))


def _gather_seq(x):
    return lax.all_gather(x, "tp", axis=1, tiled=True)


def _scatter_seq(x):
    return lax.psum_scatter(x, "tp", scatter_dimension=1, tiled=True)


def block_sp(p: BlockParams, x, mesh):
    def body(p, x):
        h = _gather_seq(layer_norm(x, p.ln1))
        x = x + _scatter_seq(_attend(p, h))
        h = _gather_seq(layer_norm(x, p.ln2))
        return x + _scatter_seq(jax.nn.relu(h @ p.w1) @ p.w2)

    return jax.shard_map(body, mesh=mesh, in_specs=(_SPECS, P(None, "tp")),
                         out_specs=P(None, "tp"))(p, x)


def block_sp_fused_residual(p: BlockParams, x, mesh):
    """Same block; the second residual is folded into the reduce-scatter to save an add."""

    def body(p, x):
        h = _gather_seq(layer_norm(x, p.ln1))
        x = x + _scatter_seq(_attend(p, h))
        x_full = _gather_seq(x)
        h = layer_norm(x_full, p.ln2)
        return _scatter_seq(x_full + jax.nn.relu(h @ p.w1) @ p.w2)

    return jax.shard_map(body, mesh=mesh, in_specs=(_SPECS, P(None, "tp")),
                         out_specs=P(None, "tp"))(p, x)
