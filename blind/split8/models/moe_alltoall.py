"""Top-1 MoE FFN: reference gathers each token's expert weights, EP version dispatches with all_to_all."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N_TOKENS, HIDDEN, FFN, N_EXPERTS = 16, 8, 16, 4


def moe_ffn(tokens, router, w1, w2):
    logits = tokens @ router
    expert = jnp.argmax(logits, axis=-1)
    gate = jax.nn.sigmoid(jnp.max(logits, axis=-1))
    h = jax.nn.silu(jnp.einsum("td,tdf->tf", tokens, w1[expert]))
    return gate[:, None] * jnp.einsum("tf,tfd->td", h, w2[expert])


def moe_inputs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((N_TOKENS, HIDDEN), f),
            jax.ShapeDtypeStruct((HIDDEN, N_EXPERTS), f),
            jax.ShapeDtypeStruct((N_EXPERTS, HIDDEN, FFN), f),
            jax.ShapeDtypeStruct((N_EXPERTS, FFN, HIDDEN), f))


def _dispatch_tensor(expert, n_tokens):
    # capacity = tokens per group, so no token is ever dropped
    onehot = jax.nn.one_hot(expert, N_EXPERTS)
    slot = (jnp.cumsum(onehot, axis=0) - 1) * onehot
    return onehot[:, :, None] * jax.nn.one_hot(slot.sum(-1), n_tokens)[:, None, :]


def _ep_body(tokens, router, w1, w2):
    logits = tokens @ router
    expert = jnp.argmax(logits, axis=-1)
    gate = jax.nn.sigmoid(jnp.max(logits, axis=-1))
    dispatch = _dispatch_tensor(expert, tokens.shape[0])
    buf = jnp.einsum("tec,td->ecd", dispatch, tokens)
    buf = lax.all_to_all(buf, "ep", split_axis=0, concat_axis=1, tiled=True)
    h = jax.nn.silu(jnp.einsum("ecd,edf->ecf", buf, w1))
    out = jnp.einsum("ecf,efd->ecd", h, w2)
    out = lax.all_to_all(out, "ep", split_axis=1, concat_axis=0, tiled=True)
    combine = dispatch * gate[:, None, None]
    return jnp.einsum("tec,ecd->td", combine, out)


def _ep_body_v2(tokens, router, w1, w2):
    logits = tokens @ router
    expert = jnp.argmax(logits, axis=-1)
    dispatch = _dispatch_tensor(expert, tokens.shape[0])
    buf = jnp.einsum("tec,td->ecd", dispatch, tokens)
    buf = lax.all_to_all(buf, "ep", split_axis=0, concat_axis=1, tiled=True)
    h = jax.nn.silu(jnp.einsum("ecd,edf->ecf", buf, w1))
    out = jnp.einsum("ecf,efd->ecd", h, w2)
    out = lax.all_to_all(out, "ep", split_axis=1, concat_axis=0, tiled=True)
    return jnp.einsum("tec,ecd->td", dispatch, out)


def moe_ffn_ep(tokens, router, w1, w2):
    fn = jax.shard_map(_ep_body, in_specs=(P("ep"), P(), P("ep"), P("ep")), out_specs=P("ep"))
    return fn(tokens, router, w1, w2)


def moe_ffn_ep_v2(tokens, router, w1, w2):
    fn = jax.shard_map(_ep_body_v2, in_specs=(P("ep"), P(), P("ep"), P("ep")), out_specs=P("ep"))
    return fn(tokens, router, w1, w2)
