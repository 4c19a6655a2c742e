"""HLO `conditional` (equivci.translate.conditionals): lax.cond and lax.switch as the branch a
device takes, or a select of the branches' values.

Checked against XLA on the terms (a data-dependent predicate, a switch index and its clamp, tuple
operands and results, the predicate form of hand-written HLO with an index out of range), and on
JAX programs unlike the blind pipelines: a column-parallel layer whose devices each choose their
activation with lax.switch on axis_index, and a tensor-parallel MLP whose activation is chosen by a
replicated flag (the same select on every device), and a remat'ed scan over layers that picks each
layer's activation with lax.switch on the layer index (proved once as a loop step, where the index
is unknown: both programs' selects on it). Near misses: the branches swapped, the switch
index off by one (JAX clamps it onto the last branch) or shifted by a layer, and a collective inside a branch that only
some devices take (honest `unproven`, naming the conditional).
"""

from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import model_package
import numpy as np
import pytest
from jax import lax
from model_package import verify_named as _verify

from equivci.capture.types import LeafPlacement
from equivci.hlo.parser import parse_module
from equivci.layers.segments import program_order
from equivci.prove.programs import build_programs
from equivci.results import Status
from equivci.terms.semantics import evaluate

RNG = np.random.default_rng(5)
X = RNG.standard_normal((4, 6)).astype(np.float32)


def _leaf(path: str, value) -> LeafPlacement:
    value = np.asarray(value)
    return LeafPlacement(path, value.shape, str(value.dtype), (tuple((0, n) for n in value.shape),))


def _terms(hlo: str, args):
    module = parse_module(hlo)
    inputs = tuple(_leaf(f"[{k}]", a) for k, a in enumerate(args))
    programs = build_programs(module, module, inputs, inputs, 1)
    return programs.reference_outputs, programs.evaluator.values


def _assert_xla_values(fn, args) -> None:
    outs, values = _terms(jax.jit(fn).lower(*args).as_text(dialect="hlo"), args)
    want = jax.tree_util.tree_leaves(jax.jit(fn)(*args))
    params = {k: np.asarray(a) for k, a in enumerate(args)}
    assert len(outs) == len(want)
    for term, expected in zip(outs, want):
        assert "opaque" not in {t.op for t in program_order([term])}, "the conditional was not translated"
        np.testing.assert_allclose(evaluate(term, params, values), np.asarray(expected), rtol=1e-5, atol=1e-6)


def _cond_on_data(x, flag):
    return lax.cond(flag > 0, lambda a, b: (jnp.tanh(a) * b, a.sum()), lambda a, b: (a - b, -a.max()), x, x * 0.5 + 1.0)


def _switch_on_data(x, i):
    return lax.switch(i, [jnp.sin, lambda v: v * 2.0, jnp.exp], x)


@pytest.mark.parametrize("flag", [-1.0, 0.0, 2.0])
def test_a_cond_on_a_data_predicate_with_tuples_is_what_xla_computes(flag):
    _assert_xla_values(_cond_on_data, (X, np.float32(flag)))


@pytest.mark.parametrize("index", [-3, 0, 1, 2, 7])  # JAX clamps the index before the conditional
def test_a_switch_on_a_data_index_is_what_xla_computes(index):
    _assert_xla_values(_switch_on_data, (X, np.int32(index)))


def _run_hlo(text: str, args) -> np.ndarray:
    """XLA's own value of a hand-written HLO module."""
    import jax._src.lib as jaxlib
    from jax._src import xla_bridge
    from jax._src.lib import xla_client

    backend = xla_bridge.get_backend("cpu")
    proto = jaxlib.hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto()
    module = xla_client._xla.mlir.hlo_to_stablehlo(proto)
    devices = xla_client._xla.DeviceList(tuple(jax.devices()[:1]))
    executable = backend.compile_and_load(module, devices, xla_client.CompileOptions())
    return np.asarray(
        executable.execute_sharded([jax.device_put(a) for a in args]).disassemble_into_single_device_arrays()[0][0]
    )


HAND_WRITTEN = """
HloModule conditionals

twice {
  p = f32[4,6] parameter(0)
  ROOT m = f32[4,6] add(p, p)
}

negated {
  p = f32[4,6] parameter(0)
  ROOT n = f32[4,6] negate(p)
}

squared {
  p = f32[4,6] parameter(0)
  ROOT s = f32[4,6] multiply(p, p)
}

ENTRY main {
  x = f32[4,6] parameter(0)
  i = s32[] parameter(1)
  f = pred[] parameter(2)
  c = s32[] constant(INDEX)
  by_index = f32[4,6] conditional(i, x, x, x), branch_computations={twice, negated, squared}
  by_constant = f32[4,6] conditional(c, x, x, x), branch_computations={twice, negated, squared}
  by_flag = f32[4,6] conditional(f, x, x), true_computation=negated, false_computation=squared
  t = pred[] constant(true)
  by_true = f32[4,6] conditional(t, x, x), true_computation=negated, false_computation=squared
  a = f32[4,6] add(by_index, by_constant)
  b = f32[4,6] add(by_flag, by_true)
  ROOT r = f32[4,6] add(a, b)
}
"""


@pytest.mark.parametrize("index", [-1, 0, 1, 2, 3])
def test_an_index_out_of_range_takes_the_last_branch_as_xla_does(index):
    """XLA runs the last branch for an index outside [0, n) (a data index: the select chain's
    default; a constant index: the branch picked), and the predicate form picks the true branch
    first."""
    text = HAND_WRITTEN.replace("INDEX", str(index))
    for flag in (True, False):
        args = (X, np.int32(index), np.bool_(flag))
        (term,), values = _terms(text, args)
        assert "ternary" in {t.op for t in program_order([term])}  # the data index and flag stay selects
        got = evaluate(term, {k: np.asarray(a) for k, a in enumerate(args)}, values)
        np.testing.assert_allclose(got, _run_hlo(text, args), rtol=1e-6)


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    ROWS, D, H = 4, 6, 8


    def inputs():
        f = jnp.float32
        return jax.ShapeDtypeStruct((ROWS, D), f), jax.ShapeDtypeStruct((D, H), f)


    def two_activations(x, w):  # the first half of the columns through gelu, the second through relu
        h = x @ w
        return jnp.concatenate([jax.nn.gelu(h[:, : H // 2]), jax.nn.relu(h[:, H // 2 :])], axis=1)


    def _per_device(index):
        def body(x, w):
            return lax.switch(index(lax.axis_index("tp")), [jax.nn.gelu, jax.nn.relu], x @ w)

        return body


    def _column_parallel(x, w, mesh, index):
        return jax.shard_map(_per_device(index), mesh=mesh, in_specs=(P(), P(None, "tp")),
                             out_specs=P(None, "tp"))(x, w)


    def by_axis_index(x, w, *, mesh):
        return _column_parallel(x, w, mesh, lambda i: i)


    def swapped(x, w, *, mesh):
        return _column_parallel(x, w, mesh, lambda i: 1 - i)


    def off_by_one(x, w, *, mesh):  # device 1's index 2 is clamped onto the last branch: both relu
        return _column_parallel(x, w, mesh, lambda i: i + 1)


    def flag_inputs():
        f = jnp.float32
        return (jax.ShapeDtypeStruct((ROWS, D), f), jax.ShapeDtypeStruct((D, H), f),
                jax.ShapeDtypeStruct((H, D), f), jax.ShapeDtypeStruct((), f))


    def mlp(x, w1, w2, flag):
        return lax.cond(flag > 0, jax.nn.gelu, jnp.tanh, x @ w1) @ w2


    def _mlp_tp(x, w1, w2, flag, mesh, act):
        def body(x, w1, w2, flag):
            return lax.psum(act(flag, x @ w1) @ w2, "tp")

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp"), P()), out_specs=P())(
            x, w1, w2, flag)


    def mlp_tp(x, w1, w2, flag, *, mesh):
        return _mlp_tp(x, w1, w2, flag, mesh, lambda f, h: lax.cond(f > 0, jax.nn.gelu, jnp.tanh, h))


    def mlp_tp_swapped(x, w1, w2, flag, *, mesh):
        return _mlp_tp(x, w1, w2, flag, mesh, lambda f, h: lax.cond(f > 0, jnp.tanh, jax.nn.gelu, h))


    def stack_inputs():
        f = jnp.float32
        return (jax.ShapeDtypeStruct((ROWS, D), f), jax.ShapeDtypeStruct((3, D, H), f),
                jax.ShapeDtypeStruct((3, H, D), f))


    def stack(x, w1, w2):  # odd layers relu, even layers tanh
        @jax.checkpoint
        def layer(h, inp):
            (a, b), i = inp
            return h + lax.switch(i % 2, [jnp.tanh, jax.nn.relu], h @ a) @ b, None

        return lax.scan(layer, x, ((w1, w2), jnp.arange(3)))[0]


    def _stack_tp(x, w1, w2, mesh, shift):
        def body(x, w1, w2):
            @jax.checkpoint
            def layer(h, inp):
                (a, b), i = inp
                return h + lax.psum(lax.switch((i + shift) % 2, [jnp.tanh, jax.nn.relu], h @ a) @ b, "tp"), None

            return lax.scan(layer, x, ((w1, w2), jnp.arange(3)))[0]

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, None, "tp"), P(None, "tp")), out_specs=P())(
            x, w1, w2)


    def stack_tp(x, w1, w2, *, mesh):
        return _stack_tp(x, w1, w2, mesh, 0)


    def stack_tp_shifted(x, w1, w2, *, mesh):
        return _stack_tp(x, w1, w2, mesh, 1)


    def psum_in_a_branch(x, w, *, mesh):  # only device 0 runs the psum: not a program to relate
        def body(x, w):
            h = x @ w
            return lax.cond(lax.axis_index("tp") == 0, lambda v: lax.psum(v, "tp") * 0.5, lambda v: v, h)

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "tp")), out_specs=P(None, "tp"),
                             check_vma=False)(x, w)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: switch, reference: m.py:two_activations, distributed: m.py:by_axis_index, inputs: m.py:inputs, mesh: {tp: 2}}
      - {name: switch-swapped, reference: m.py:two_activations, distributed: m.py:swapped, inputs: m.py:inputs, mesh: {tp: 2}}
      - {name: switch-off-by-one, reference: m.py:two_activations, distributed: m.py:off_by_one, inputs: m.py:inputs, mesh: {tp: 2}}
      - {name: cond-flag, reference: m.py:mlp, distributed: m.py:mlp_tp, inputs: m.py:flag_inputs, mesh: {tp: 2}}
      - {name: cond-flag-swapped, reference: m.py:mlp, distributed: m.py:mlp_tp_swapped, inputs: m.py:flag_inputs, mesh: {tp: 2}}
      - {name: scan-switch, reference: m.py:stack, distributed: m.py:stack_tp, inputs: m.py:stack_inputs, mesh: {tp: 2}}
      - {name: scan-switch-shifted, reference: m.py:stack, distributed: m.py:stack_tp_shifted, inputs: m.py:stack_inputs, mesh: {tp: 2}}
      - {name: psum-in-a-branch, reference: m.py:two_activations, distributed: m.py:psum_in_a_branch, inputs: m.py:inputs, mesh: {tp: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("conditionals"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["switch", "cond-flag", "scan-switch"])
def test_a_branch_chosen_per_device_or_by_a_replicated_flag_verifies(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize(
    "name",
    [
        "switch-swapped",
        pytest.param("switch-off-by-one", marks=pytest.mark.slow),
        pytest.param("cond-flag-swapped", marks=pytest.mark.slow),
        pytest.param("scan-switch-shifted", marks=pytest.mark.slow),
    ],
)
def test_near_miss_branches_swapped_or_index_off_by_one_is_a_mismatch(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)


def test_a_collective_in_a_branch_some_devices_skip_is_unproven_naming_the_conditional(manifest):
    result = _verify(manifest, "psum-in-a-branch")
    assert result.status is Status.UNPROVEN, result.findings
    assert any("conditional" in f.message and "collective" in f.message for f in result.findings), result.findings
