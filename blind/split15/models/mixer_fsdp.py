"""MLP-Mixer block pair (token-mixing MLP across the sequence, channel-mixing MLP across features,
each pre-LayerNorm with residual), weights stored PyTorch-style as [out, in] and applied as
`x @ w.T`. ZeRO-3 / FSDP on {data: 2, fsdp: 4}: batch over both axes, every weight sharded over
`fsdp` and gathered just before use.

- `mixer_fsdp_columns`: each [out, in] weight sharded on its input dim (P(None, "fsdp")) and
  rebuilt by `all_gather(axis=1, tiled=True)`;
- `mixer_fsdp_flat`: each weight flattened to a 1-D buffer outside the shard_map, sharded in
  contiguous chunks, gathered flat and reshaped to [out, in] before the matmul.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, C, TOK_H, CH_H = 8, 8, 16, 32, 64
NAMES = ("tok_w1", "tok_w2", "ch_w1", "ch_w2")
SHAPES = {"tok_w1": (TOK_H, S), "tok_w2": (S, TOK_H), "ch_w1": (CH_H, C), "ch_w2": (C, CH_H)}


def mixer_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {n: f(*SHAPES[n]) for n in NAMES}
    params.update(ln1=f(C), ln2=f(C))
    return params, f(B, S, C)


def _ln(x, g):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g


def _linear(x, w):
    return x @ w.T


def _mix(w, x, norm2):
    t = _ln(x, w["ln1"]).swapaxes(1, 2)
    x = x + _linear(jax.nn.gelu(_linear(t, w["tok_w1"])), w["tok_w2"]).swapaxes(1, 2)
    h = norm2(x, w["ln2"])
    return x + _linear(jax.nn.gelu(_linear(h, w["ch_w1"])), w["ch_w2"])


def mixer(params, x):
    return _mix(params, x, _ln)


BATCH = P(("data", "fsdp"))


# ---- shards on the input dim --------------------------------------------------------------------

def _gather_columns(w):
    return lax.all_gather(w, "fsdp", axis=1, tiled=True)


def _gather_rows_then_reshape(w):
    out, inp = w.shape[0], w.shape[1] * 4
    return lax.all_gather(w, "fsdp", axis=0, tiled=True).reshape(out, inp)


def _columns(gather, params, x, mesh):
    def local(params, x):
        w = {n: gather(params[n]) for n in NAMES}
        return _mix(dict(params, **w), x, _ln)

    specs = {n: P(None, "fsdp") for n in NAMES}
    specs.update(ln1=P(), ln2=P())
    return jax.shard_map(local, mesh=mesh, in_specs=(specs, BATCH), out_specs=BATCH,
                         check_vma=False)(params, x)


def mixer_fsdp_columns(params, x, mesh):
    return _columns(_gather_columns, params, x, mesh)


def mixer_fsdp_columns_gather_rows(params, x, mesh):
    return _columns(_gather_rows_then_reshape, params, x, mesh)


# ---- flat buffers ---------------------------------------------------------------------------------

def _flat(norm2, params, x, mesh):
    flat = {n: params[n].reshape(-1) for n in NAMES}

    def local(flat, ln, x):
        w = {n: lax.all_gather(flat[n], "fsdp", tiled=True).reshape(SHAPES[n]) for n in NAMES}
        return _mix(dict(ln, **w), x, norm2)

    return jax.shard_map(local, mesh=mesh, in_specs=({n: P("fsdp") for n in NAMES}, P(), BATCH),
                         out_specs=BATCH)(flat, {"ln1": params["ln1"], "ln2": params["ln2"]}, x)


def mixer_fsdp_flat(params, x, mesh):
    return _flat(_ln, params, x, mesh)


def mixer_fsdp_flat_unnormed(params, x, mesh):
    return _flat(lambda x, g: x, params, x, mesh)
