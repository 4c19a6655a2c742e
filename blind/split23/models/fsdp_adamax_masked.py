"""FSDP training steps on a small MLP regression loss.

AdaMax (Adam with an infinity-norm second moment) on a {dp: 2, fsdp: 2} mesh: `adamax_2d`: shard_map;
weights and optimizer state rows over fsdp, examples over both axes; weights all_gathered over fsdp
for the forward, gradient rows reduce-scattered over fsdp (psum_scatter) and summed over dp, divided by
the 4 example shards.

SGD with decoupled weight decay on kernels only (no decay on biases and the norm scale, mask from
tree_map_with_path key names): `masked_decay_fsdp_jit`: jit on {fsdp: 4}, kernels' rows sharded over
fsdp through in_shardings/out_shardings, examples over fsdp.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

B, D, HID, O = 16, 16, 16, 4
B1, B2, LR, EPS, STEP = 0.9, 0.999, 0.01, 1e-6, 3
WD = 0.1


def _mlp_loss(w, x, y):
    return jnp.mean((jax.nn.gelu(x @ w["w1"] / D ** 0.5) @ w["w2"] / HID ** 0.5 - y) ** 2)


def adamax_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    w = {"w1": f(D, HID), "w2": f(HID, O)}
    return w, w, w, f(B, D), f(B, O)


def _adamax(w, m, u, g):
    tm = jax.tree_util.tree_map
    m = tm(lambda m, g: B1 * m + (1 - B1) * g, m, g)
    u = tm(lambda u, g: jnp.maximum(B2 * jnp.abs(u), jnp.abs(g)), u, g)
    w = tm(lambda w, m, u: w - LR / (1 - B1 ** STEP) * m / (u + EPS), w, m, u)
    return w, m, u


def adamax(w, m, u, x, y):
    return _adamax(w, m, u, jax.grad(_mlp_loss)(w, x, y))


def _adamax_local(w, m, u, x, y, scatter_axis, sum_axis):
    full = jax.tree_util.tree_map(lambda a: lax.all_gather(a, "fsdp", axis=0, tiled=True), w)
    g = jax.grad(_mlp_loss)(full, x, y)
    g = jax.tree_util.tree_map(
        lambda a: lax.psum(lax.psum_scatter(a, scatter_axis, scatter_dimension=0, tiled=True), sum_axis) / 4, g)
    return _adamax(w, m, u, g)


def _adamax_run(axes, w, m, u, x, y, mesh):
    rows = P("fsdp")
    return jax.shard_map(lambda *a: _adamax_local(*a, *axes), mesh=mesh,
                         in_specs=(rows, rows, rows, P(("dp", "fsdp")), P(("dp", "fsdp"))),
                         out_specs=(rows, rows, rows), check_vma=False)(w, m, u, x, y)


def adamax_2d(w, m, u, x, y, mesh):
    return _adamax_run(("fsdp", "dp"), w, m, u, x, y, mesh)


def adamax_2d_scatter_over_dp(w, m, u, x, y, mesh):
    return _adamax_run(("dp", "fsdp"), w, m, u, x, y, mesh)


def masked_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return ({"ln": {"scale": f(D)}, "dense": {"kernel": f(D, HID), "bias": f(HID)},
             "out": {"kernel": f(HID, O), "bias": f(O)}}, f(B, D), f(B, O))


def _net_loss(p, x, y):
    h = x * lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * p["ln"]["scale"]
    h = jax.nn.relu(h @ p["dense"]["kernel"] / D ** 0.5 + p["dense"]["bias"])
    return jnp.mean((h @ p["out"]["kernel"] / HID ** 0.5 + p["out"]["bias"] - y) ** 2)


def _decays_kernels(path):
    return path[-1].key == "kernel"


def _decays_all_but_biases(path):
    return path[-1].key != "bias"


def _masked_step(p, x, y, decays):
    g = jax.grad(_net_loss)(p, x, y)
    return jax.tree_util.tree_map_with_path(
        lambda path, w, g: w - LR * g - (LR * WD * w if decays(path) else 0.0), p, g)


def masked_decay(p, x, y):
    return _masked_step(p, x, y, _decays_kernels)


def _masked_run(decays, p, x, y, mesh):
    ns = lambda *spec: NamedSharding(mesh, P(*spec))
    spec = {"ln": {"scale": ns()}, "dense": {"kernel": ns("fsdp"), "bias": ns()},
            "out": {"kernel": ns("fsdp"), "bias": ns()}}
    return jax.jit(lambda p, x, y: _masked_step(p, x, y, decays), in_shardings=(spec, ns("fsdp"), ns("fsdp")),
                   out_shardings=spec)(p, x, y)


def masked_decay_fsdp_jit(p, x, y, mesh):
    return _masked_run(_decays_kernels, p, x, y, mesh)


def masked_decay_fsdp_jit_decays_norm_scale(p, x, y, mesh):
    return _masked_run(_decays_all_but_biases, p, x, y, mesh)
