"""bf16 SwiGLU MLP with f32 accumulation (preferred_element_type) and a bf16 residual stream;
Megatron column/row split over 'tp', the row-parallel partial sums reduced in f32."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

TOKENS, DIM, FF = 8, 16, 32
BF16, F32 = jnp.bfloat16, jnp.float32


def _mm(a, b):
    return lax.dot(a, b, preferred_element_type=F32)


def swiglu(x, w_gate, w_up, w_down):
    """all arguments bf16; returns bf16."""
    g = _mm(x, w_gate)
    u = _mm(x, w_up)
    act = (jax.nn.silu(g) * u).astype(BF16)
    return (x.astype(F32) + _mm(act, w_down)).astype(BF16)


def _swiglu_tp(reduce):
    def local(x, w_gate, w_up, w_down):
        act = (jax.nn.silu(_mm(x, w_gate)) * _mm(x, w_up)).astype(BF16)
        partial_down = _mm(act, w_down)                    # f32 partial sum over FF shards
        return (x.astype(F32) + reduce(partial_down)).astype(BF16)

    col, row = P(None, "tp"), P("tp", None)
    return jax.shard_map(local, in_specs=(P(), col, col, row), out_specs=P())


def swiglu_tp(x, w_gate, w_up, w_down):
    return _swiglu_tp(lambda t: lax.psum(t, "tp"))(x, w_gate, w_up, w_down)


def swiglu_tp_pmean(x, w_gate, w_up, w_down):
    return _swiglu_tp(lambda t: lax.pmean(t, "tp"))(x, w_gate, w_up, w_down)


def shapes():
    s = jax.ShapeDtypeStruct
    return (s((TOKENS, DIM), BF16), s((DIM, FF), BF16), s((DIM, FF), BF16), s((FF, DIM), BF16))
