"""One training step of a CLIP-style dual encoder (linear towers, L2-normalised embeddings, learned
log temperature, symmetric InfoNCE over the whole global batch) with SGD + heavy-ball momentum.
Returns (new params, new momentum, loss).

Data parallel on {dp: 4}: each device holds 4 of the 16 image/text pairs; parameters replicated.

- `clip_gather_embeddings`: the local embeddings are all-gathered (tiled), each device scores its
  own rows against the global batch in both directions (labels = global row ids); the local
  objective is its share of the global sum, and the gradients (whose all_gather cotangents come back
  as psum_scatter) are psum'd;
- `clip_gather_features`: the raw features are all-gathered and every device embeds the whole batch,
  scores its own rows, and the local mean loss and its gradients are pmean'd.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N, DI, DT, E = 16, 24, 12, 16
DP = 4
NL = N // DP
LR, MU = 0.1, 0.9


def clip_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"img": f(DI, E), "txt": f(DT, E), "log_t": f()}
    return params, params, f(N, DI), f(N, DT)


def embed(w, x):
    z = x @ w
    return z / jnp.linalg.norm(z, axis=-1, keepdims=True)


def xent_rows(logits, labels):
    return jax.nn.logsumexp(logits, axis=-1) - jnp.take_along_axis(
        logits, labels[:, None], axis=-1)[:, 0]


def clip_loss(params, img, txt):
    zi, zt = embed(params["img"], img), embed(params["txt"], txt)
    logits = jnp.exp(params["log_t"]) * zi @ zt.T
    labels = jnp.arange(N)
    return (xent_rows(logits, labels).mean() + xent_rows(logits.T, labels).mean()) / 2


def sgd_momentum(params, moms, grads):
    moms = jax.tree.map(lambda m, g: MU * m + g, moms, grads)
    return jax.tree.map(lambda p, m: p - LR * m, params, moms), moms


def clip_step(params, moms, img, txt):
    loss, grads = jax.value_and_grad(clip_loss)(params, img, txt)
    new_p, new_m = sgd_momentum(params, moms, grads)
    return new_p, new_m, loss


def _my_rows():
    return lax.axis_index("dp") * NL + jnp.arange(NL)


# ---- gather embeddings -------------------------------------------------------------------------------

def _local_share(params, img, txt):
    zi, zt = embed(params["img"], img), embed(params["txt"], txt)
    zi_all = lax.all_gather(zi, "dp", tiled=True)
    zt_all = lax.all_gather(zt, "dp", tiled=True)
    scale = jnp.exp(params["log_t"])
    rows = _my_rows()
    total = xent_rows(scale * zi @ zt_all.T, rows).sum() + xent_rows(scale * zt @ zi_all.T, rows).sum()
    return total / (2 * N)


def _embeddings_step(reduce_grads, params, moms, img, txt):
    share, grads = jax.value_and_grad(_local_share)(params, img, txt)
    new_p, new_m = sgd_momentum(params, moms, reduce_grads(grads))
    return new_p, new_m, lax.psum(share, "dp")


def _gather_embeddings(reduce_grads, params, moms, img, txt, mesh):
    local = lambda p, m, i, t: _embeddings_step(reduce_grads, p, m, i, t)
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P("dp"), P("dp")),
                         out_specs=(P(), P(), P()), check_vma=False)(params, moms, img, txt)


def clip_gather_embeddings(params, moms, img, txt, mesh):
    return _gather_embeddings(lambda g: lax.psum(g, "dp"), params, moms, img, txt, mesh)


def clip_gather_embeddings_grads_unreduced(params, moms, img, txt, mesh):
    return _gather_embeddings(lambda g: g, params, moms, img, txt, mesh)


# ---- gather features ---------------------------------------------------------------------------------

def _rows_mean(params, img_all, txt_all, rows):
    zi, zt = embed(params["img"], img_all), embed(params["txt"], txt_all)
    logits = jnp.exp(params["log_t"]) * zi[rows] @ zt.T
    logits_t = jnp.exp(params["log_t"]) * zt[rows] @ zi.T
    return (xent_rows(logits, rows).mean() + xent_rows(logits_t, rows).mean()) / 2


def _features_step(params, moms, img, txt, rows_fn):
    img_all = lax.all_gather(img, "dp", tiled=True)
    txt_all = lax.all_gather(txt, "dp", tiled=True)
    loss, grads = jax.value_and_grad(_rows_mean)(params, img_all, txt_all, rows_fn())
    new_p, new_m = sgd_momentum(params, moms, lax.pmean(grads, "dp"))
    return new_p, new_m, lax.pmean(loss, "dp")


def _local_rows():
    return jnp.arange(NL)


def _gather_features(rows_fn, params, moms, img, txt, mesh):
    local = lambda p, m, i, t: _features_step(p, m, i, t, rows_fn)
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P("dp"), P("dp")),
                         out_specs=(P(), P(), P()), check_vma=False)(params, moms, img, txt)


def clip_gather_features(params, moms, img, txt, mesh):
    return _gather_features(_my_rows, params, moms, img, txt, mesh)


def clip_gather_features_local_labels(params, moms, img, txt, mesh):
    return _gather_features(_local_rows, params, moms, img, txt, mesh)
