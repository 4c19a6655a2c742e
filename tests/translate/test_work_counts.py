"""Work counted, not timed: translating a model whose layers each compute their own tables (RoPE
angles, a causal mask: the style that once took 749 s at the 405B shape) must cost the same for
every added layer. Counts are deterministic, so the test fails when per-layer work grows, on any
machine and under any load."""

from __future__ import annotations

import textwrap

import model_package
import pytest

from equivci.hlo.parser import parse_module
from equivci.prove.programs import build_programs

MODEL = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    T, D = 32, 16


    def rope(x, positions):  # every layer builds its own angle table, at its own positions
        freqs = positions[:, None].astype(jnp.float32) / (10000.0 ** (jnp.arange(0, D, 2) / D))
        angles = jnp.concatenate([freqs, freqs], -1)
        rotated = jnp.concatenate([-x[:, D // 2:], x[:, :D // 2]], -1)
        return x * jnp.cos(angles) + rotated * jnp.sin(angles)


    def reference(x, ws):
        for i, w in enumerate(ws):
            with jax.named_scope(f"layers_{i}"):
                x = x + rope(x, jnp.arange(T) + 3 * i) @ w
        return x


    def distributed(x, ws, *, mesh):
        def body(x, ws):
            local = T // lax.axis_size("sp")
            for i, w in enumerate(ws):
                with jax.named_scope(f"layers_{i}"):
                    positions = jnp.arange(local) + lax.axis_index("sp") * local + 3 * i
                    x = x + rope(x, positions) @ w
            return x
        return jax.shard_map(body, mesh=mesh, in_specs=(P("sp"), [P()] * len(ws)), out_specs=P("sp"))(x, ws)


    def inputs(layers):
        s = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
        return (s(T, D), [s(D, D) for _ in range(layers)])
    """
)


def _manifest(layers: list[int]) -> str:
    rows = "".join(
        f"  - {{name: l{n}, reference: m.py:reference, distributed: m.py:distributed, inputs: m.py:inputs{n}, mesh: {{sp: 4}}}}\n"
        for n in layers)
    return "version: 1\nmodels:\n" + rows


@pytest.fixture(scope="module")
def counts(tmp_path_factory):
    layers = [2, 4, 8]
    source = MODEL + "".join(f"\n\ndef inputs{n}():\n    return inputs({n})\n" for n in layers)
    manifest = model_package.write_package(tmp_path_factory.mktemp("work"), "m.py", source, _manifest(layers))
    out = {}
    for model, n in zip(manifest.models, layers):
        captured = model_package.capture_named(manifest, model.name)
        programs = build_programs(parse_module(captured.reference_hlo), parse_module(captured.distributed_hlo),
                                  captured.inputs, captured.outputs, captured.num_devices)
        constants = programs.evaluator.constants
        out[n] = {"comparisons": constants.comparisons,
                  "terms": len(programs.evaluator.table), "events": len(programs.distributed_events)}
    return out


@pytest.mark.parametrize("unit", ["comparisons", "terms", "events"])
def test_per_layer_work_does_not_grow(counts, unit):
    assert 0 <= counts[2][unit] <= counts[4][unit] <= counts[8][unit], (unit, counts)  # work, counted up
    per_layer_small = (counts[4][unit] - counts[2][unit]) / 2
    per_layer_large = (counts[8][unit] - counts[4][unit]) / 4
    assert per_layer_large <= per_layer_small + 1, (unit, counts)
