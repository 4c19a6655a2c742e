"""Layer splitting, canonical forms and layer-by-layer proofs.

The unit tests build terms by hand (events only need an op name); the model tests capture the
bundled layer stack (examples/models/stack.py) on a fake 4-device mesh and prove it for real.
"""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import model_package
import pytest

from equivci.layers.canonical import canonical_form
from equivci.layers.segments import layer_of, split
from equivci.manifest import load_manifest
from equivci.options import Budgets
from equivci.prove.layered import _windows
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.translate.evaluator import Event
from equivci.verify.engine import verify_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("op_name, layer", [
    ("jit(forward)/layers_3/dot_general", "layers_3"),
    ("layers_0/bhqk,bkhd->bqhd/dot_general", "layers_0"),
    ("lm_head/add", "lm_head"),
    ("jit(f)/Transformer/layers_3/attn/dot_general", "Transformer/layers_3"),
    ("jit(f)/model/layer.12/mlp/add", "model/layer.12"),
    ("jit(step)/transpose(jvp(layers_1))/dot_general", None),
    ("jit(step)/jvp(f)/layers_1/mul", "layers_1"),
    ("jit(silu)/exp", None),
    ("jit(f)/while/body/dot_general", None),
    ("jit(f)/while/body/layers/mlp/add", "layers"),
    ("dot_general", None),
    ("_moe_ep.<locals>.body/reduce", None),
])
def test_layer_of_names_the_scope_down_to_the_numbered_one(op_name, layer):
    assert layer_of(op_name) == layer


@dataclasses.dataclass
class _Inst:
    op_name: str


def _event(scope: str, value) -> Event:
    return Event(_Inst(f"jit(f)/{scope}/op" if scope else "jit(f)/op"), [value])


def _chain(table: TermTable, x, w, depth: int = 1):
    for _ in range(depth):
        x = table.make("binary", ("add",), (x, table.make("unary", ("tanh",), (w,), w.shape, "f32")), x.shape, "f32")
    return x


def test_split_orders_layers_and_keeps_shared_values_global():
    t = TermTable()
    x, w0, w1 = (t.make("param", (k,), (), (4,), "f32") for k in range(3))
    table = t.make("const", ("rope",), (), (4,), "f32")
    shared = t.make("unary", ("cos",), (table,), (4,), "f32")  # rebuilt by both layers: one term
    h1 = t.make("binary", ("add",), (_chain(t, x, w0), shared), (4,), "f32")
    h2 = t.make("binary", ("add",), (_chain(t, h1, w1), shared), (4,), "f32")
    events = [_event("layers_0", shared), _event("layers_0", h1), _event("layers_1", shared), _event("layers_1", h2)]
    layering = split(events, [], [h2], [[h2]], [[h2]])
    assert [s.name for s in layering.segments] == ["layers_0", "layers_1"]
    assert layering.label[shared] is None  # carried along, not read from layers_0
    assert layering.segments[0].reference_outputs == [h1]
    assert layering.segments[1].obligations == [(0, 0)]


def test_a_constant_computed_once_by_the_first_layer_is_global():
    """XLA computes a mask broadcast once, in the first layer that uses it, and the distributed
    program's later layers read it there: it must not become a value passed between layers
    (it has no reference value to be related to), but a definition every layer carries."""
    t = TermTable()
    x, w0, w1 = (t.make("param", (k,), (), (4,), "f32") for k in range(3))
    mask = t.make("bcast", ("n4",), (t.make("const", ("-1e30",), (), (), "f32"),), (4,), "f32")
    h1 = t.make("binary", ("maximum",), (_chain(t, x, w0), mask), (4,), "f32")
    h2 = t.make("binary", ("maximum",), (_chain(t, h1, w1), mask), (4,), "f32")
    events = [_event("layers_0", mask), _event("layers_0", h1), _event("layers_1", h2)]
    layering = split(events, [], [h2], [[h2]], [[h2]])
    assert layering.label[mask] is None
    assert layering.segments[0].reference_outputs == [h1]
    assert layering.segments[0].distributed_outputs == []


def test_an_obligation_belongs_to_the_later_layer_of_its_output_and_its_target():
    """A device output from an earlier layer (or from the inputs alone) than its target is proved
    where the target is: in the layer first seen later, whatever the layers' names."""
    t = TermTable()
    x, w0, w1 = (t.make("param", (k,), (), (4,), "f32") for k in range(3))
    h1 = _chain(t, x, w0)
    h2 = _chain(t, h1, w1)
    early = t.make("unary", ("exp",), (h1,), (4,), "f32")  # a device's output made in the first layer
    events = [_event("z_embed", h1), _event("a_head", h2)]  # names in the other order than the layers
    layering = split(events, [_event("z_embed", early)], [h2], [[early]], [[h2]])
    assert layering is not None and [s.name for s in layering.segments] == ["z_embed", "a_head"]
    assert [s.obligations for s in layering.segments] == [[], [(0, 0)]]
    assert layering.segments[0].distributed_outputs == [early]  # passed on to the layer that proves it
    layering = split(events, [_event("z_embed", early)], [h2], [[early], [x]], [[h2], [h2]])
    assert layering is not None and [s.obligations for s in layering.segments] == [[], [(0, 0), (1, 0)]]


@pytest.mark.parametrize("op_name, layer", [
    ("jit(step)/transpose(jvp(layers_1))/dot_general", "layers_1"),
    ("jit(step)/jvp(layers_1)/bqhd,bkhd->bhqk/dot_general", "layers_1"),
    ("jit(step)/transpose(jvp(Model))/layers_2/mul", "Model/layers_2"),
    ("jit(step)/transpose(jvp(lm_head))/mul", "lm_head"),
    ("jit(step)/jvp(jit(_one_hot))/eq", None),
    ("jit(step)/transpose(jvp())/mul", None),
])
def test_a_scope_under_autodiff_is_the_scope_when_splitting_into_passes(op_name, layer):
    """JAX names a differentiated function's first scope inside its wrappers; the reference's
    backward ops of layer 1 are `transpose(jvp(layers_1))`, where the shard_map body says `layers_1`."""
    assert layer_of(op_name, autodiff=True) == layer


def test_layers_that_depend_on_each_other_are_split_into_passes():
    """A backward pass under the forward pass's scopes: layers_0 -> layers_1 -> layers_2, then back.
    The op of layers_1 that reads layers_2 starts a second pass, which runs the layers back (layers_0's
    backward op reading layers_1's stays in it); each pass's ops of a layer are one segment, so the
    segments form a chain. The last layer's backward op reads only its own layer: it stays in the
    first pass (the forward and backward of the loss, paired)."""
    t = TermTable()
    x = t.make("param", (0,), (), (4,), "f32")
    a = t.make("unary", ("tanh",), (x,), (4,), "f32")
    b = t.make("unary", ("exp",), (a,), (4,), "f32")
    c = t.make("unary", ("cos",), (b,), (4,), "f32")
    dc = t.make("unary", ("sin",), (c,), (4,), "f32")  # layers_2's backward op: reads its own forward value
    db = t.make("binary", ("multiply",), (dc, b), (4,), "f32")  # layers_1's backward op
    da = t.make("binary", ("multiply",), (db, a), (4,), "f32")  # layers_0's backward op
    update = t.make("binary", ("subtract",), (x, da), (4,), "f32")  # outside every scope
    scopes = ["layers_0", "layers_1", "layers_2", "layers_2", "layers_1", "layers_0", ""]
    events = [_event(scope, v) for scope, v in zip(scopes, (a, b, c, dc, db, da, update))]
    layering = split(events, [], [update], [[update]], [[update]])
    assert layering is not None
    assert [s.name for s in layering.segments] == [
        "layers_0", "layers_1", "layers_2", "layers_1 (pass 2)", "layers_0 (pass 2)"
    ]
    assert [layering.label[v] for v in (a, b, c, dc, db, da, update)] == [
        "layers_0", "layers_1", "layers_2", "layers_2", "layers_1 (pass 2)", "layers_0 (pass 2)", "layers_0 (pass 2)"
    ]
    assert [s.reference_outputs for s in layering.segments] == [[a], [b], [dc], [db], []]
    assert layering.segments[-1].obligations == [(0, 0)]


def test_split_needs_two_layers():
    t = TermTable()
    x = t.make("param", (0,), (), (4,), "f32")
    a = t.make("unary", ("tanh",), (x,), (4,), "f32")
    assert split([_event("layers_0", a)], [], [a], [[a]], [[a]]) is None


def test_canonical_form_ignores_which_inputs_a_layer_reads_but_not_what_it_computes():
    t = TermTable()
    p = [t.make("param", (k,), (), (4,), "f32") for k in range(6)]
    layer = lambda x, w: _chain(t, x, w, depth=2)  # noqa: E731
    assert canonical_form([layer(p[0], p[1])]).digest == canonical_form([layer(p[2], p[3])]).digest
    # the same input twice is not two different inputs
    assert canonical_form([layer(p[0], p[0])]).digest != canonical_form([layer(p[0], p[1])]).digest
    other = t.make("binary", ("multiply",), (p[4], p[5]), (4,), "f32")
    assert canonical_form([other]).digest != canonical_form([layer(p[4], p[5])]).digest
    # which terms are reference values is part of the problem
    y = layer(p[0], p[1])
    assert canonical_form([y], marked=[y]).digest != canonical_form([y]).digest


def test_relation_candidates_are_the_shard_tiles():
    t = TermTable()
    shard = t.make("param", (0,), (), (2, 16), "f32")
    full = t.make("param", (1,), (), (8, 16), "f32")
    most = Budgets().layer_windows
    assert _windows(shard, full, most) == [((0, 2), (0, 16)), ((2, 4), (0, 16)), ((4, 6), (0, 16)), ((6, 8), (0, 16))]
    assert _windows(t.make("param", (2,), (), (3, 16), "f32"), full, most) == []  # not a tiling
    assert _windows(full, full, most) == []  # same shape: plain equality is checked instead
    assert _windows(shard, full, 3) == []  # more tiles than the budget allows


# ------------------------------------------------------------------------------------ real models
@pytest.fixture(scope="module")
def examples():
    return load_manifest(ROOT / "equivci.yaml"), load_manifest(ROOT / "configs" / "buggy.yaml")


def _verify(manifest, name: str):
    model = next(m for m in manifest.models if m.name == name)
    return verify_model(model, manifest, model_package.capture_named(manifest, name))


def test_identical_layers_are_proved_once(examples):
    result = _verify(examples[0], "stack-tp")
    assert result.status is Status.VERIFIED
    # layers_0..3 and lm_head; layers_1..3 reuse the proof of layers_0
    assert (result.layers.total, result.layers.verified, result.layers.reused) == (5, 5, 3)


@pytest.fixture(scope="module")
def stack_sp(examples):
    return _verify(examples[0], "stack-sp")


def test_sequence_sharded_boundaries_are_inferred(stack_sp):
    assert stack_sp.status is Status.VERIFIED
    assert stack_sp.layers.total == 5 and stack_sp.layers.verified == 5 and stack_sp.layers.reused >= 1


def test_sequence_sharded_layers_after_the_first_reuse_its_proof(stack_sp):
    # The first layer's all-gather of the sharded input folds into the input at translation; the
    # next layers' all-gathers of their entry windows fold the same way when abstracted, so
    # layers_1 and layers_2 reuse layers_0's proof (layers_3 passes the head a gathered value).
    assert stack_sp.layers.reused >= 2


STACK_WITH_ONE_BAD_LAYER = textwrap.dedent("""\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    def s(*shape):
        return jax.ShapeDtypeStruct(shape, jnp.float32)

    def inputs():
        return s(8, 16), [(s(16, 32), s(32, 16)) for _ in range(4)]

    def reference(x, layers):
        for i, (w_in, w_out) in enumerate(layers):
            with jax.named_scope(f"layers_{i}"):
                x = x + jnp.tanh(x @ w_in) @ w_out
        return x

    def distributed(x, layers, *, mesh):
        def body(x, layers):
            for i, (w_in, w_out) in enumerate(layers):
                with jax.named_scope(f"layers_{i}"):
                    partial = jnp.tanh(x @ w_in) @ w_out
                    x = x + (partial if i == 2 else lax.psum(partial, "tp"))  # MARK:bad
            return x
        specs = [(P(None, "tp"), P("tp", None)) for _ in range(4)]
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), specs), out_specs=P(), check_vma=False)(x, layers)
    """)


def test_a_bad_layer_among_good_ones_is_found(tmp_path):
    manifest = model_package.write_package(tmp_path, "stack.py", STACK_WITH_ONE_BAD_LAYER, textwrap.dedent("""\
        version: 1
        models:
          - {name: stack, reference: stack.py:reference, distributed: stack.py:distributed,
             inputs: stack.py:inputs, mesh: {tp: 4}}
        """))
    result = _verify(manifest, "stack")
    assert result.status is Status.MISMATCH
    assert result.layers.total == 4 and result.layers.verified == 2  # layers_0 and layers_1
    first = result.findings[0]
    assert first.layer == "layers_2"
    assert first.line == model_package.line_of(STACK_WITH_ONE_BAD_LAYER, "bad")


def test_layers_come_after_the_layers_they_use_and_otherwise_in_program_order():
    """Layers that do not use each other keep their order of first appearance in the program (not
    their names' order): the report lists them, and their findings, as the program runs them."""
    from equivci.layers.segments import _topological

    depends = {"mlp": set(), "attn": set(), "head": {"mlp", "attn"}, "embed": set()}
    rank = {"embed": 0, "mlp": 1, "attn": 2, "head": 3}
    assert _topological(depends, rank) == ["embed", "mlp", "attn", "head"]
    assert _topological({**depends, "embed": {"head"}}, rank) == ["mlp", "attn", "head", "embed"]
    assert _topological({"a": {"b"}, "b": {"a"}}, {"a": 0, "b": 1}) is None  # a cycle
