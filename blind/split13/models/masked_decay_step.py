"""One training step of a small MLP regressor (dense -> RMS scale -> tanh -> dense, with biases)
under a hand-written optimizer chain: heavy-ball momentum, decoupled weight decay applied only to
`kernel` leaves (a mask built from tree paths with `tree_map_with_path`), then a learning-rate
scale. Returns (new params, new momentum, loss).

Data parallel on {replica: 4}:
- `train_step_dp`: the objective is the replica-mean (`pmean`) of the batch-shard loss; its
  `value_and_grad` w.r.t. the replicated params is the replica-averaged gradient;
- `train_step_dp_accum`: each replica loops over 2 microbatches in `lax.fori_loop`, summing the
  value_and_grad of the replica-mean microbatch loss, then divides by the microbatch count.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BATCH, DIN, DH, DOUT = 16, 8, 16, 4
AXIS = "replica"
N_MICRO = 2
LR, BETA, WD = 0.1, 0.9, 0.01


def step_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"dense1": {"kernel": f(DIN, DH), "bias": f(DH)}, "norm": {"scale": f(DH)},
              "dense2": {"kernel": f(DH, DOUT), "bias": f(DOUT)}}
    momentum = jax.tree_util.tree_map(lambda s: s, params)
    return params, momentum, (f(BATCH, DIN), f(BATCH, DOUT))


def forward(params, x):
    h = x @ params["dense1"]["kernel"] + params["dense1"]["bias"]
    h = h * lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6) * params["norm"]["scale"]
    return jnp.tanh(h) @ params["dense2"]["kernel"] + params["dense2"]["bias"]


def loss_fn(params, batch):
    x, y = batch
    return jnp.mean(jnp.square(forward(params, x) - y))


# ---- the optimizer chain ------------------------------------------------------------------------

def decay_mask(params):
    return jax.tree_util.tree_map_with_path(lambda path, _: path[-1].key == "kernel", params)


def decay_mask_not_bias(params):
    return jax.tree_util.tree_map_with_path(lambda path, _: path[-1].key != "bias", params)


def scale_by_momentum(grads, momentum):
    new_m = jax.tree_util.tree_map(lambda m, g: BETA * m + g, momentum, grads)
    return new_m, new_m


def add_decayed_weights(updates, params, mask):
    return jax.tree_util.tree_map(lambda u, p, m: u + WD * p if m else u, updates, params, mask)


def apply_chain(params, momentum, grads, mask_fn=decay_mask):
    updates, momentum = scale_by_momentum(grads, momentum)
    updates = add_decayed_weights(updates, params, mask_fn(params))
    params = jax.tree_util.tree_map(lambda p, u: p - LR * u, params, updates)
    return params, momentum


def train_step(params, momentum, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    params, momentum = apply_chain(params, momentum, grads)
    return params, momentum, loss


# ---- data parallel ------------------------------------------------------------------------------

def _run(local, params, momentum, batch, mesh):
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P(AXIS)),
                         out_specs=(P(), P(), P()))(params, momentum, batch)


def _replica_mean_loss(params, batch):
    # inside shard_map the gradient w.r.t. the replicated params of a pmean-ed loss is the
    # replica-averaged gradient
    return lax.pmean(loss_fn(params, batch), AXIS)


def _replica_summed_loss(params, batch):
    return lax.psum(loss_fn(params, batch), AXIS)


def _dp_local(objective):
    def local(params, momentum, batch):
        loss, grads = jax.value_and_grad(objective)(params, batch)
        params, momentum = apply_chain(params, momentum, grads)
        return params, momentum, loss
    return local


def train_step_dp(params, momentum, batch, mesh):
    return _run(_dp_local(_replica_mean_loss), params, momentum, batch, mesh)


def train_step_dp_loss_psum(params, momentum, batch, mesh):
    return _run(_dp_local(_replica_summed_loss), params, momentum, batch, mesh)


# ---- microbatch accumulation per replica --------------------------------------------------------

def _accumulate(params, batch):
    micro = jax.tree_util.tree_map(lambda a: a.reshape(N_MICRO, -1, *a.shape[1:]), batch)
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)

    def body(i, carry):
        loss_sum, grad_sum = carry
        mb = jax.tree_util.tree_map(lambda a: a[i], micro)
        loss, grads = jax.value_and_grad(_replica_mean_loss)(params, mb)
        return loss_sum + loss, jax.tree_util.tree_map(jnp.add, grad_sum, grads)

    loss_sum, grad_sum = lax.fori_loop(0, N_MICRO, body, (jnp.zeros(()), zeros))
    return loss_sum / N_MICRO, jax.tree_util.tree_map(lambda g: g / N_MICRO, grad_sum)


def _accum_local(mask_fn):
    def local(params, momentum, batch):
        loss, grads = _accumulate(params, batch)
        params, momentum = apply_chain(params, momentum, grads, mask_fn)
        return params, momentum, loss
    return local


def train_step_dp_accum(params, momentum, batch, mesh):
    return _run(_accum_local(decay_mask), params, momentum, batch, mesh)


def train_step_dp_accum_decay_scale(params, momentum, batch, mesh):
    return _run(_accum_local(decay_mask_not_bias), params, momentum, batch, mesh)
