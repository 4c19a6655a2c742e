"""Conformer convolution module written as NNX-like classes by hand: LayerNorm, pointwise conv to
2C channels, GLU (value * sigmoid(gate)), depthwise conv over time (kernel 5, 'SAME' zero padding),
LayerNorm, swish, pointwise conv back, residual. Every parameter carries its logical sharding in
the module's `SHARDING` table.

- `conv_module_jit`: jit-partitioned on {dp: 2, tp: 2}; parameters and activations are placed with
  `with_sharding_constraint` from the table (channels over tp, batch over dp); the depthwise conv
  is written as a sum of shifted slices of the zero-padded sequence so that it stays per channel;
- `conv_module_jit_glu_local`: same mesh; the pointwise-in kernel [C, 2C] is repacked so that every
  tp rank's columns hold its own value and gate halves next to each other.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

B, T, C, K = 4, 16, 16, 5


class ConvModule:
    SHARDING = {"ln1_g": P(), "w_in": P(None, "tp"), "w_dw": P(None, "tp"), "ln2_g": P(None),
                "w_out": P("tp", None)}

    def __init__(self, params):
        self.p = params

    @staticmethod
    def norm(x, g):
        mu = x.mean(-1, keepdims=True)
        return (x - mu) * lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g

    def depthwise(self, h):
        # lax.conv with feature_group_count = C: kernel [K, 1, C] in 'WIO' layout
        return lax.conv_general_dilated(h, self.p["w_dw"][:, None, :], (1,), "SAME",
                                        dimension_numbers=("NWC", "WIO", "NWC"), feature_group_count=C)

    def __call__(self, x):
        h = self.norm(x, self.p["ln1_g"]) @ self.p["w_in"]
        h = h[..., :C] * jax.nn.sigmoid(h[..., C:])
        h = self.depthwise(h)
        h = jax.nn.silu(self.norm(h, self.p["ln2_g"]))
        return x + h @ self.p["w_out"]


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"ln1_g": f(C), "w_in": f(C, 2 * C), "w_dw": f(K, C), "ln2_g": f(C), "w_out": f(C, C)}, f(B, T, C)


def conv_module(params, x):
    return ConvModule(params)(x)


class ShardedConvModule(ConvModule):
    def __init__(self, params, mesh, shift):
        self.mesh = mesh
        self.shift = shift
        super().__init__({k: self.place(v, self.SHARDING[k]) for k, v in params.items()})

    def place(self, a, spec):
        return lax.with_sharding_constraint(a, NamedSharding(self.mesh, spec))

    def depthwise(self, h):
        pad = (K - 1) // 2
        hp = jnp.pad(h, ((0, 0), (pad, pad), (0, 0)))
        out = 0.0
        for j in range(K):
            out = out + self.shift(hp, j) * self.p["w_dw"][j]
        return self.place(out, P("dp", None, "tp"))


def _window(hp, j):
    return hp[:, j:j + T]


def _window_flipped(hp, j):
    return hp[:, K - 1 - j:K - 1 - j + T]


def conv_module_jit(params, x, mesh):
    x = lax.with_sharding_constraint(x, NamedSharding(mesh, P("dp")))
    return ShardedConvModule(params, mesh, _window)(x)


def conv_module_jit_kernel_flipped(params, x, mesh):
    x = lax.with_sharding_constraint(x, NamedSharding(mesh, P("dp")))
    return ShardedConvModule(params, mesh, _window_flipped)(x)


# ---- GLU kept local by repacking the pointwise-in kernel ----------------------------------------

def _repack_value_gate(w, tp):
    """[C, 2C] = [values | gates] -> rank-major [C, tp * (value_r | gate_r)]."""
    return w.reshape(C, 2, tp, C // tp).transpose(0, 2, 1, 3).reshape(C, 2 * C)


def _repack_value_gate_wrong_order(w, tp):
    return w.reshape(C, tp, 2, C // tp).reshape(C, 2 * C)


class GluLocalConvModule(ShardedConvModule):
    def __init__(self, params, mesh, repack):
        self.tp = mesh.shape["tp"]
        params = dict(params, w_in=repack(params["w_in"], self.tp))
        super().__init__(params, mesh, _window)

    def __call__(self, x):
        h = self.place(self.norm(x, self.p["ln1_g"]) @ self.p["w_in"], P("dp", None, "tp"))
        h = h.reshape(*h.shape[:-1], self.tp, 2, C // self.tp)
        h = (h[..., 0, :] * jax.nn.sigmoid(h[..., 1, :])).reshape(*h.shape[:-3], C)
        h = self.depthwise(self.place(h, P("dp", None, "tp")))
        h = jax.nn.silu(self.norm(h, self.p["ln2_g"]))
        return x + h @ self.p["w_out"]


def conv_module_jit_glu_local(params, x, mesh):
    x = lax.with_sharding_constraint(x, NamedSharding(mesh, P("dp")))
    return GluLocalConvModule(params, mesh, _repack_value_gate)(x)


def conv_module_jit_glu_local_misrepacked(params, x, mesh):
    x = lax.with_sharding_constraint(x, NamedSharding(mesh, P("dp")))
    return GluLocalConvModule(params, mesh, _repack_value_gate_wrong_order)(x)
