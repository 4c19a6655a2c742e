"""Two attention layers alternating local and global (Gemma-2 / Longformer-style): layer 0 is a
causal sliding window (a query sees the WINDOW most recent keys, itself included), layer 1 is
fully causal; both add ALiBi biases (-slope_h * distance, geometric head slopes). Single-head
projections per layer are [D, H, HD] einsums; no MLP.

Context parallel: queries sharded over the sequence, keys / values all-gathered.
- `alibi_cp`: {cp: 4}; each device's query positions are `axis_index("cp") * S_LOCAL + iota`,
  key positions `arange(S)`, the window and causal masks and the ALiBi distance computed from them;
- `alibi_dp_cp`: {dp: 2, cp: 2}, batch over dp, sequence over cp; the device's query positions are
  a `dynamic_slice` of a global position row `arange(S)` at the cp shard offset, and the mask
  predicates are written as a helper on (query, key) positions shared by both layers.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H, HD = 4, 16, 16, 4, 4
WINDOW = 4


def alibi_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    layer = lambda: {"q": f(D, H, HD), "k": f(D, H, HD), "v": f(D, H, HD), "o": f(H, HD, D)}
    return [layer(), layer()], f(B, S, D)


def slopes():
    return 2.0 ** (-8.0 * jnp.arange(1, H + 1, dtype=jnp.float32) / H)


def _attend(p, xq, xkv, allowed, dist):
    q = jnp.einsum("bsd,dhe->bhse", xq, p["q"])
    k = jnp.einsum("bsd,dhe->bhse", xkv, p["k"])
    v = jnp.einsum("bsd,dhe->bhse", xkv, p["v"])
    s = jnp.einsum("bhqe,bhke->bhqk", q, k) / jnp.sqrt(jnp.float32(HD))
    s = s - slopes()[:, None, None] * dist.astype(jnp.float32)
    s = jnp.where(allowed, s, -1e9)
    return jnp.einsum("bhqk,bhke,hed->bqd", jax.nn.softmax(s, axis=-1), v, p["o"])


def alibi(layers, x):
    qp = jnp.arange(S)[:, None]
    kp = jnp.arange(S)[None, :]
    local = (kp <= qp) & (qp - kp < WINDOW)
    full = kp <= qp
    for p, allowed in zip(layers, (local, full)):
        x = x + _attend(p, x, x, allowed, qp - kp)
    return x


# ---- {cp: 4}: iota offsets ----------------------------------------------------------------------

def _cp_local(window_ok):
    def local(layers, x):
        n = S // 4
        qp = (lax.axis_index("cp") * n + lax.iota(jnp.int32, n))[:, None]
        kp = lax.iota(jnp.int32, S)[None, :]
        masks = ((kp <= qp) & window_ok(qp - kp), kp <= qp)
        for p, allowed in zip(layers, masks):
            kv = lax.all_gather(x, "cp", axis=1, tiled=True)
            x = x + _attend(p, x, kv, allowed, qp - kp)
        return x
    return local


def alibi_cp(layers, x, mesh):
    return jax.shard_map(_cp_local(lambda d: d < WINDOW), mesh=mesh, in_specs=(P(), P(None, "cp")),
                         out_specs=P(None, "cp"))(layers, x)


def alibi_cp_window_inclusive(layers, x, mesh):
    return jax.shard_map(_cp_local(lambda d: d <= WINDOW), mesh=mesh,
                         in_specs=(P(), P(None, "cp")), out_specs=P(None, "cp"))(layers, x)


# ---- {dp: 2, cp: 2}: sliced position row --------------------------------------------------------

def visible(qp, kp, window):
    causal = kp[None, :] <= qp[:, None]
    if window is None:
        return causal
    return causal & (qp[:, None] - kp[None, :] < window)


def _dp_cp_local(shard_axis):
    def local(layers, x):
        n = x.shape[1]
        pos = jnp.arange(S)
        qp = lax.dynamic_slice_in_dim(pos, lax.axis_index(shard_axis) * n, n)
        for p, window in zip(layers, (WINDOW, None)):
            kv = lax.all_gather(x, "cp", axis=1, tiled=True)
            x = x + _attend(p, x, kv, visible(qp, pos, window), qp[:, None] - pos[None, :])
        return x
    return local


def alibi_dp_cp(layers, x, mesh):
    return jax.shard_map(_dp_cp_local("cp"), mesh=mesh, in_specs=(P(), P("dp", "cp")),
                         out_specs=P("dp", "cp"))(layers, x)


def alibi_dp_cp_offset_from_dp(layers, x, mesh):
    return jax.shard_map(_dp_cp_local("dp"), mesh=mesh, in_specs=(P(), P("dp", "cp")),
                         out_specs=P("dp", "cp"))(layers, x)
