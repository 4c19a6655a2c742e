"""ZeRO-3 / FSDP: weights live sharded and are all-gathered right before use.

A gated-MLP residual stack (fused gate/up weight reshaped to [D, 2, F] after the gather) scanned
over stacked layers, and a training step whose gradient flows back through the all_gather (its
transpose reduce-scatters) on a (data, fsdp) mesh.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, D, F, L = 16, 16, 32, 2


# ---- forward: scan over layers, gather each layer's shards -----------------------------------

def stack_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"gate_up": f(L, D, 2 * F), "down": f(L, F, D)}, f(N, D)


def _gated(x, gate_up, down):
    gu = jnp.einsum("nd,dkf->nkf", x, gate_up)
    return x + (jax.nn.gelu(gu[:, 0]) * gu[:, 1]) @ down


def gated_stack(params, x):
    for l in range(L):
        x = _gated(x, params["gate_up"][l].reshape(D, 2, F), params["down"][l])
    return x


def _gather_rows(w):
    return lax.all_gather(w, "fsdp", axis=0, tiled=True)


def _gather_cols(w):
    return lax.all_gather(w, "fsdp", axis=1, tiled=True)


def _zero3_stack(gather_gate_up):
    def local(params, x):
        def layer(h, w):
            gate_up = gather_gate_up(w["gate_up"]).reshape(D, 2, F)
            return _gated(h, gate_up, _gather_rows(w["down"])), None

        out, _ = lax.scan(jax.checkpoint(layer), x, params)
        return out
    return local


_STACK_SPECS = {"gate_up": P(None, "fsdp"), "down": P(None, "fsdp")}


def gated_stack_fsdp(params, x, mesh):
    return jax.shard_map(_zero3_stack(_gather_rows), mesh=mesh, in_specs=(_STACK_SPECS, P("fsdp")),
                         out_specs=P("fsdp"))(params, x)


def gated_stack_fsdp_cols(params, x, mesh):
    return jax.shard_map(_zero3_stack(_gather_cols), mesh=mesh, in_specs=(_STACK_SPECS, P("fsdp")),
                         out_specs=P("fsdp"))(params, x)


# ---- training step: grad through the gather, (data, fsdp) mesh --------------------------------

LR = 0.1


def train_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"w1": f(D, F), "w2": f(F, D)}, f(N, D), f(N, D)


def _loss(params, x, y):
    return jnp.mean((jnp.tanh(x @ params["w1"]) @ params["w2"] - y) ** 2)


def sgd_step(params, x, y):
    loss, grads = jax.value_and_grad(_loss)(params, x, y)
    return jax.tree.map(lambda p, g: p - LR * g, params, grads), loss


def _fsdp_step(grad_axis):
    def local(shards, x, y):
        def sharded_loss(shards):
            full = jax.tree.map(_gather_rows, shards)
            return _loss(full, x, y)

        # local batch loss; the gather's transpose sums the fsdp replicas' gradients into each shard
        loss, grads = jax.value_and_grad(sharded_loss)(lax.pcast(shards, "data", to="varying"))
        grads = jax.tree.map(lambda g: lax.pmean(g, grad_axis) / lax.axis_size("fsdp"), grads)
        new = jax.tree.map(lambda p, g: p - LR * g, shards, grads)
        return new, lax.pmean(loss, ("data", "fsdp"))
    return local


def _fsdp_call(local, params, x, y, mesh):
    batch = P(("data", "fsdp"))
    specs = {"w1": P("fsdp"), "w2": P("fsdp")}
    return jax.shard_map(local, mesh=mesh, in_specs=(specs, batch, batch), out_specs=(specs, P()),
                         check_vma=False)(params, x, y)


def sgd_step_fsdp(params, x, y, mesh):
    return _fsdp_call(_fsdp_step("data"), params, x, y, mesh)


def sgd_step_fsdp_grad_axis(params, x, y, mesh):
    return _fsdp_call(_fsdp_step("fsdp"), params, x, y, mesh)
