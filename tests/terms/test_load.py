"""The loader builds its egglog commands itself (equivci/terms/egg.py): every term it loads is, in
the e-graph, the term egglog-python's own constructors build, with its dims, before any rule runs."""

from __future__ import annotations

from egglog import EGraph, String, eq, i64

from equivci.terms import language as L
from equivci.terms.ir import TermTable
from equivci.terms.language import T, TList
from equivci.terms.load import Loader
from equivci.terms.spec import bcast_spec, reshape_spec


def test_every_op_loads_as_egglog_pythons_term_with_its_dims():
    t = TermTable()
    x = t.make("param", (0,), (), (4, 6), "f32")
    y = t.make("param", (1,), (), (4, 6), "f32")
    p = t.make("binary", ("compare.LT",), (x, y), (4, 6), "pred")
    row = t.make("param", (2,), (), (6,), "f32")
    spec = bcast_spec(1, (4, 6), (1,))
    dot = "1|0|1|0|2|2|f32,f32"
    flat = reshape_spec((4, 6), (24,))
    aligned = "add|l=0:0,1:1|r=0:0,1:1|f="
    cases = {
        t.make("const", ("c7",), (), (4, 6), "f32"): lambda h: T.const("c7:(4, 6)", "f32"),
        t.make("iota", ("1",), (), (4, 6), "s32"): lambda h: T.iota("1:(4, 6):s32"),
        t.make("slice", (1, 2, 5), (x,), (4, 3), "f32"): lambda h: h(x).slice(1, 2, 5),
        t.make("concat", (0,), (x, y), (8, 6), "f32"): lambda h: T.concat(h(x), h(y), 0),
        t.make("unary", ("exp",), (x,), (4, 6), "f32"): lambda h: T.unary("exp:f32", h(x)),
        p: lambda h: T.binary("compare.LT", h(x), h(y)),
        t.make("ternary", ("select",), (p, x, y), (4, 6), "f32"): lambda h: T.ternary("select", h(p), h(x), h(y)),
        t.make("dot", (dot,), (x, y), (4, 4), "f32"): lambda h: T.dot(f"{dot}>f32", h(x), h(y)),
        t.make("reduce", ("add", "2:1"), (x,), (4,), "f32"): lambda h: T.reduce("add", "2:1", h(x)),
        t.make("bcast", (spec,), (row,), (4, 6), "f32"): lambda h: T.bcast(spec, h(row)),
        t.make("reshape", (flat,), (x,), (24,), "f32"): lambda h: T.reshape(flat, h(x)),
        t.make("transpose", ("1,0",), (x,), (6, 4), "f32"): lambda h: T.transpose("1,0", h(x)),
        t.make("gte", (1,), (x,), (4, 6), "f32"): lambda h: T.gte(1, h(x)),
        t.make("aligned", (aligned,), (x, y), (4, 6), "f32"): lambda h: T.aligned(f"{aligned}>f32", h(x), h(y)),
        t.make("dslice", (0, 2), (x, row), (2, 6), "f32"): lambda h: T.dslice(0, 2, h(x), h(row)),
        t.make("dupdate", (0,), (x, y, row), (4, 6), "f32"): lambda h: T.dupdate(0, h(x), h(y), h(row)),
        t.make("opaque", ("sort",), (x, y), (4, 6), "f32"): lambda h: T.opaque(
            "sort>f32(4, 6)", TList.cons(h(x), TList.cons(h(y), TList.nil()))
        ),
    }
    egraph = EGraph()
    loader = Loader(egraph)
    with loader.bulk():
        for term in cases:
            loader.expr(term)
    egraph.check(eq(loader.expr(x)).to(T.param(0)))
    for term, build in cases.items():
        egraph.check(eq(loader.expr(term)).to(build(loader.expr)))
        for k, size in enumerate(term.shape):
            egraph.check(eq(L.dim(loader.expr(term), i64(k))).to(i64(size)))
    # the static tables the rules read: a dot's contracted dims, a broadcast's operand dim
    egraph.check(eq(L.dot_contract(String(f"{dot}>f32"), i64(1))).to(i64(0)))
    egraph.check(eq(L.bcast_out(String(spec), i64(0))).to(i64(1)))
    egraph.check(L.reduced(String("2:1"), i64(1)))


def test_a_reshape_is_narrowed_only_to_the_specs_that_occur():
    """rs_narrow_out(spec, p, m) names the spec of a narrower split only for splits that are loaded
    (the rules never invent a spec): a device's [1, 2, hd] heads pair with the reference's [2, 4, hd]
    split, and no row stands for the sizes no term has (a split of a vocabulary's 128,256 classes
    would otherwise seed a row per smaller size)."""
    t = TermTable()
    x = t.make("param", (0,), (), (2, 8, 32), "f32")
    y = t.make("param", (1,), (), (2, 8, 8), "f32")
    split, device = reshape_spec((2, 8, 32), (2, 8, 2, 4, 4)), reshape_spec((2, 8, 8), (2, 8, 1, 2, 4))
    egraph = EGraph()
    loader = Loader(egraph)
    with loader.bulk():
        loader.expr(t.make("reshape", (split,), (x,), (2, 8, 2, 4, 4), "f32"))
        loader.expr(t.make("reshape", (device,), (y,), (2, 8, 1, 2, 4), "f32"))
    egraph.check(eq(L.rs_narrow_out(String(split), i64(3), i64(2))).to(String(device)))
    unused = L.rs_narrow_out(String(split), i64(3), i64(3))  # [2, 8, 1, 3, 4]: no term has it
    egraph.check_fail(eq(unused).to(unused))
