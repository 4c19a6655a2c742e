"""One training step of a 2-layer tanh MLP regressor with the Muon optimizer: Nesterov momentum,
5 quintic Newton-Schulz iterations orthogonalising each weight's update, the (rows/cols)^0.5
shape scale and decoupled weight decay. Returns the new params, the new momentum and the loss.

- `muon_dp`: on {data: 4}: batch over data, gradients pmean'd, the optimizer replicated;
- `muon_fsdp`: on {data: 2, fsdp: 2}: batch over both axes, weights row-sharded over fsdp and
  all-gathered for the forward pass, full gradients reduce-scattered over fsdp and summed over data;
  Newton-Schulz runs on the row shards with the Gram matrix X^T X psum'd over fsdp
  (X (b G + c G^2) = (b A + c A^2) X with A = X X^T).
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, D_IN, HID, D_OUT = 16, 16, 32, 8
LR, BETA, WD = 0.02, 0.95, 0.01
NS_COEFFS = (3.4445, -4.7750, 2.0315)


def muon_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"w1": f(D_IN, HID), "w2": f(HID, D_OUT)}
    momentum = {"w1": f(D_IN, HID), "w2": f(HID, D_OUT)}
    return params, momentum, f(N, D_IN), f(N, D_OUT)


def loss_fn(params, x, y):
    pred = jnp.tanh(x @ params["w1"]) @ params["w2"]
    return jnp.mean((pred - y) ** 2)


def newton_schulz(g, steps=5):
    a, b, c = NS_COEFFS
    x = g / (jnp.linalg.norm(g) + 1e-7)
    tall = g.shape[0] > g.shape[1]
    if tall:
        x = x.T
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def _shape_scale(shape):
    return max(1.0, shape[0] / shape[1]) ** 0.5


def _apply(w, m, g, ortho, shape):
    m = BETA * m + g
    o = ortho(g + BETA * m)
    return w * (1.0 - LR * WD) - LR * _shape_scale(shape) * o, m


def muon_step(params, momentum, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    new_p, new_m = {}, {}
    for k in params:
        new_p[k], new_m[k] = _apply(params[k], momentum[k], grads[k], newton_schulz, params[k].shape)
    return new_p, new_m, loss


# ---- data parallel -----------------------------------------------------------------------------------

def _dp_local(params, momentum, x, y, reduce_grad):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    grads = jax.tree_util.tree_map(reduce_grad, grads)
    new_p, new_m = {}, {}
    for k in params:
        new_p[k], new_m[k] = _apply(params[k], momentum[k], grads[k], newton_schulz, params[k].shape)
    return new_p, new_m, lax.pmean(loss, "data")


def _dp(params, momentum, x, y, mesh, reduce_grad):
    return jax.shard_map(lambda *a: _dp_local(*a, reduce_grad=reduce_grad), mesh=mesh,
                         in_specs=(P(), P(), P("data"), P("data")), out_specs=(P(), P(), P()),
                         check_vma=False)(params, momentum, x, y)


def muon_dp(params, momentum, x, y, mesh):
    return _dp(params, momentum, x, y, mesh, reduce_grad=lambda g: lax.pmean(g, "data"))


def muon_dp_summed_grads(params, momentum, x, y, mesh):
    return _dp(params, momentum, x, y, mesh, reduce_grad=lambda g: lax.psum(g, "data"))


# ---- FSDP: row shards, Gram psum ------------------------------------------------------------------------

def _sharded_newton_schulz(g, gram_axis, steps=5):
    a, b, c = NS_COEFFS
    x = g / (jnp.sqrt(lax.psum(jnp.sum(g * g), "fsdp")) + 1e-7)
    for _ in range(steps):
        gram = lax.psum(x.T @ x, gram_axis)
        x = a * x + x @ (b * gram + c * gram @ gram)
    return x


def _fsdp_local(params, momentum, x, y, gram_axis):
    full = {k: lax.all_gather(w, "fsdp", axis=0, tiled=True) for k, w in params.items()}
    loss, grads = jax.value_and_grad(loss_fn)(full, x, y)
    devices = lax.axis_size("data") * lax.axis_size("fsdp")
    ortho = lambda g: _sharded_newton_schulz(g, gram_axis)
    new_p, new_m = {}, {}
    for k in params:
        g = lax.psum(lax.psum_scatter(grads[k], "fsdp", scatter_dimension=0, tiled=True), "data") / devices
        new_p[k], new_m[k] = _apply(params[k], momentum[k], g, ortho, full[k].shape)
    return new_p, new_m, lax.pmean(loss, ("data", "fsdp"))


def _fsdp(params, momentum, x, y, mesh, gram_axis):
    rows = {"w1": P("fsdp", None), "w2": P("fsdp", None)}
    batch = P(("data", "fsdp"))
    return jax.shard_map(lambda *a: _fsdp_local(*a, gram_axis=gram_axis), mesh=mesh,
                         in_specs=(rows, rows, batch, batch), out_specs=(rows, rows, P()),
                         check_vma=False)(params, momentum, x, y)


def muon_fsdp(params, momentum, x, y, mesh):
    return _fsdp(params, momentum, x, y, mesh, gram_axis="fsdp")


def muon_fsdp_gram_over_data(params, momentum, x, y, mesh):
    return _fsdp(params, momentum, x, y, mesh, gram_axis="data")
