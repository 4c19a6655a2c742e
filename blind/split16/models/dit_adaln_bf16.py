"""DiT-style block on a patchified NCHW image: bf16 patch embedding (f32 accumulation), adaLN-Zero
modulation from a conditioning vector (shift, scale, gate = Linear(silu(c))), f32 LayerNorm without
affine, a bf16 GELU MLP with f32 accumulation, gated residual. f32 master params cast at use.

Mesh {data: 2, model: 4}: images and conditioning over `data`, the MLP hidden dim over `model`.

- `dit_tp_f32_reduce`: patches by reshape/transpose, MLP partial outputs psum'd in f32;
- `dit_conv_bf16_reduce`: patch embedding as a strided `lax.conv_general_dilated` (kernel
  [D, C, p, p] from the [C*p*p, D] weight), MLP partial outputs psum'd in bf16.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, C, IMG, PATCH, D, F = 4, 4, 8, 2, 32, 64
NP = (IMG // PATCH) ** 2
BF = jnp.bfloat16


def dit_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"patch": f(C * PATCH * PATCH, D), "ada": f(D, 3 * D), "w1": f(D, F), "w2": f(F, D)}
    return params, f(B, C, IMG, IMG), f(B, D)


def bdot(a, b):
    return jnp.matmul(a.astype(BF), b.astype(BF), preferred_element_type=jnp.float32)


def patchify(img):
    b = img.shape[0]
    g = IMG // PATCH
    x = img.reshape(b, C, g, PATCH, g, PATCH).transpose(0, 2, 4, 1, 3, 5)
    return x.reshape(b, g * g, C * PATCH * PATCH)


def layer_norm(x):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) * lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-6)


def modulate(x, shift, scale):
    return x * (1 + scale[:, None]) + shift[:, None]


def gated_residual(x, gate, y):
    return x + gate[:, None] * y


def ungated_residual(x, gate, y):
    return x + y


def _block(params, tokens, cond, mlp_reduce, residual=gated_residual):
    shift, scale, gate = jnp.split(jax.nn.silu(cond) @ params["ada"], 3, axis=-1)
    h = modulate(layer_norm(tokens), shift, scale)
    y = mlp_reduce(bdot(jax.nn.gelu(bdot(h, params["w1"])), params["w2"]))
    return residual(tokens, gate, y)


def dit(params, img, cond):
    return _block(params, bdot(patchify(img), params["patch"]), cond, lambda y: y)


SPECS = {"patch": P(), "ada": P(), "w1": P(None, "model"), "w2": P("model", None)}


# ---- reshape patches, f32 reduction --------------------------------------------------------------

def _tp(residual, params, img, cond, mesh):
    def local(p, im, c):
        return _block(p, bdot(patchify(im), p["patch"]), c, lambda y: lax.psum(y, "model"),
                      residual)

    return jax.shard_map(local, mesh=mesh, in_specs=(SPECS, P("data"), P("data")),
                         out_specs=P("data"))(params, img, cond)


def dit_tp_f32_reduce(params, img, cond, mesh):
    return _tp(gated_residual, params, img, cond, mesh)


def dit_tp_f32_reduce_ungated(params, img, cond, mesh):
    return _tp(ungated_residual, params, img, cond, mesh)


# ---- strided conv patches, bf16 reduction --------------------------------------------------------

def conv_kernel(w_patch):
    return w_patch.reshape(C, PATCH, PATCH, D).transpose(3, 0, 1, 2)


def conv_kernel_hwc(w_patch):
    return w_patch.reshape(PATCH, PATCH, C, D).transpose(3, 2, 0, 1)


def conv_patches(img, kernel):
    y = lax.conv_general_dilated(img.astype(BF), kernel.astype(BF), (PATCH, PATCH), "VALID",
                                 dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                 preferred_element_type=jnp.float32)
    return y.reshape(img.shape[0], D, NP).transpose(0, 2, 1)


def _bf16_psum(y):
    return lax.psum(y.astype(BF), "model").astype(jnp.float32)


def _conv(kernel_fn, params, img, cond, mesh):
    def local(p, im, c):
        return _block(p, conv_patches(im, kernel_fn(p["patch"])), c, _bf16_psum)

    return jax.shard_map(local, mesh=mesh, in_specs=(SPECS, P("data"), P("data")),
                         out_specs=P("data"))(params, img, cond)


def dit_conv_bf16_reduce(params, img, cond, mesh):
    return _conv(conv_kernel, params, img, cond, mesh)


def dit_conv_bf16_reduce_hwc_kernel(params, img, cond, mesh):
    return _conv(conv_kernel_hwc, params, img, cond, mesh)
