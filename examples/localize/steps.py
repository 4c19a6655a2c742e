"""A step the reference takes that its sharded version leaves out: a residual add at the return of
a shard body, a scale between the scores' einsum and a causal `jnp.where`. Each buggy function has
ONE defect on the line marked with a BUG comment (configs/localize.yaml, bench/localization.py)."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

T, D, F, H, HD = 8, 16, 32, 4, 8


def mlp_inputs():
    s = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)  # noqa: E731
    return s(T, D), s(D, F), s(F, D)


def residual_mlp(x, w_in, w_out):
    h = jax.nn.relu(x @ w_in)
    return x + h @ w_out


def residual_mlp_tp_unfinished(x, w_in, w_out):
    def body(x, w_in, w_out):
        h = jax.nn.relu(x @ w_in)
        out = lax.psum(h @ w_out, "tp")
        return out  # BUG: the reference adds the residual x here

    return jax.shard_map(body, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P())(x, w_in, w_out)


def score_inputs():
    s = jax.ShapeDtypeStruct((H, T, HD), jnp.float32)
    return s, s


def causal_scores(q, k):
    s = jnp.einsum("htd,hsd->hts", q, k)
    s = s * HD**-0.5
    keep = jnp.tril(jnp.ones((T, T), bool))
    return jax.nn.softmax(jnp.where(keep, s, -1e9), axis=-1)


def causal_scores_heads_unscaled(q, k):
    def per_head(q, k):
        s = jnp.einsum("htd,hsd->hts", q, k)  # BUG: the reference scales the scores after this line
        keep = jnp.tril(jnp.ones((T, T), bool))
        return jax.nn.softmax(jnp.where(keep, s, -1e9), axis=-1)

    spec = P("tp", None, None)
    return jax.shard_map(per_head, in_specs=(spec, spec), out_specs=spec)(q, k)
