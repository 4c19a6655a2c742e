"""Knowledge-distillation loss over a vocabulary split across tp: temperature-scaled
KL(teacher || student) between two LM heads, TAU^2 * mean over tokens of sum_v p_t (log p_t - log p_s).

- `kd_vocab_tp`: shard_map on {tp: 4}; both unembeddings split over vocab columns, global max by
  pmax, log-sum-exp by psum, the KL partial sums psum'd;
- `kd_vocab_jit`: plain jnp under jit on {dp: 2, tp: 2}, tokens over dp and logits constrained to
  vocab columns over tp.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N, D, V = 16, 32, 64
TAU = 2.0


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(N, D), f(N, D), f(D, V), f(D, V)


def kd_loss(hs, ht, ws, wt):
    ls = jax.nn.log_softmax(hs @ ws / TAU, axis=-1)
    lt = jax.nn.log_softmax(ht @ wt / TAU, axis=-1)
    return TAU ** 2 * jnp.mean(jnp.sum(jnp.exp(lt) * (lt - ls), axis=-1))


def _log_softmax_tp(z):
    m = lax.pmax(jnp.max(z, axis=-1, keepdims=True), "tp")
    lse = jnp.log(lax.psum(jnp.sum(jnp.exp(z - m), axis=-1, keepdims=True), "tp")) + m
    return z - lse


def _local(hs, ht, ws, wt):
    ls = _log_softmax_tp(hs @ ws / TAU)
    lt = _log_softmax_tp(ht @ wt / TAU)
    kl = lax.psum(jnp.sum(jnp.exp(lt) * (lt - ls), axis=-1), "tp")
    return TAU ** 2 * jnp.mean(kl)


def _local_student_local_lse(hs, ht, ws, wt):
    zs = hs @ ws / TAU
    ls = zs - jax.nn.logsumexp(zs, axis=-1, keepdims=True)
    lt = _log_softmax_tp(ht @ wt / TAU)
    kl = lax.psum(jnp.sum(jnp.exp(lt) * (lt - ls), axis=-1), "tp")
    return TAU ** 2 * jnp.mean(kl)


def _run(fn, mesh, *args):
    col = P(None, "tp")
    return jax.shard_map(fn, mesh=mesh, in_specs=(P(), P(), col, col), out_specs=P(), check_vma=False)(*args)


def kd_vocab_tp(hs, ht, ws, wt, mesh):
    return _run(_local, mesh, hs, ht, ws, wt)


def kd_vocab_tp_student_local_lse(hs, ht, ws, wt, mesh):
    return _run(_local_student_local_lse, mesh, hs, ht, ws, wt)


def _jit(hs, ht, ws, wt, mesh, temper_student):
    c = lambda a, *s: lax.with_sharding_constraint(a, NamedSharding(mesh, P(*s)))
    zs = c(c(hs, "dp") @ c(ws, None, "tp"), "dp", "tp")
    zt = c(c(ht, "dp") @ c(wt, None, "tp"), "dp", "tp")
    ls = jax.nn.log_softmax(temper_student(zs), axis=-1)
    lt = jax.nn.log_softmax(zt / TAU, axis=-1)
    per_token = c(jnp.sum(jnp.exp(lt) * (lt - ls), axis=-1), "dp")
    return TAU ** 2 * jnp.mean(per_token)


def kd_vocab_jit(hs, ht, ws, wt, mesh):
    return _jit(hs, ht, ws, wt, mesh, lambda z: z / TAU)


def kd_vocab_jit_student_untempered(hs, ht, ws, wt, mesh):
    return _jit(hs, ht, ws, wt, mesh, lambda z: z)
