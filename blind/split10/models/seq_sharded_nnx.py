"""Sequence-parallel layers in a Flax-NNX-like object style (layers are objects holding arrays).

Two layers: a causal self-attention whose query tokens stay sharded over the sequence while keys and
values are all-gathered (lax primitives used directly), and a Megatron-SP MLP sublayer where the
sequence-sharded activations are all-gathered before the column-parallel matmul and
reduce-scattered after the row-parallel one.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, H, HD, F = 2, 16, 32, 4, 8, 64
EPS = 1e-5


class Linear:
    def __init__(self, kernel, bias=None):
        self.kernel, self.bias = kernel, bias

    def __call__(self, x):
        y = lax.dot_general(x, self.kernel, (((x.ndim - 1,), (0,)), ((), ())))
        return y if self.bias is None else y + self.bias


class LayerNorm:
    def __init__(self, scale, bias):
        self.scale, self.bias = scale, bias

    def __call__(self, x):
        mu = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
        return (x - mu) * lax.rsqrt(var + EPS) * self.scale + self.bias


# ---- causal attention, queries sharded over `seq`, K/V all-gathered -----------------------------

def attn_inputs():
    s = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    return {"wq": s(D, D), "wk": s(D, D), "wv": s(D, D), "wo": s(D, D)}, s(B, T, D)


def _heads(t):
    return t.reshape(t.shape[0], t.shape[1], H, HD).transpose(0, 2, 1, 3)


def _attend(q, k, v, visible):
    s = lax.dot_general(q, k, (((3,), (3,)), ((0, 1), (0, 1)))) * (1.0 / HD ** 0.5)
    s = jnp.where(visible, s, -jnp.inf)
    s = lax.exp(s - lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True)))
    p = s / jnp.sum(s, axis=-1, keepdims=True)
    o = lax.dot_general(p, v, (((3,), (2,)), ((0, 1), (0, 1))))
    return o.transpose(0, 2, 1, 3).reshape(o.shape[0], -1, D)


def causal_attention(w, x):
    q, k, v = (_heads(Linear(w[n])(x)) for n in ("wq", "wk", "wv"))
    visible = jnp.tril(jnp.ones((T, T), bool))
    return Linear(w["wo"])(_attend(q, k, v, visible))


class SeqShardedAttention:
    def __init__(self, w, axis):
        self.q, self.k, self.v, self.o = (Linear(w[n]) for n in ("wq", "wk", "wv", "wo"))
        self.axis = axis

    def __call__(self, x_local):
        t_local = x_local.shape[1]
        k_all = lax.all_gather(self.k(x_local), self.axis, axis=1, tiled=True)
        v_all = lax.all_gather(self.v(x_local), self.axis, axis=1, tiled=True)
        q_pos = lax.axis_index(self.axis) * t_local + lax.broadcasted_iota(jnp.int32, (t_local, T), 0)
        k_pos = lax.broadcasted_iota(jnp.int32, (t_local, T), 1)
        return self.o(_attend(_heads(self.q(x_local)), _heads(k_all), _heads(v_all), q_pos >= k_pos))


class SeqShardedAttentionLocalPos(SeqShardedAttention):
    def __call__(self, x_local):
        t_local = x_local.shape[1]
        k_all = lax.all_gather(self.k(x_local), self.axis, axis=1, tiled=True)
        v_all = lax.all_gather(self.v(x_local), self.axis, axis=1, tiled=True)
        q_pos = lax.broadcasted_iota(jnp.int32, (t_local, T), 0)
        k_pos = lax.broadcasted_iota(jnp.int32, (t_local, T), 1)
        return self.o(_attend(_heads(self.q(x_local)), _heads(k_all), _heads(v_all), q_pos >= k_pos))


def causal_attention_sp(w, x, mesh):
    layer = lambda w, x: SeqShardedAttention(w, "seq")(x)
    return jax.shard_map(layer, mesh=mesh, in_specs=(P(), P(None, "seq")),
                         out_specs=P(None, "seq"))(w, x)


def causal_attention_sp_local_pos(w, x, mesh):
    layer = lambda w, x: SeqShardedAttentionLocalPos(w, "seq")(x)
    return jax.shard_map(layer, mesh=mesh, in_specs=(P(), P(None, "seq")),
                         out_specs=P(None, "seq"))(w, x)


# ---- Megatron sequence-parallel MLP sublayer ----------------------------------------------------

def mlp_inputs():
    s = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    params = {"norm": {"scale": s(D), "bias": s(D)},
              "fc1": {"kernel": s(D, F), "bias": s(F)},
              "fc2": {"kernel": s(F, D), "bias": s(D)}}
    return params, s(B, T, D)


def mlp_sublayer(params, x):
    h = LayerNorm(**params["norm"])(x)
    h = jax.nn.gelu(Linear(**params["fc1"])(h), approximate=True)
    return x + Linear(**params["fc2"])(h)


class SPMLP:
    def __init__(self, params, axis):
        self.norm = LayerNorm(**params["norm"])
        self.fc1 = Linear(**params["fc1"])
        self.fc2 = Linear(params["fc2"]["kernel"])
        self.fc2_bias = params["fc2"]["bias"]
        self.axis = axis

    def __call__(self, x_local):
        h = self.norm(x_local)
        h = lax.all_gather(h, self.axis, axis=1, tiled=True)
        h = jax.nn.gelu(self.fc1(h), approximate=True)
        y = lax.psum_scatter(self.fc2(h), self.axis, scatter_dimension=1, tiled=True)
        return x_local + y + self.fc2_bias


class SPMLPNoNorm(SPMLP):
    def __call__(self, x_local):
        h = x_local
        h = lax.all_gather(h, self.axis, axis=1, tiled=True)
        h = jax.nn.gelu(self.fc1(h), approximate=True)
        y = lax.psum_scatter(self.fc2(h), self.axis, scatter_dimension=1, tiled=True)
        return x_local + y + self.fc2_bias


_MLP_SPECS = {"norm": {"scale": P(), "bias": P()},
              "fc1": {"kernel": P(None, "tp"), "bias": P("tp")},
              "fc2": {"kernel": P("tp", None), "bias": P()}}


def mlp_sublayer_sp(params, x, mesh):
    return jax.shard_map(lambda p, x: SPMLP(p, "tp")(x), mesh=mesh,
                         in_specs=(_MLP_SPECS, P(None, "tp")), out_specs=P(None, "tp"))(params, x)


def mlp_sublayer_sp_no_norm(params, x, mesh):
    return jax.shard_map(lambda p, x: SPMLPNoNorm(p, "tp")(x), mesh=mesh,
                         in_specs=(_MLP_SPECS, P(None, "tp")), out_specs=P(None, "tp"))(params, x)
