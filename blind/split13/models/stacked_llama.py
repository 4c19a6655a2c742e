"""Llama-style decoder stack written as hand-rolled pytree modules (`register_pytree_node_class`
with explicit tree_flatten / tree_unflatten), two layers stacked along a leading axis and run by
`lax.scan(..., unroll=2)`. RMSNorm, multi-head causal attention with a boolean mask built by
`lax.broadcasted_iota`, SwiGLU, two residuals; a final norm.

Parallel versions on a 2-D mesh {data: 2, model: 2}:
- `stack_2d`: batch over `data`, heads and FFN hidden over `model`; the stacked weights are sharded
  on their head / hidden axis by shard_map in_specs and the scan runs inside the shard_map;
- `stack_2d_layer_loop`: a Python loop over layers, each layer its own shard_map call on the
  layer's slice of the stacked weights (`jax.tree_util.tree_map(lambda a: a[i], ...)`).
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H, HD, F, L = 4, 8, 32, 4, 8, 64, 2
EPS = 1e-5


@jax.tree_util.register_pytree_node_class
class Attention:
    def __init__(self, wq, wk, wv, wo):
        self.wq, self.wk, self.wv, self.wo = wq, wk, wv, wo

    def tree_flatten(self):
        return (self.wq, self.wk, self.wv, self.wo), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    def __call__(self, x):
        q = jnp.einsum("bsd,dhk->bhsk", x, self.wq)
        k = jnp.einsum("bsd,dhk->bhsk", x, self.wk)
        v = jnp.einsum("bsd,dhk->bhsk", x, self.wv)
        scores = jnp.einsum("bhqk,bhsk->bhqs", q, k) / jnp.sqrt(jnp.float32(HD))
        row = lax.broadcasted_iota(jnp.int32, (S, S), 0)
        col = lax.broadcasted_iota(jnp.int32, (S, S), 1)
        scores = jnp.where(col <= row, scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1)
        return jnp.einsum("bhqs,bhsk,hkd->bqd", probs, v, self.wo)


@jax.tree_util.register_pytree_node_class
class SwiGLU:
    def __init__(self, w_gate, w_up, w_down):
        self.w_gate, self.w_up, self.w_down = w_gate, w_up, w_down

    def tree_flatten(self):
        return (self.w_gate, self.w_up, self.w_down), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    def __call__(self, x):
        return (jax.nn.silu(x @ self.w_gate) * (x @ self.w_up)) @ self.w_down


@jax.tree_util.register_pytree_node_class
class Block:
    def __init__(self, attn_norm, attn, mlp_norm, mlp):
        self.attn_norm, self.attn, self.mlp_norm, self.mlp = attn_norm, attn, mlp_norm, mlp

    def tree_flatten(self):
        return (self.attn_norm, self.attn, self.mlp_norm, self.mlp), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


def rmsnorm(x, w):
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS) * w


def stack_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    blocks = Block(f(L, D), Attention(f(L, D, H, HD), f(L, D, H, HD), f(L, D, H, HD), f(L, H, HD, D)),
                   f(L, D), SwiGLU(f(L, D, F), f(L, D, F), f(L, F, D)))
    return blocks, f(D), f(B, S, D)


def _layer(blk, x):
    x = x + blk.attn(rmsnorm(x, blk.attn_norm))
    return x + blk.mlp(rmsnorm(x, blk.mlp_norm))


def stack(blocks, final_norm, x):
    x, _ = lax.scan(lambda h, blk: (_layer(blk, h), None), x, blocks, unroll=2)
    return rmsnorm(x, final_norm)


# ---- 2-D mesh: batch over data, heads / hidden over model ---------------------------------------

def _block_specs(lead):
    col = P(*lead, None, "model")
    return Block(P(*lead), Attention(col, col, col, P(*lead, "model")), P(*lead),
                 SwiGLU(col, col, P(*lead, "model")))


def _tp_layer(blk, x):
    x = x + lax.psum(blk.attn(rmsnorm(x, blk.attn_norm)), "model")
    return x + lax.psum(blk.mlp(rmsnorm(x, blk.mlp_norm)), "model")


def _tp_layer_mean(blk, x):
    x = x + lax.psum(blk.attn(rmsnorm(x, blk.attn_norm)), "model")
    return x + lax.pmean(blk.mlp(rmsnorm(x, blk.mlp_norm)), "model")


def _sharded_stack(layer_fn, blocks, final_norm, x, mesh):
    def local(blocks, final_norm, x):
        x, _ = lax.scan(lambda h, blk: (layer_fn(blk, h), None), x, blocks, unroll=2)
        return rmsnorm(x, final_norm)

    return jax.shard_map(local, mesh=mesh, in_specs=(_block_specs((None,)), P(), P("data")),
                         out_specs=P("data"))(blocks, final_norm, x)


def stack_2d(blocks, final_norm, x, mesh):
    return _sharded_stack(_tp_layer, blocks, final_norm, x, mesh)


def stack_2d_mlp_pmean(blocks, final_norm, x, mesh):
    return _sharded_stack(_tp_layer_mean, blocks, final_norm, x, mesh)


# ---- one shard_map per layer --------------------------------------------------------------------

def _attn_sublayer(blk, x):
    return x + lax.psum(blk.attn(rmsnorm(x, blk.attn_norm)), "model")


def _attn_sublayer_no_residual(blk, x):
    return lax.psum(blk.attn(rmsnorm(x, blk.attn_norm)), "model")


def _mlp_sublayer(blk, x):
    return x + lax.psum(blk.mlp(rmsnorm(x, blk.mlp_norm)), "model")


def _layer_loop(attn_sublayer, blocks, final_norm, x, mesh):
    for i in range(L):
        blk = jax.tree_util.tree_map(lambda a: a[i], blocks)
        run = jax.shard_map(lambda b, h: _mlp_sublayer(b, attn_sublayer(b, h)), mesh=mesh,
                            in_specs=(_block_specs(()), P("data")), out_specs=P("data"))
        x = run(blk, x)
    return rmsnorm(x, final_norm)


def stack_2d_layer_loop(blocks, final_norm, x, mesh):
    return _layer_loop(_attn_sublayer, blocks, final_norm, x, mesh)


def stack_2d_layer_loop_no_residual(blocks, final_norm, x, mesh):
    return _layer_loop(_attn_sublayer_no_residual, blocks, final_norm, x, mesh)
