"""Sequence classifier: one self-attention layer over right-padded sequences (keys past each
example's `length` masked out), residual, masked mean pooling over the valid tokens, linear head.
Projections are flat [D, H*HD] kernels split into heads by reshape.

Sharded by jit alone on {batch: 2, heads: 2} (no shard_map):
- `classify_jit_constraints`: an inner `jax.jit` with `out_shardings=NamedSharding(mesh,
  P("batch"))`, the head-split activations [B, H, S, HD] constrained to P("batch", "heads") with
  `with_sharding_constraint`;
- `classify_vmapped`: the per-example function (one sequence and its scalar length) written under
  `jax.named_scope`s and mapped with `jax.vmap(spmd_axis_name="batch")`, its per-example head
  tensors [H, S, HD] constrained to bare `P("heads")`; pooling as an einsum with the float mask.
"""
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

B, S, D, H, HD, C = 4, 16, 32, 4, 8, 8


def cls_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"wq": f(D, H * HD), "wk": f(D, H * HD), "wv": f(D, H * HD), "wo": f(H * HD, D),
              "head": f(D, C)}
    return params, f(B, S, D), jax.ShapeDtypeStruct((B,), jnp.int32)


def _heads(t):
    return t.reshape(B, S, H, HD).transpose(0, 2, 1, 3)


def classify(p, x, lengths):
    valid = jnp.arange(S)[None, :] < lengths[:, None]
    q, k, v = (_heads(x @ p[n]) for n in ("wq", "wk", "wv"))
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(jnp.float32(HD))
    s = jnp.where(valid[:, None, None, :], s, -1e9)
    o = jnp.einsum("bhqk,bhkd->bqhd", jax.nn.softmax(s, axis=-1), v).reshape(B, S, H * HD)
    h = x + o @ p["wo"]
    pooled = jnp.where(valid[..., None], h, 0.0).sum(axis=1) / lengths[:, None]
    return pooled @ p["head"]


# ---- inner jit with NamedSharding constraints ---------------------------------------------------

def _heads_transposed(t):
    return t.reshape(B, S, HD, H).transpose(0, 3, 1, 2)


def _constrained(split_heads, mesh):
    head_sharding = NamedSharding(mesh, P("batch", "heads"))

    def body(p, x, lengths):
        valid = jnp.arange(S)[None, :] < lengths[:, None]
        q, k, v = (jax.lax.with_sharding_constraint(split_heads(x @ p[n]), head_sharding)
                   for n in ("wq", "wk", "wv"))
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(jnp.float32(HD))
        s = jnp.where(valid[:, None, None, :], s, -1e9)
        o = jnp.einsum("bhqk,bhkd->bqhd", jax.nn.softmax(s, axis=-1), v).reshape(B, S, H * HD)
        h = x + o @ p["wo"]
        pooled = jnp.where(valid[..., None], h, 0.0).sum(axis=1) / lengths[:, None]
        return pooled @ p["head"]

    return jax.jit(body, out_shardings=NamedSharding(mesh, P("batch")))


def classify_jit_constraints(params, x, lengths, mesh):
    return _constrained(_heads, mesh)(params, x, lengths)


def classify_jit_constraints_head_split_transposed(params, x, lengths, mesh):
    return _constrained(_heads_transposed, mesh)(params, x, lengths)


# ---- per-example function under vmap(spmd_axis_name) --------------------------------------------

def _valid_tokens(length):
    return jnp.arange(S) < length


def _valid_tokens_inclusive(length):
    return jnp.arange(S) <= length


def _one_example(valid_fn):
    def run(p, x, length):
        valid = valid_fn(length)
        with jax.named_scope("attention"):
            q, k, v = (jax.lax.with_sharding_constraint(
                (x @ p[n]).reshape(S, H, HD).swapaxes(0, 1), P("heads")) for n in ("wq", "wk", "wv"))
            s = jnp.einsum("hqd,hkd->hqk", q, k) * HD ** -0.5
            s = jnp.where(valid[None, None, :], s, -1e9)
            o = jnp.einsum("hqk,hkd->qhd", jax.nn.softmax(s, axis=-1), v).reshape(S, H * HD)
        with jax.named_scope("pool"):
            h = x + o @ p["wo"]
            pooled = jnp.einsum("s,sd->d", valid.astype(h.dtype), h) / length.astype(h.dtype)
        return pooled @ p["head"]
    return run


def classify_vmapped(params, x, lengths, mesh):
    run = jax.vmap(_one_example(_valid_tokens), in_axes=(None, 0, 0), spmd_axis_name="batch")
    return run(params, x, lengths)


def classify_vmapped_inclusive_length(params, x, lengths, mesh):
    run = jax.vmap(_one_example(_valid_tokens_inclusive), in_axes=(None, 0, 0),
                   spmd_axis_name="batch")
    return run(params, x, lengths)
