"""One odd layer in the 4-layer stack of stack.py (see examples/zoo/probes.py): identical layers
share one proof, so a layer that differs must not ride on the proof of the others."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

import stack

TP = "tp"


def _tensor_parallel(x, params, mesh, block, check_vma=True):
    def body(x, params):
        h = x
        for i, layer in enumerate(params["layers"]):
            with jax.named_scope(f"layers_{i}"):
                h = block(i, h, layer, params["layers"])
        return stack._head(h, params["head"])

    specs = stack._specs(params, P(None, TP), P(TP, None), P(None, TP))
    return jax.shard_map(body, mesh=mesh, in_specs=(P(), specs), out_specs=P(None, TP), check_vma=check_vma)(x, params)


def _block(h, w_in, w_out, reduce=lambda t: lax.psum(t, TP), bias=0.0):
    return jnp.tanh(h + bias + reduce(jnp.tanh(h @ w_in) @ w_out))


def layer2_reads_layer1_w_out(x, params, *, mesh):
    return _tensor_parallel(x, params, mesh, lambda i, h, l, ls: _block(h, l["w_in"], ls[1 if i == 2 else i]["w_out"]))


def layer1_tiny_bias(x, params, *, mesh):
    return _tensor_parallel(x, params, mesh, lambda i, h, l, ls: _block(h, l["w_in"], l["w_out"], bias=1e-6 if i == 1 else 0.0))


def layer3_no_psum(x, params, *, mesh):
    def block(i, h, l, ls):
        return _block(h, l["w_in"], l["w_out"], reduce=(lambda t: t) if i == 3 else (lambda t: lax.psum(t, TP)))

    return _tensor_parallel(x, params, mesh, block, check_vma=False)


def layer0_input_scaled(x, params, *, mesh):
    return _tensor_parallel(x, params, mesh, lambda i, h, l, ls: _block(h * (1.0 + 1e-6) if i == 0 else h, l["w_in"], l["w_out"]))
