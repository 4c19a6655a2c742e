"""Instantiation and verification on programs captured from real JAX, and on saved samples.

The saved-sample tests run in-process (no child); the verify_model tests capture in a child
(about a second each) and, for defective programs, run the numeric oracle in another child.
"""

from __future__ import annotations

import textwrap
from fractions import Fraction
from pathlib import Path

import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify

from equivci.capture.types import LeafPlacement
from equivci.hlo.parser import parse_module
from equivci.prove.programs import build_programs
from equivci.prove.saturate import saturate
from equivci.results import Status

DATA = Path(__file__).resolve().parents[1] / "data"

# The placements capture reported for the saved TP MLP sample (mesh {tp: 2}).
TP_INPUTS = (
    LeafPlacement("[0]", (8, 16), "float32", (((0, 8), (0, 16)), ((0, 8), (0, 16)))),
    LeafPlacement("[1]", (16, 16), "float32", (((0, 16), (0, 8)), ((0, 16), (8, 16)))),
    LeafPlacement("[2]", (16, 16), "float32", (((0, 8), (0, 16)), ((8, 16), (0, 16)))),
)
TP_OUTPUTS = (LeafPlacement("", (8, 16), "float32", (((0, 8), (0, 16)), ((0, 8), (0, 16)))),)


def _sample(name: str) -> str:
    return (DATA / name).read_text()


# --------------------------------------------------------------------------- saved samples, in-process

def test_saved_tp_sample_is_proved():
    programs = build_programs(
        parse_module(_sample("tp_mlp_reference.hlo")),
        parse_module(_sample("tp_mlp_distributed.hlo")),
        TP_INPUTS, TP_OUTPUTS, 2,
    )
    assert len(programs.device_outputs) == 2
    assert saturate(programs).all_proved


def test_saved_gspmd_sample_is_proved():
    programs = build_programs(
        parse_module(_sample("tp_mlp_reference.hlo")),
        parse_module(_sample("gspmd_mlp_distributed.hlo")),
        TP_INPUTS, TP_OUTPUTS, 2,
    )
    assert saturate(programs).all_proved


def test_saved_tp_sample_without_all_reduce_is_not_proved():
    text = _sample("tp_mlp_distributed.hlo")
    line = next(t for t in text.splitlines() if "all-reduce(" in t)
    # keep the instruction name and shape, drop the collective: each device returns its partial sum
    broken = text.replace(line, "  ROOT %psum_invariant.6 = f32[8,16]{1,0} copy(%dot_general.5)")
    assert "all-reduce" not in broken
    programs = build_programs(
        parse_module(_sample("tp_mlp_reference.hlo")), parse_module(broken), TP_INPUTS, TP_OUTPUTS, 2
    )
    assert not saturate(programs).all_proved


def test_saved_tp_sample_with_swapped_shards_is_not_proved():
    # device 0 gets w1's second column block and device 1 the first, but w2's rows stay in order
    swapped = (TP_INPUTS[0], LeafPlacement("[1]", (16, 16), "float32", (((0, 16), (8, 16)), ((0, 16), (0, 8)))), TP_INPUTS[2])
    programs = build_programs(
        parse_module(_sample("tp_mlp_reference.hlo")),
        parse_module(_sample("tp_mlp_distributed.hlo")),
        swapped, TP_OUTPUTS, 2,
    )
    assert not saturate(programs).all_proved


def test_all_reduce_becomes_the_same_sum_on_every_device():
    module = parse_module(_sample("tp_mlp_distributed.hlo"))
    programs = build_programs(parse_module(_sample("tp_mlp_reference.hlo")), module, TP_INPUTS, TP_OUTPUTS, 2)
    (event,) = [e for e in programs.distributed_events if e.inst.opcode == "all-reduce"]
    v0, v1 = event.values
    assert v0 is v1  # hash-consed: the same sum over both devices' partial products
    dots = [e for e in programs.distributed_events if e.inst.opcode == "dot"]
    # before the all-reduce the two devices hold different partial products
    assert dots[-1].values[0] is not dots[-1].values[1]
    # the entry parameters are the device slices of the reference inputs
    w1 = programs.params[1]
    assert programs.evaluator.slice_nd(w1, ((0, 16), (8, 16))).shape == (16, 8)


SLICE_REF = """HloModule jit_reference

ENTRY main.1 {
  p.1 = f32[8]{0} parameter(0)
  ROOT n.1 = f32[8]{0} negate(p.1)
}
"""

SLICE_DIST = """HloModule jit_dist, num_partitions=2

ENTRY %main.2_spmd (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0), sharding={replicated}
  %pid = u32[] partition-id()
  %pid.s = s32[] convert(%pid)
  %size = s32[] constant(STRIDE)
  %off = s32[] multiply(%pid.s, %size)
  %ds = f32[4]{0} dynamic-slice(%p, %off), dynamic_slice_sizes={4}
  %neg = f32[4]{0} negate(%ds)
  ROOT %ag = f32[8]{0} all-gather(%neg), channel_id=1, replica_groups=[1,2]<=[2], dimensions={0}, use_global_device_ids=true
}
"""

REPLICATED_8 = (LeafPlacement("[0]", (8,), "float32", (((0, 8),), ((0, 8),))),)
OUT_8 = (LeafPlacement("", (8,), "float32", (((0, 8),), ((0, 8),))),)


def _slice_programs(stride: int):
    return build_programs(
        parse_module(SLICE_REF), parse_module(SLICE_DIST.replace("STRIDE", str(stride))), REPLICATED_8, OUT_8, 2
    )


def test_partition_id_offsets_fold_to_static_slices():
    programs = _slice_programs(4)
    (event,) = [e for e in programs.distributed_events if e.inst.opcode == "dynamic-slice"]
    p = programs.params[0]
    assert event.values[0] is programs.evaluator.slice_nd(p, ((0, 4),))
    assert event.values[1] is programs.evaluator.slice_nd(p, ((4, 8),))
    assert saturate(programs).all_proved


def test_wrong_partition_offset_is_not_proved():
    programs = _slice_programs(2)  # device 1 takes [2:6) instead of [4:8)
    (event,) = [e for e in programs.distributed_events if e.inst.opcode == "dynamic-slice"]
    assert event.values[1] is programs.evaluator.slice_nd(programs.params[0], ((2, 6),))
    assert not saturate(programs).all_proved


# --------------------------------------------------------------------------- verify_model on captured programs

MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P


    def inputs():
        f = jnp.float32
        return (jax.ShapeDtypeStruct((8, 16), f), jax.ShapeDtypeStruct((16, 16), f), jax.ShapeDtypeStruct((16, 16), f))


    def reference(x, w1, w2):
        return jnp.tanh(x @ w1) @ w2


    def tp(x, w1, w2, *, mesh):
        def body(x, w1, w2):
            h = jnp.tanh(x @ w1)
            return jax.lax.psum(h @ w2, "tp")
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P())(x, w1, w2)


    def tp_nopsum(x, w1, w2, *, mesh):
        def body(x, w1, w2):
            h = jnp.tanh(x @ w1)
            return h @ w2  # MARK:nopsum
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P(),
                             check_vma=False)(x, w1, w2)


    def tp_badslice(x, w1, w2, *, mesh):
        def body(x, w1, w2):
            i = jax.lax.axis_index("tp")
            w1l = jax.lax.dynamic_slice_in_dim(w1, i * 4, 8, axis=1)  # MARK:badslice
            h = jnp.tanh(x @ w1l)
            return jax.lax.psum(h @ w2, "tp")
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P("tp", None)), out_specs=P())(x, w1, w2)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: tp, reference: mlp.py:reference, distributed: mlp.py:tp, inputs: mlp.py:inputs, mesh: {tp: 2}}
      - {name: nopsum, reference: mlp.py:reference, distributed: mlp.py:tp_nopsum, inputs: mlp.py:inputs, mesh: {tp: 2}}
      - {name: badslice, reference: mlp.py:reference, distributed: mlp.py:tp_badslice, inputs: mlp.py:inputs, mesh: {tp: 2}}
    """
)


def line_of(mark: str) -> int:
    return model_package.line_of(MODELS, mark)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("verify_models"), "mlp.py", MODELS, MANIFEST)


def test_verify_tp_mlp(manifest):
    result = _verify(manifest, "tp")
    assert result.status is Status.VERIFIED, result.findings
    assert result.findings == ()
    assert result.name == "tp"


def test_verify_missing_psum(manifest):
    result = _verify(manifest, "nopsum")
    assert result.status in (Status.MISMATCH, Status.UNPROVEN)
    assert result.findings
    first = result.findings[0]
    assert (first.path, first.line) == ("mlp.py", line_of("nopsum"))
    assert "psum" in first.message or "all-reduce" in first.message
    assert "partial" in first.message.lower()
    assert "dot" in (first.op or "")  # the op whose value is a partial sum, not the output copy


def test_verify_dynamic_slice_wrong_offset(manifest):
    result = _verify(manifest, "badslice")
    assert result.status in (Status.MISMATCH, Status.UNPROVEN)
    assert result.findings
    first = result.findings[0]
    assert (first.path, first.line) == ("mlp.py", line_of("badslice"))
    assert "slice" in first.message
    assert "dynamic_slice" in (first.op or "") or "dynamic-slice" in (first.op or "")
    assert "[4:12)" in first.message  # device 1's wrong range


def test_dynamic_slice_start_is_clamped_like_xla():
    # device 1 asks for [6:10) of an 8-element array; XLA clamps the start to 4 -> [4:8)
    programs = _slice_programs(6)
    (event,) = [e for e in programs.distributed_events if e.inst.opcode == "dynamic-slice"]
    assert event.values[1] is programs.evaluator.slice_nd(programs.params[0], ((4, 8),))
    assert saturate(programs).all_proved


DYNAMIC_REF = """HloModule jit_reference

ENTRY main.1 {
  w.1 = f32[3,8]{1,0} parameter(0)
  i.1 = s32[] parameter(1)
  zero.1 = s32[] constant(0)
  row.1 = f32[1,8]{1,0} dynamic-slice(w.1, i.1, zero.1), dynamic_slice_sizes={1,8}
  all.1 = f32[3,8]{1,0} dynamic-slice(w.1, i.1, zero.1), dynamic_slice_sizes={3,8}
  put.1 = f32[3,8]{1,0} dynamic-update-slice(w.1, row.1, i.1, zero.1)
  ROOT out.1 = (f32[1,8]{1,0}, f32[3,8]{1,0}, f32[3,8]{1,0}) tuple(row.1, all.1, put.1)
}
"""


def test_a_start_known_only_as_a_term_gives_dynamic_terms():
    leaves = (LeafPlacement("[0]", (3, 8), "float32", (((0, 3), (0, 8)),)),
              LeafPlacement("[1]", (), "int32", ((),)))
    outs = (LeafPlacement("[0]", (1, 8), "float32", (((0, 1), (0, 8)),)),
            LeafPlacement("[1]", (3, 8), "float32", (((0, 3), (0, 8)),)),
            LeafPlacement("[2]", (3, 8), "float32", (((0, 3), (0, 8)),)))
    programs = build_programs(parse_module(DYNAMIC_REF), parse_module(DYNAMIC_REF), leaves, outs, 1)
    row, whole, put = programs.reference_outputs
    w, i = programs.params
    assert (row.op, row.attrs, row.args) == ("dslice", (0, 1), (w, i))
    assert whole is w  # a window as long as the dim: the start clamps to 0
    assert (put.op, put.attrs, put.args) == ("dupdate", (0,), (w, row, i))
    assert saturate(programs).all_proved


def test_a_reshaped_slice_of_a_reshape_is_the_window_it_holds():
    """reshape(reshape(x, (m, b, d))[k]) is the rows x[k*b:(k+1)*b] (a microbatch): the labels of
    x's elements show it; a slice of columns of the regrouped rows holds no window of x."""
    from equivci.hlo.ir import Shape
    from equivci.terms.ir import TermTable
    from equivci.translate.evaluator import Evaluator

    ev = Evaluator(None, TermTable(), 1)
    x = ev.table.make("param", (0,), (), (8, 3), "f32")
    grouped = ev.reshape_term(x, Shape("f32", (4, 2, 3)))
    micro = ev.reshape_term(ev.slice_term(grouped, 0, 1, 2), Shape("f32", (2, 3)))
    assert micro is ev.slice_term(x, 0, 2, 4)
    paired = ev.reshape_term(x, Shape("f32", (4, 6)))
    columns = ev.reshape_term(ev.slice_term(paired, 1, 0, 3), Shape("f32", (2, 2, 3)))  # rows 0, 2, 4, 6
    assert columns.op == "reshape" and columns.args[0].op == "slice"


# -- constant scalar factors pulled out of terms (Builder.factored) ----------------------------
def _scale_setup():
    from equivci.hlo.ir import Shape
    from equivci.terms.ir import TermTable
    from equivci.translate.evaluator import Evaluator

    ev = Evaluator(None, TermTable(), 1)
    x = ev.table.make("param", (0,), (), (4, 6), "f32")
    y = ev.table.make("param", (1,), (), (4, 6), "f32")
    w = ev.table.make("param", (2,), (), (6, 3), "f32")
    c = lambda v, shape=(4, 6): ev.const(np.full(shape, v, np.float32), "f32")  # noqa: E731
    return ev, Shape, x, y, w, c


def _gelu(ev, t, scale, shape=(4, 6)):
    """t times GELU's 0.797 times `scale`, folded into one factor as the builder does."""
    from equivci.hlo.ir import Shape

    c = lambda v: ev.const(np.full(shape, v, np.float32), "f32")  # noqa: E731
    return ev.fold_or("binary", ("multiply",), [ev.scaled(t, Fraction(float(np.float32(scale)))), c(0.7978846)],
                      Shape("f32", shape), None)


def _cases():
    """(plain term, its factored form) for every way a factor is pulled out."""
    ev, Shape, x, y, w, c = _scale_setup()
    s46, s64 = Shape("f32", (4, 6)), Shape("f32", (6, 4))
    half, quarter = ev.scaled(x, Fraction(1, 2)), ev.scaled(y, Fraction(1, 4))
    dot_spec = ("||1|0|2|2|f32,f32",)
    cases = {
        "multiply_const_left": ("binary", ("multiply",), [c(0.25), half], s46),
        "multiply_const_right": ("binary", ("multiply",), [half, c(3.0)], s46),
        "multiply_scaled": ("binary", ("multiply",), [half, quarter], s46),
        "divide_by_const": ("binary", ("divide",), [half, c(4.0)], s46),
        "divide_scaled": ("binary", ("divide",), [half, y], s46),
        "add_same_factor": ("binary", ("add",), [half, ev.scaled(y, Fraction(1, 2))], s46),
        "subtract_same_factor": ("binary", ("subtract",), [half, ev.scaled(y, Fraction(1, 2))], s46),
        "dot": ("dot", dot_spec, [half, ev.scaled(w, Fraction(8))], Shape("f32", (4, 3))),
        "transpose": ("transpose", ("1,0",), [half], s64),
        "reduce_add": ("reduce", ("add", "2:1"), [half], Shape("f32", (4,))),
        "concat": ("concat", (0,), [half, ev.scaled(y, Fraction(1, 2))], Shape("f32", (8, 6))),
        # products that are no float32 number: the odd parts go in, the power of two in front
        "multiply_inexact_const": ("binary", ("multiply",), [_gelu(ev, x, 1 / 8), c(0.044715)], s46),
        "multiply_inexact_scaled": ("binary", ("multiply",), [_gelu(ev, x, 1 / 8), _gelu(ev, y, 3.0)], s46),
        "add_inexact_ratio": ("binary", ("add",), [ev.fold_or("binary", ("multiply",), [x, c(0.15)], s46, None),
                                                   ev.scaled(y, Fraction(1, 8))], s46),
        "dot_inexact": ("dot", dot_spec, [_gelu(ev, x, 1 / 8), _gelu(ev, w, 0.044715, (6, 3))], Shape("f32", (4, 3))),
    }
    out = {}
    for name, (kind, attrs, args, shape) in cases.items():
        factored = ev.factored(kind, attrs, args, shape)
        assert factored is not None, name
        out[name] = (ev.mk(kind, attrs, args, shape), factored)
    out["slice"] = (ev.table.make("slice", (1, 2, 5), (half,), (4, 3), "f32"), ev.slice_term(half, 1, 2, 5))
    out["reshape"] = (ev.table.make("reshape", ("2:6>1:",), (half,), (24,), "f32"),
                      ev.reshape_term(half, Shape("f32", (24,))))
    return ev, out


@pytest.mark.parametrize("name", list(_cases()[1]))
def test_pulled_out_factor_is_an_identity(name):
    from equivci.terms.semantics import evaluate

    ev, cases = _cases()
    plain, factored = cases[name]
    assert factored is not plain and ev.scale_of(factored)[0] != 1  # the factor is in front
    rng = np.random.default_rng(0)
    params = {0: rng.standard_normal((4, 6)), 1: rng.standard_normal((4, 6)), 2: rng.standard_normal((6, 3))}
    np.testing.assert_allclose(evaluate(factored, params, ev.values), evaluate(plain, params, ev.values), rtol=1e-6)


def test_factors_are_only_pulled_out_where_that_is_exact_and_linear():
    ev, Shape, x, y, w, c = _scale_setup()
    s46 = Shape("f32", (4, 6))
    tenth = ev.scaled(x, Fraction(0.1))
    assert tenth is None  # 0.1 is not a float32 number
    tenth = ev.fold_or("binary", ("multiply",), [x, c(0.1)], s46, None)
    assert ev.scale_of(tenth)[0] == Fraction(float(np.float32(0.1)))
    # float32(0.1) squared is not a float32 number: x times each significand (in [1, 2)), the power
    # of two that is left in front, near the product's size
    mantissa = Fraction(float(np.float32(0.1))) * 2**4  # float32(0.1) is 1.6000000238 / 2**4
    assert 1 <= mantissa < 2 and mantissa.denominator == 2**23
    squared = ev.factored("binary", ("multiply",), [tenth, c(0.1)], s46)
    assert ev.scale_of(squared)[0] == Fraction(1, 2**8)
    assert ev.scale_of(squared)[1] is ev.scaled(ev.scaled(x, mantissa), mantissa)
    half = ev.scaled(x, Fraction(1, 2))
    # f * a + g * b = f * (a + (g / f) * b) when g / f is a float32 number, else the power of two
    # of f in front and each operand times its factor over it
    quarter_y = ev.scaled(y, Fraction(1, 4))
    inner = ev.mk("binary", ("add",), (x, ev.scaled(y, Fraction(1, 2))), s46)
    assert ev.factored("binary", ("add",), [half, quarter_y], s46) is ev.scaled(inner, Fraction(1, 2))
    inexact = ev.factored("binary", ("add",), [tenth, half], s46)  # 0.5 / float32(0.1) is not exact
    odd = mantissa * 2**23  # float32(0.1) is 13421773 / 2**27
    inner = ev.mk("binary", ("add",), (ev.scaled(x, odd), ev.scaled(x, Fraction(2**26))), s46)
    assert inexact is ev.scaled(inner, Fraction(1, 2**27))
    assert ev.factored("binary", ("add",), [ev.scaled(x, Fraction(3)), ev.scaled(y, Fraction(5))], s46) is None
    assert ev.factored("binary", ("maximum",), [half, ev.scaled(y, Fraction(1, 2))], s46) is None
    assert ev.factored("reduce", ("maximum", "2:1"), [half], Shape("f32", (4,))) is None
    assert ev.factored("binary", ("divide",), [y, half], s46) is None



def test_scalings_by_powers_of_two_at_other_places_leave_one_base():
    """A loss scale of 1/8 on a shard (then 1/4 after the psum) against the reference's 1/32, carried
    through GELU's gradient, whose constants 0.797 and 0.0447 make products no float32 number, and
    added to a term weighted by 0.3 / rows (no exact ratio to the other): both build one base, the
    factors differing by 4 only. Near miss: a scale of 3/32 (an odd factor
    more) builds another base. Each form equals the product as written (float64)."""
    from equivci.terms.semantics import evaluate

    ev, Shape, x, y, w, c = _scale_setup()
    s46 = Shape("f32", (4, 6))

    def chain(scale):
        t = ev.normal("binary", ("multiply",), [_gelu(ev, x, scale), c(0.044715)], s46)
        t = ev.normal("binary", ("multiply",), [t, ev.scaled(y, Fraction(3))], s46)
        # a loss weight folded with the scale (0.3 / rows), added to the GELU term: no exact ratio
        weighted = ev.fold_or("binary", ("multiply",), [y, c(0.3 * scale)], s46, None)
        return ev.normal("binary", ("add",), [t, weighted], s46)

    shard, whole, odd = chain(1 / 8), chain(1 / 32), chain(3 / 32)
    assert ev.scale_of(shard)[1] is ev.scale_of(whole)[1]
    assert ev.scale_of(shard)[0] == 4 * ev.scale_of(whole)[0]
    assert ev.scale_of(odd)[1] is not ev.scale_of(whole)[1]
    params = {0: np.random.default_rng(2).standard_normal((4, 6)), 1: np.random.default_rng(3).standard_normal((4, 6))}
    for scale, term in ((1 / 8, shard), (1 / 32, whole), (3 / 32, odd)):
        gelu_scale = float(np.float32(scale)) * float(np.float32(0.7978846))
        written = params[0] * gelu_scale * float(np.float32(0.044715)) * (3 * params[1])
        written += params[1] * float(np.float32(0.3 * scale))
        np.testing.assert_allclose(evaluate(term, params, ev.values), written, rtol=1e-6)


def test_a_division_by_a_count_has_one_form_however_it_is_written():
    """(f * x) / c is (a * x) / b with b the odd part of f / c's denominator: (0.5 * x) / 3 and x / 6
    meet, so do (0.2 * x) / 6 and (0.1 * x) / 3 (float32's 0.2 is twice its 0.1); each equals the
    division as written over the reals (checked in float64). Near miss: x / 3 and (0.5 * x) / 3
    differ."""
    from equivci.terms.semantics import evaluate

    ev, Shape, x, y, w, c = _scale_setup()
    s46 = Shape("f32", (4, 6))
    divide = lambda a, k: ev.normal("binary", ("divide",), [a, c(k)], s46)  # noqa: E731
    tenth, fifth = (ev.fold_or("binary", ("multiply",), [x, c(v)], s46, None) for v in (0.1, 0.2))
    assert divide(ev.scaled(x, Fraction(1, 2)), 3.0) is divide(x, 6.0)
    assert divide(fifth, 6.0) is divide(tenth, 3.0)
    assert divide(x, 3.0) is not divide(ev.scaled(x, Fraction(1, 2)), 3.0)
    params = {0: np.random.default_rng(1).standard_normal((4, 6))}
    for f, k in ((Fraction(1, 2), 3.0), (Fraction(1), 6.0), (Fraction(float(np.float32(0.2))), 6.0)):
        written = ev.mk("binary", ("divide",), (ev.scaled(x, f), c(k)), s46)
        np.testing.assert_allclose(evaluate(divide(ev.scaled(x, f), k), params, ev.values),
                                   evaluate(written, params, ev.values), rtol=1e-6)
    assert divide(x, float(3 << 25)).args[1] is c(3.0)  # a large count: its odd part divides
    assert divide(x, 7.0) is ev.mk("binary", ("divide",), (x, c(7.0)), s46)  # an odd count: as written
    assert divide(ev.scaled(x, Fraction(3)), 6.0) is ev.scaled(x, Fraction(1, 2))  # an exact ratio: a factor

def test_quotients_by_one_count_summed_or_scaled_have_one_form():
    """A quotient by a constant, (a * x) / c, reads as the factor a / c of x (Builder.quotient_scale):
    each device's mean over a count with an odd part (1/24 = (1/8) / 3), psummed, then divided by
    the devices, is the reference's (1/32 * sum) / 3; each form equals the sum as written over the
    reals (checked in float64). Near miss: quotients by different factors added keep each one."""
    from equivci.terms.semantics import evaluate

    ev, Shape, x, y, w, c = _scale_setup()
    s46 = Shape("f32", (4, 6))
    q = lambda a, f: ev.normal("binary", ("divide",), [ev.scaled(a, f), c(3.0)], s46)  # noqa: E731
    add = lambda a, b: ev.normal("binary", ("add",), [a, b], s46)  # noqa: E731
    eighth = Fraction(1, 8)
    summed, quartered = add(q(x, eighth), q(y, eighth)), ev.normal("binary", ("multiply",), [c(0.25), q(x, eighth)], s46)
    assert summed is q(add(x, y), eighth)
    assert ev.normal("binary", ("multiply",), [summed, c(0.25)], s46) is q(add(x, y), Fraction(1, 32))
    assert quartered is q(x, Fraction(1, 32))
    assert ev.normal("binary", ("divide",), [q(x, eighth), c(4.0)], s46) is quartered
    apart = add(q(x, eighth), q(y, Fraction(1, 4)))
    assert apart.op == "binary" and apart.attrs == ("add",)
    params = {0: np.random.default_rng(2).standard_normal((4, 6)), 1: np.random.default_rng(3).standard_normal((4, 6))}
    xs, ys = params[0], params[1]
    for built, want in ((summed, (xs + ys) / 24), (quartered, xs / 96), (apart, xs / 24 + ys / 12)):
        np.testing.assert_allclose(evaluate(built, params, ev.values), want, rtol=1e-6)


def test_elided_constants_are_never_one_term():
    """XLA's dumps print large constants as `constant({...})`: two different tables must not meet."""
    from equivci.terms.ir import TermTable
    from equivci.translate.evaluator import Evaluator

    module = parse_module(textwrap.dedent("""\
        HloModule elided, entry_computation_layout={(f32[64,64]{1,0})->f32[64,64]{1,0}}

        ENTRY %main (x: f32[64,64]) -> f32[64,64] {
          %x = f32[64,64]{1,0} parameter(0)
          %a = f32[64,64]{1,0} constant({...})
          %b = f32[64,64]{1,0} constant({...})
          %xa = f32[64,64]{1,0} add(%x, %a)
          %xb = f32[64,64]{1,0} add(%x, %b)
          ROOT %d = f32[64,64]{1,0} subtract(%xa, %xb)
        }
        """))
    evaluator = Evaluator(module, TermTable(), 1)
    params = [[evaluator.table.make("param", (0,), (), (64, 64), "f32")]]
    (out,) = evaluator.run(module.entry, params)
    elided, todo = set(), [out]
    while todo:
        t = todo.pop()
        if t.op == "const" and str(t.attrs[0]).startswith("elided:"):
            elided.add(t)
        todo.extend(t.args)
    assert len(elided) == 2, elided  # %a and %b: the subtraction does not cancel
