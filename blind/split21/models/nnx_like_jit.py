"""A hand-written NNX-like encoder layer: module objects registered as pytrees that hold their
parameters as attributes (LayerNorm, flattened-projection attention, GELU MLP), run under
`jax.jit` with a mesh and sharding constraints, no shard_map for the attention.

- `encoder_jit` on {dp: 2, tp: 2}: parameters placed by `with_sharding_constraint`
  (heads and MLP columns over tp), batch over dp, head tensors constrained [dp, tp];
- `encoder_jit_manual_mlp` on {tp: 4}: the attention is auto-partitioned from constraints and the
  MLP is a nested shard_map (column- then row-parallel, psum).
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

B, T, D, H, HD, F = 4, 8, 32, 4, 8, 64


@jax.tree_util.register_pytree_node_class
class Module:
    def __init__(self, **params):
        self.__dict__.update(params)

    def tree_flatten(self):
        keys = sorted(self.__dict__)
        return [self.__dict__[k] for k in keys], keys

    @classmethod
    def tree_unflatten(cls, keys, leaves):
        return cls(**dict(zip(keys, leaves)))


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    layer = Module(ln_g=f(D), ln_b=f(D), w_q=f(D, H * HD), w_k=f(D, H * HD), w_v=f(D, H * HD),
                   w_o=f(H * HD, D), w_in=f(D, F), b_in=f(F), w_out=f(F, D))
    return layer, f(B, T, D)


def _ln(m, x):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) * lax.rsqrt(jnp.square(x - mu).mean(-1, keepdims=True) + 1e-6) * m.ln_g + m.ln_b


def _split_heads(y):
    return y.reshape(y.shape[0], y.shape[1], H, HD).transpose(0, 2, 1, 3)


def _split_heads_transposed(y):
    return y.reshape(y.shape[0], y.shape[1], HD, H).transpose(0, 3, 1, 2)


def _attention(m, x, split, constrain):
    q, k, v = (constrain(split(x @ w)) for w in (m.w_q, m.w_k, m.w_v))
    p = jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(HD), -1)
    o = constrain(jnp.einsum("bhqk,bhkd->bhqd", p, v))
    return o.transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[1], H * HD) @ m.w_o


def _mlp(m, x):
    return jax.nn.gelu(x @ m.w_in + m.b_in) @ m.w_out


def _layer(m, x, split, constrain, mlp):
    h = x + _attention(m, _ln(m, x), split, constrain)
    return h + mlp(m, _ln(m, h))


def encoder(layer, x):
    return _layer(layer, x, _split_heads, lambda t: t, _mlp)


def _place(layer, mesh):
    cols, rows = NamedSharding(mesh, P(None, "tp")), NamedSharding(mesh, P("tp", None))
    rep = NamedSharding(mesh, P())
    shard = {"w_q": cols, "w_k": cols, "w_v": cols, "w_o": rows, "w_in": cols, "w_out": rows,
             "b_in": NamedSharding(mesh, P("tp"))}
    return Module(**{k: lax.with_sharding_constraint(v, shard.get(k, rep)) for k, v in layer.__dict__.items()})


def _dp_tp(layer, x, mesh, split):
    layer = _place(layer, mesh)
    x = lax.with_sharding_constraint(x, NamedSharding(mesh, P("dp")))
    heads = lambda t: lax.with_sharding_constraint(t, NamedSharding(mesh, P("dp", "tp")))
    return _layer(layer, x, split, heads, _mlp)


def encoder_jit(layer, x, mesh):
    return jax.jit(lambda l, x: _dp_tp(l, x, mesh, _split_heads))(layer, x)


def encoder_jit_heads_transposed(layer, x, mesh):
    return jax.jit(lambda l, x: _dp_tp(l, x, mesh, _split_heads_transposed))(layer, x)


def _mlp_manual(mesh, reduce):
    def local(w_in, b_in, w_out, x):
        return reduce(jax.nn.gelu(x @ w_in + b_in) @ w_out)

    def run(m, x):
        return jax.shard_map(local, mesh=mesh, check_vma=False, in_specs=(P(None, "tp"), P("tp"), P("tp", None), P()),
                             out_specs=P())(m.w_in, m.b_in, m.w_out, x)
    return run


def _tp_manual(layer, x, mesh, reduce):
    layer = _place(layer, mesh)
    heads = lambda t: lax.with_sharding_constraint(t, NamedSharding(mesh, P(None, "tp")))
    return _layer(layer, x, _split_heads, heads, _mlp_manual(mesh, reduce))


def encoder_jit_manual_mlp(layer, x, mesh):
    return jax.jit(lambda l, x: _tp_manual(l, x, mesh, lambda y: lax.psum(y, "tp")))(layer, x)


def encoder_jit_manual_mlp_pmean(layer, x, mesh):
    return jax.jit(lambda l, x: _tp_manual(l, x, mesh, lambda y: lax.pmean(y, "tp")))(layer, x)
