"""Tensor-parallel blocks that compute in bfloat16 the ways production code does, for the numeric
oracle's precision tests: each correct variant differs from its reference only by the rounding of
re-associated sums, each buggy one by a real defect.

- norm_mlp: an RMSNorm in float32 cast to bfloat16, then bf16 matmuls with float32 accumulation
  (Megatron MLP, all-reduce in float32), float32 logits.
- bf16_mlp: everything in bfloat16, bf16 matmul results and a bf16 all-reduce of them, as
  bf16-native training code does; the reference's own matmul rounds its bf16 result too.
- attention: heads split over the mesh, scores in bfloat16, softmax in float32 cast back.
- jit_block: the same norm + MLP sharded by jit and sharding constraints alone.
- deep: 16 residual blocks of the norm + MLP; the floor must not grow with depth, so a dropped
  final norm is still a difference.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

T, D, F, H = 16, 64, 384, 4
LONG = 256  # tokens of the float32-tolerance cases
HD = D // H
BF16, F32 = jnp.bfloat16, jnp.float32


def _spec(*shape, dtype=F32):
    return jax.ShapeDtypeStruct(shape, dtype)


def _rms(x, w):
    xf = x.astype(F32)
    return (xf * lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + 1e-6)).astype(BF16) * w.astype(BF16)


def _mm(a, b):
    return jnp.dot(a.astype(BF16), b.astype(BF16), preferred_element_type=F32)


# --- norm + MLP, f32 accumulation -------------------------------------------------------------------


def norm_mlp(x, g, w1, w2, head):
    h = _mm(jax.nn.gelu(_mm(_rms(x, g), w1)), w2) + x
    return _mm(_rms(h, g), head)


def norm_mlp_inputs(tokens=T):
    return (_spec(tokens, D), _spec(D), _spec(D, F), _spec(F, D), _spec(D, 96))


def norm_mlp_many_tokens():
    # A flipped bf16 rounding needs a re-associated sum within ~1e-7 of a rounding boundary: rare
    # per element, so the float32-tolerance cases take enough tokens to meet one on every seed.
    return norm_mlp_inputs(LONG)


def _norm_mlp_tp(reduce):
    def dist(x, g, w1, w2, head, *, mesh):
        def body(x, g, w1, w2, head):
            h = reduce(_mm(jax.nn.gelu(_mm(_rms(x, g), w1)), w2)) + x
            return _mm(_rms(h, g), head)

        # check_vma off: the buggy variant returns unreduced partial sums as if replicated.
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P(None, "tp"), P("tp", None), P()),
                             out_specs=P(), check_vma=False)(x, g, w1, w2, head)

    return dist


norm_mlp_tp = _norm_mlp_tp(lambda v: lax.psum(v, "tp"))
norm_mlp_tp_missing_psum = _norm_mlp_tp(lambda v: v)  # BUG: the partial sums are never all-reduced


# --- bf16 end to end ---------------------------------------------------------------------------------


def bf16_mlp(x, w1, w2):
    x = x.astype(BF16)
    return (jnp.tanh(x @ w1.astype(BF16)) @ w2.astype(BF16)).astype(F32)


def bf16_mlp_inputs():
    return (_spec(T, D), _spec(D, F), _spec(F, D))


def bf16_mlp_tp(x, w1, w2, *, mesh):
    def body(x, w1, w2):
        x = x.astype(BF16)
        return lax.psum(jnp.tanh(x @ w1.astype(BF16)) @ w2.astype(BF16), "tp").astype(F32)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P())(x, w1, w2)


def bf16_mlp_tp_wrong_shard(x, w1, w2, *, mesh):
    def body(x, w1, w2):
        x = x.astype(BF16)
        n = lax.axis_size("tp")
        w2_mine = lax.dynamic_slice_in_dim(w2, ((lax.axis_index("tp") + 1) % n) * (F // n), F // n)  # BUG: the next shard's rows
        return lax.psum(jnp.tanh(x @ w1.astype(BF16)) @ w2_mine.astype(BF16), "tp").astype(F32)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "tp"), P()), out_specs=P())(x, w1, w2)


# --- attention with bf16 scores --------------------------------------------------------------------------


def _attend(x, wq, wk, wv, wo, heads):
    def split(w):
        return (x.astype(BF16) @ w.astype(BF16)).reshape(T, heads, HD)

    q, k, v = split(wq), split(wk), split(wv)
    s = jnp.einsum("thd,shd->hts", q, k) * jnp.asarray(HD ** -0.5, BF16)
    p = jax.nn.softmax(s.astype(F32), axis=-1).astype(BF16)
    o = jnp.einsum("hts,shd->thd", p, v).reshape(T, heads * HD)
    return jnp.dot(o, wo.astype(BF16), preferred_element_type=F32)


def attention(x, wq, wk, wv, wo):
    return _attend(x, wq, wk, wv, wo, H)


def attention_inputs():
    return (_spec(T, D), _spec(D, D), _spec(D, D), _spec(D, D), _spec(D, D))


def _attention_tp(shift):
    def dist(x, wq, wk, wv, wo, *, mesh):
        def body(x, wq, wk, wv, wo):
            n = lax.axis_size("tp")
            width = D // n
            start = ((lax.axis_index("tp") + shift) % n) * width
            wo_mine = lax.dynamic_slice_in_dim(wo, start, width)
            return lax.psum(_attend(x, wq, wk, wv, wo_mine, H // n), "tp")

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "tp"), P(None, "tp"), P(None, "tp"), P()),
                             out_specs=P())(x, wq, wk, wv, wo)

    return dist


attention_tp = _attention_tp(0)
attention_tp_wrong_offset = _attention_tp(1)  # BUG: wo rows of the neighbour's heads (offset ignores the shard)


# --- jit and sharding constraints only -------------------------------------------------------------------


def jit_block(x, g, w1, w2, head, *, mesh):
    def put(v, *spec):
        return lax.with_sharding_constraint(v, NamedSharding(mesh, P(*spec)))

    w1, w2 = put(w1, None, "tp"), put(w2, "tp", None)
    h = put(_mm(jax.nn.gelu(put(_mm(_rms(x, g), w1), None, "tp")), w2), None, None) + x
    return _mm(_rms(h, g), head)


# --- a deep residual stack: the floor must not grow with depth -------------------------------------------

LAYERS = 16


def _deep(x, g, w1, w2, head, final_norm, reduce=lambda v: v):
    for _ in range(LAYERS):
        x = x + reduce(_mm(jax.nn.silu(_mm(_rms(x, g), w1)), w2))
    return _mm(_rms(x, g) if final_norm else x, head)


def deep(x, g, w1, w2, head):
    return _deep(x, g, w1, w2, head, final_norm=True)


def _deep_tp(final_norm):
    def dist(x, g, w1, w2, head, *, mesh):
        def body(x, g, w1, w2, head):
            return _deep(x, g, w1, w2, head, final_norm, reduce=lambda v: lax.psum(v, "tp"))

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P(None, "tp"), P("tp", None), P()),
                             out_specs=P())(x, g, w1, w2, head)

    return dist


deep_tp = _deep_tp(final_norm=True)
deep_tp_no_final_norm = _deep_tp(final_norm=False)  # BUG: the final norm before the head is dropped


# --- a rounding on the other side of a scale -------------------------------------------------------------
# Gemma-style: the reference scales the embedding by sqrt(d) in float32 and then rounds to bfloat16;
# the sharded code rounds the looked-up rows first and scales in bfloat16 (the normalizer cast to the
# activation dtype). Both are correct, and they differ in nearly every element by a unit of bf16.

V = 32


def embed_scale(ids, emb, head):
    x = (emb[ids] * D**0.5).astype(BF16)
    return jnp.dot(x, head.astype(BF16), preferred_element_type=F32)


def embed_scale_inputs():
    return (jax.ShapeDtypeStruct((T,), jnp.int32), _spec(V, D), _spec(D, 96))


def _embed_scale_tp(shift):
    def dist(ids, emb, head, *, mesh):
        def body(ids, emb, head):
            rows = emb.shape[0]
            start = ((lax.axis_index("tp") + shift) % lax.axis_size("tp")) * rows
            local = ids - start
            owned = (local >= 0) & (local < rows)
            x = lax.psum(jnp.where(owned[:, None], emb[jnp.clip(local, 0, rows - 1)], 0.0), "tp")
            x = x.astype(BF16) * jnp.asarray(D**0.5, BF16)
            return jnp.dot(x, head.astype(BF16), preferred_element_type=F32)

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P("tp"), P()), out_specs=P())(ids, emb, head)

    return dist


embed_scale_tp = _embed_scale_tp(0)
embed_scale_tp_wrong_offset = _embed_scale_tp(1)  # BUG: the vocabulary rows of the neighbour shard


# Attention scores scaled after the bf16 cast of q in the sharded code, before it in the reference.
def _scaled_q_attend(x, wq, wk, heads, scale_first):
    hd = 24
    q = jnp.dot(x.astype(BF16), wq.astype(BF16), preferred_element_type=F32)
    if scale_first:
        q = (q * hd**-0.5).astype(BF16)
    else:
        q = q.astype(BF16) * jnp.asarray(hd**-0.5, BF16)
    k = jnp.dot(x.astype(BF16), wk.astype(BF16), preferred_element_type=F32).astype(BF16)
    q, k = q.reshape(T, heads, hd), k.reshape(T, heads, hd)
    return jnp.einsum("thd,shd->hts", q, k, preferred_element_type=F32)


def scaled_q(x, wq, wk):
    return _scaled_q_attend(x, wq, wk, 4, scale_first=True)


def scaled_q_inputs():
    return (_spec(T, D), _spec(D, 96), _spec(D, 96))


def _scaled_q_tp(reduced):
    def dist(x, wq, wk, *, mesh):
        def body(x, wq, wk):
            s = _scaled_q_attend(x, wq, wk, 4 // lax.axis_size("tp"), scale_first=False)
            return s if reduced else s * 2  # BUG (when not reduced): a stray factor left from a loss scale

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "tp"), P(None, "tp")),
                             out_specs=P("tp"))(x, wq, wk)

    return dist


scaled_q_tp = _scaled_q_tp(True)
scaled_q_tp_stray_factor = _scaled_q_tp(False)
