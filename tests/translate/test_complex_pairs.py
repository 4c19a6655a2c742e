"""Complex values as pairs of real ones (translate/complex_pairs.py): a rotary embedding written
with complex numbers in one program and with cos/sin on real pairs in the other, either way round,
in several styles (`lax.complex` or `a + 1j * b`, `jnp.exp(1j * θ)` or `cos + 1j * sin`, `.real`
or `jnp.real`); near misses that differ only in the complex arithmetic (the conjugate rotation,
real and imaginary parts swapped, a complex quotient against the quotients of the parts), and an
op on complex values without a model (a complex divide), which stays `unproven`, never `verified`."""

from __future__ import annotations

import textwrap

import model_package
import pytest
from model_package import verify_named as _verify

from equivci.results import Status

MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    S, H, HD = 8, 4, 8


    def inputs():
        return (jax.ShapeDtypeStruct((S, H, HD), jnp.float32),)


    def _angles(pos):
        return pos[:, None].astype(jnp.float32) * (100.0 ** (-jnp.arange(HD // 2, dtype=jnp.float32) / (HD // 2)))


    def rope_complex(q):
        z = q[..., 0::2] + 1j * q[..., 1::2]
        z = z * jnp.exp(1j * _angles(jnp.arange(S)))[:, None, :]
        return jnp.stack([z.real, z.imag], axis=-1).reshape(q.shape)


    def _real(q, pos, sign=1.0):
        ang = _angles(pos)[:, None, :]
        a, b = q[..., 0::2], q[..., 1::2]
        cos, sin = jnp.cos(ang), sign * jnp.sin(ang)
        return jnp.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(q.shape)


    def rope_real(q):
        return _real(q, jnp.arange(S))


    def rope_real_sp(q, *, mesh):
        def body(qs):
            rows = qs.shape[0]
            return _real(qs, lax.axis_index("sp") * rows + jnp.arange(rows))

        return jax.shard_map(body, mesh=mesh, in_specs=P("sp"), out_specs=P("sp"))(q)


    def rope_real_sp_conjugate(q, *, mesh):
        def body(qs):
            rows = qs.shape[0]
            return _real(qs, lax.axis_index("sp") * rows + jnp.arange(rows), sign=-1.0)  # MARK:conjugate

        return jax.shard_map(body, mesh=mesh, in_specs=P("sp"), out_specs=P("sp"))(q)


    def _complex_heads(q, swap=False, divide=False):
        z = lax.complex(q[..., 0::2], q[..., 1::2])
        ang = _angles(jnp.arange(S))[:, None, :]
        if divide:
            z = z / (jnp.cos(ang) - 1j * jnp.sin(ang))  # MARK:divide
        else:
            z = z * (jnp.cos(ang) + 1j * jnp.sin(ang))
        parts = (jnp.imag(z), jnp.real(z)) if swap else (jnp.real(z), jnp.imag(z))  # MARK:swap
        return jnp.stack(parts, axis=-1).reshape(q.shape)


    def parts_divided(q):
        ang = _angles(jnp.arange(S))[:, None, :]
        return jnp.stack([q[..., 0::2] / (jnp.cos(ang) + 2), q[..., 1::2] / (jnp.sin(ang) + 2)], -1).reshape(q.shape)


    def complex_divided_tp(q, *, mesh):
        def body(q):
            ang = _angles(jnp.arange(S))[:, None, :]
            z = lax.complex(q[..., 0::2], q[..., 1::2]) / lax.complex(jnp.cos(ang) + 2, jnp.sin(ang) + 2)  # MARK:quotient
            return jnp.stack([z.real, z.imag], -1).reshape(q.shape)

        return jax.shard_map(body, mesh=mesh, in_specs=P(None, "tp"), out_specs=P(None, "tp"))(q)


    def rope_complex_tp(q, *, mesh):
        return jax.shard_map(_complex_heads, mesh=mesh, in_specs=P(None, "tp"), out_specs=P(None, "tp"))(q)


    def rope_complex_tp_swapped(q, *, mesh):
        body = lambda q: _complex_heads(q, swap=True)
        return jax.shard_map(body, mesh=mesh, in_specs=P(None, "tp"), out_specs=P(None, "tp"))(q)


    def rope_complex_tp_divided(q, *, mesh):
        body = lambda q: _complex_heads(q, divide=True)
        return jax.shard_map(body, mesh=mesh, in_specs=P(None, "tp"), out_specs=P(None, "tp"))(q)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: complex-ref-real-sp, reference: m.py:rope_complex, distributed: m.py:rope_real_sp,
         inputs: m.py:inputs, mesh: {sp: 2}}
      - {name: real-ref-complex-tp, reference: m.py:rope_real, distributed: m.py:rope_complex_tp,
         inputs: m.py:inputs, mesh: {tp: 2}}
      - {name: complex-ref-complex-tp, reference: m.py:rope_complex, distributed: m.py:rope_complex_tp,
         inputs: m.py:inputs, mesh: {tp: 2}}
      - {name: conjugate, reference: m.py:rope_complex, distributed: m.py:rope_real_sp_conjugate,
         inputs: m.py:inputs, mesh: {sp: 2}}
      - {name: swapped, reference: m.py:rope_real, distributed: m.py:rope_complex_tp_swapped,
         inputs: m.py:inputs, mesh: {tp: 2}}
      - {name: divided, reference: m.py:rope_real, distributed: m.py:rope_complex_tp_divided,
         inputs: m.py:inputs, mesh: {tp: 2}}
      - {name: quotient-per-part, reference: m.py:parts_divided, distributed: m.py:complex_divided_tp,
         inputs: m.py:inputs, mesh: {tp: 2}}
    """
)

EQUIVALENT = ["complex-ref-real-sp", "real-ref-complex-tp", "complex-ref-complex-tp"]
# quotient-per-part: a complex quotient is not the quotient of the parts (only sums and layout
# ops act part by part)
NEAR_MISSES = ["conjugate", "swapped", "quotient-per-part"]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("complex"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", EQUIVALENT)
def test_complex_and_real_pairs_verify(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", NEAR_MISSES)
def test_complex_near_misses_are_mismatches(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)


def test_a_complex_op_without_a_model_is_not_verified(manifest):
    """z / conj(e^{iθ}) is z · e^{iθ}, but a complex divide has no model: nothing is claimed of it,
    and the numeric check finds the outputs equal, so the verdict is `unproven`."""
    result = _verify(manifest, "divided")
    assert result.status is Status.UNPROVEN, (result.status, result.findings)
