"""Optimizer steps on a two-layer tanh regression loss mean((tanh(x W1) W2 - y)^2).

Adan (Xie et al.): m, v (gradient difference), n (squared corrected gradient) with weight decay
applied as a division. `adan_dp`: shard_map on {dp: 4}; examples over dp, the local mean-loss
gradient pmean'd over dp, the update replicated.

Lookahead over heavy-ball SGD with gradient accumulation: the gradient is the mean of M microbatch
gradients accumulated by lax.scan; fast <- slow-synced after one fast step (alpha). `lookahead_jit`:
jit on {dp: 4} with the examples sharded over dp inside every microbatch.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

B, D, HID, O = 16, 8, 16, 4
B1, B2, B3, LR, WD, EPS = 0.02, 0.08, 0.01, 0.05, 0.01, 1e-8
M, MU, ALPHA = 4, 0.9, 0.5


def _loss(w, x, y):
    return jnp.mean((jnp.tanh(x @ w["w1"] / D ** 0.5) @ w["w2"] / HID ** 0.5 - y) ** 2)


def adan_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    w = {"w1": f(D, HID), "w2": f(HID, O)}
    return w, {"m": w, "v": w, "n": w, "g_prev": w}, f(B, D), f(B, O)


def _adan_update(w, st, g):
    tm = jax.tree_util.tree_map
    diff = tm(lambda a, b: a - b, g, st["g_prev"])
    m = tm(lambda m, g: (1 - B1) * m + B1 * g, st["m"], g)
    v = tm(lambda v, d: (1 - B2) * v + B2 * d, st["v"], diff)
    n = tm(lambda n, g, d: (1 - B3) * jnp.abs(n) + B3 * (g + (1 - B2) * d) ** 2, st["n"], g, diff)
    w = tm(lambda w, m, v, n: (w - LR / jnp.sqrt(n + EPS) * (m + (1 - B2) * v)) / (1 + WD * LR), w, m, v, n)
    return w, {"m": m, "v": v, "n": n, "g_prev": g}


def adan(w, st, x, y):
    return _adan_update(w, st, jax.grad(_loss)(w, x, y))


def _adan_run(reduce, w, st, x, y, mesh):
    local = lambda w, st, x, y: _adan_update(w, st, reduce(jax.grad(_loss)(w, x, y)))
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P("dp"), P("dp")), out_specs=P(),
                         check_vma=False)(w, st, x, y)


def adan_dp(w, st, x, y, mesh):
    return _adan_run(lambda g: lax.pmean(g, "dp"), w, st, x, y, mesh)


def adan_dp_summed_grads(w, st, x, y, mesh):
    return _adan_run(lambda g: lax.psum(g, "dp"), w, st, x, y, mesh)


def lookahead_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    w = {"w1": f(D, HID), "w2": f(HID, O)}
    return w, w, w, f(B, D), f(B, O)


def _lookahead(fast, slow, mom, g):
    tm = jax.tree_util.tree_map
    mom = tm(lambda m, g: MU * m + g, mom, g)
    fast = tm(lambda w, m: w - LR * m, fast, mom)
    slow = tm(lambda s, f: s + ALPHA * (f - s), slow, fast)
    return slow, slow, mom


def lookahead(fast, slow, mom, x, y):
    return _lookahead(fast, slow, mom, jax.grad(_loss)(fast, x, y))


def _accumulated_grad(w, x, y, mesh, divisor):
    mb = NamedSharding(mesh, P(None, "dp"))
    xs = lax.with_sharding_constraint(x.reshape(M, B // M, D), mb)
    ys = lax.with_sharding_constraint(y.reshape(M, B // M, O), mb)

    def body(acc, batch):
        g = jax.grad(_loss)(w, *batch)
        return jax.tree_util.tree_map(jnp.add, acc, g), None

    acc, _ = lax.scan(body, jax.tree_util.tree_map(jnp.zeros_like, w), (xs, ys))
    return jax.tree_util.tree_map(lambda a: a / divisor, acc)


def _lookahead_run(divisor, fast, slow, mom, x, y, mesh):
    step = lambda f, s, m, x, y: _lookahead(f, s, m, _accumulated_grad(f, x, y, mesh, divisor))
    return jax.jit(step)(fast, slow, mom, x, y)


def lookahead_jit(fast, slow, mom, x, y, mesh):
    return _lookahead_run(M, fast, slow, mom, x, y, mesh)


def lookahead_jit_divided_by_examples(fast, slow, mom, x, y, mesh):
    return _lookahead_run(B, fast, slow, mom, x, y, mesh)
