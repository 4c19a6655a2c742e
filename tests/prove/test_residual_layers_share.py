"""Identical layers of a residual model share one proof from the first layer on.

The residual stream is a sum of the embedding and every earlier layer's outputs; while it has at
most `Budgets.signed_terms` atoms the translator states it also as that sum in one order
(`translate/signed_sums.plain_form`), a fact that reaches into every earlier layer. A layer's
proof is tried first without such facts (those that read values of other layers the layer does not
read itself, `prove/layered.py`), so layers that compute the same thing share one proof however
deep they sit; where those facts are needed, the layer is proved again with them. Counted, not
timed: the layer proofs a model needs, at two depths and in two styles (a Megatron MLP block whose
partial sums are all-reduced, and a pre-norm block whose device computes its rows itself).
"""

from __future__ import annotations

import model_package
import pytest

from equivci.results import Status

MODEL = """
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P


def mlp(x, w1, w2, reduce=lambda t: t):
    return reduce(jax.nn.gelu(x @ w1) @ w2)


def reference(x, ws):
    for i, (w1, w2) in enumerate(reversed(ws)):
        with jax.named_scope(f"layers_{i}"):
            x = x + mlp(x, w1, w2)
    return x


def distributed(x, ws, *, mesh):
    def body(x, ws):
        for i, (w1, w2) in enumerate(reversed(ws)):
            with jax.named_scope(f"layers_{i}"):
                x = x + mlp(x, w1, w2, lambda t: jax.lax.psum(t, "tp"))
        return x

    specs = (P(), [(P(None, "tp"), P("tp", None))] * len(ws))
    return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P())(x, ws)


def norm(x):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)


def prenorm_reference(x, ws):
    for i, (w1, w2) in enumerate(reversed(ws)):
        with jax.named_scope(f"layers_{i}"):
            h = x + norm(x) @ w1
            x = h + jnp.tanh(h) @ w2
    return x


def prenorm_distributed(x, ws, *, mesh):
    def body(x, ws):
        for i, (w1, w2) in enumerate(reversed(ws)):
            with jax.named_scope(f"layers_{i}"):
                h = x + norm(x) @ w1
                x = h + jnp.tanh(h) @ w2
        return x

    specs = (P("sp"), [(P(), P())] * len(ws))
    return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P("sp"))(x, ws)


def inputs(n):
    s = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    return s(8, 16), [(s(16, 32), s(32, 16)) for _ in range(n)]


def prenorm_inputs(n):
    s = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    return s(8, 16), [(s(16, 16), s(16, 16)) for _ in range(n)]
"""
DEPTHS = (3, 7)
STYLES = {
    "mlp": ("reference", "distributed", "inputs", "tp"),
    "prenorm": ("prenorm_reference", "prenorm_distributed", "prenorm_inputs", "sp"),
}


def _source() -> str:
    return MODEL + "".join(
        f"\n\ndef {inputs}_{n}():\n    return {inputs}({n})\n" for _, _, inputs, _ in STYLES.values() for n in DEPTHS
    )


def _manifest() -> str:
    rows = "".join(
        f"  - {{name: {style}-{n}, reference: m.py:{ref}, distributed: m.py:{dist}, inputs: m.py:{inputs}_{n},"
        f" mesh: {{{axis}: 4}}}}\n"
        for style, (ref, dist, inputs, axis) in STYLES.items()
        for n in DEPTHS
    )
    return "version: 1\nmodels:\n" + rows


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("residual"), "m.py", _source(), _manifest())


@pytest.mark.parametrize("style", sorted(STYLES))
def test_a_deeper_residual_model_proves_no_layer_more(manifest, style) -> None:
    new = {}
    for n in DEPTHS:
        result = model_package.verify_named(manifest, f"{style}-{n}")
        assert result.status is Status.VERIFIED, result.findings
        assert result.layers.total == n and result.layers.verified == n
        new[n] = result.layers.total - result.layers.reused
    # the first layer reads the model's input (its stream has one atom less), the others are one proof
    assert new[DEPTHS[0]] == new[DEPTHS[1]] <= 2, new
