"""HLO text parser: hand-written snippets covering the printed forms XLA and JAX produce."""

from __future__ import annotations

from pathlib import Path

import pytest

from equivci.hlo.ir import Shape, SourceLoc
from equivci.hlo.parser import HloParseError, parse_module, parse_shape, split_top

DATA = Path(__file__).resolve().parents[1] / "data"


def _inst(module, name):
    for comp in module.computations.values():
        for inst in comp.instructions:
            if inst.name == name:
                return inst
    raise KeyError(name)


# --------------------------------------------------------------------------- shapes

@pytest.mark.parametrize(
    "text, expected",
    [
        ("f32[8,16]{1,0}", Shape("f32", (8, 16))),
        ("f32[8,16]", Shape("f32", (8, 16))),
        ("bf16[2,3,4]{2,1,0}", Shape("bf16", (2, 3, 4))),
        ("f32[]", Shape("f32", ())),
        ("s32[]", Shape("s32", ())),
        ("pred[4]{0}", Shape("pred", (4,))),
        ("token[]", Shape("token")),
        ("()", Shape("tuple")),
        ("(f32[2]{0}, s32[])", Shape("tuple", (), (Shape("f32", (2,)), Shape("s32", ())))),
        (
            "((f32[2,2]{1,0}, s32[]), pred[])",
            Shape("tuple", (), (Shape("tuple", (), (Shape("f32", (2, 2)), Shape("s32", ()))), Shape("pred", ()))),
        ),
    ],
)
def test_parse_shape(text, expected):
    shape = parse_shape(text)
    assert shape == expected
    assert shape.is_tuple == text.startswith("(")


def test_shape_str_round_trip():
    assert str(parse_shape("(f32[8,16]{1,0}, (s32[], pred[3]))")) == "(f32[8,16], (s32[], pred[3]))"


def test_bad_shape_raises():
    with pytest.raises(HloParseError, match="cannot parse shape 'f32<8>'"):
        parse_shape("f32<8>")


def test_split_top_respects_brackets_and_quotes():
    text = 'a, slice={[0:8], [4:8]}, b=(1, 2), c="x, y", d={{0,1},{2,3}}'
    assert split_top(text) == ["a", "slice={[0:8], [4:8]}", "b=(1, 2)", 'c="x, y"', "d={{0,1},{2,3}}"]


# --------------------------------------------------------------------------- module structure

MODULE = """\
HloModule jit_step, is_scheduled=false, entry_computation_layout={(f32[8,16]{1,0}, f32[16]{0})->(f32[8,16]{1,0}, (f32[], s32[]))}, num_partitions=4

%add.clone (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add = f32[] add(f32[] %x, f32[] %y)
}

region_1.2 {
  a.0 = f32[] parameter(0)
  b.0 = f32[] parameter(1)
  ROOT max.0 = f32[] maximum(a.0, b.0)
}

// a comment line
ENTRY %main.7 (p0: f32[8,16], p1: f32[16]) -> (f32[8,16], (f32[], s32[])) {
  %p1 = f32[16]{0} parameter(1), sharding={devices=[4]<=[4]}
  %p0 = f32[8,16]{1,0} parameter(0), sharding={replicated}
  %bc = f32[8,16]{1,0} broadcast(f32[16]{0} %p1), dimensions={1}
  %sum = f32[8,16]{1,0} add(f32[8,16]{1,0} %p0, f32[8,16]{1,0} %bc)
  %sl = f32[8,4]{1,0} slice(%sum), slice={[0:8], [4:8]}
  %ar = f32[8,16]{1,0} all-reduce(%sum), channel_id=1, replica_groups={{0,1},{2,3}}, use_global_device_ids=true, to_apply=%add.clone
  %zero = f32[] constant(0)
  %ninf = f32[] constant(-inf)
  %vec = s32[2]{0} constant({1, 2})
  %mx = f32[] reduce(%ar, %ninf), dimensions={0,1}, to_apply=region_1.2
  %i = s32[] constant(7)
  %inner = (f32[], s32[]) tuple(%mx, %i)
  ROOT %out = (f32[8,16]{1,0}, (f32[], s32[])) tuple(%ar, %inner)
}
"""


def test_module_header_attrs():
    m = parse_module(MODULE)
    assert m.name == "jit_step"
    assert m.attrs["num_partitions"] == "4"
    assert m.attrs["is_scheduled"] == "false"
    assert m.attrs["entry_computation_layout"] == "{(f32[8,16]{1,0}, f32[16]{0})->(f32[8,16]{1,0}, (f32[], s32[]))}"


def test_computations_with_and_without_percent():
    m = parse_module(MODULE)
    assert set(m.computations) == {"add.clone", "region_1.2", "main.7"}
    assert m.entry_name == "main.7"
    assert m.entry.is_entry
    assert not m.computations["add.clone"].is_entry
    assert not m.computations["region_1.2"].is_entry
    assert [i.name for i in m.computations["region_1.2"].instructions] == ["a.0", "b.0", "max.0"]
    assert m.computations["region_1.2"].root.opcode == "maximum"
    assert m.computations["add.clone"].root.name == "add"


def test_root_and_parameters():
    m = parse_module(MODULE)
    roots = [i.name for i in m.entry.instructions if i.is_root]
    assert roots == ["out"]
    assert m.entry.root.name == "out"
    # parameters() orders by parameter number, not by print order
    assert [p.name for p in m.entry.parameters()] == ["p0", "p1"]
    assert m.entry.parameters()[1].attrs["sharding"] == "{devices=[4]<=[4]}"


def test_operands_printed_with_shapes():
    m = parse_module(MODULE)
    assert _inst(m, "add").operands == ("x", "y")
    assert _inst(m, "sum").operands == ("p0", "bc")
    assert _inst(m, "bc").operands == ("p1",)
    assert _inst(m, "bc").attrs["dimensions"] == "{1}"


def test_tuple_shapes_nested():
    m = parse_module(MODULE)
    out = _inst(m, "out")
    assert out.shape == Shape(
        "tuple", (), (Shape("f32", (8, 16)), Shape("tuple", (), (Shape("f32", ()), Shape("s32", ()))))
    )
    assert out.operands == ("ar", "inner")


def test_attributes_with_nested_braces():
    m = parse_module(MODULE)
    sl = _inst(m, "sl")
    assert sl.attrs["slice"] == "{[0:8], [4:8]}"
    assert sl.shape == Shape("f32", (8, 4))
    ar = _inst(m, "ar")
    assert ar.opcode == "all-reduce"
    assert ar.attrs["replica_groups"] == "{{0,1},{2,3}}"
    assert ar.attrs["to_apply"] == "%add.clone"
    assert ar.attrs["channel_id"] == "1"
    assert _inst(m, "mx").attrs["to_apply"] == "region_1.2"
    assert _inst(m, "mx").operands == ("ar", "ninf")


def test_constants():
    m = parse_module(MODULE)
    assert _inst(m, "zero").attrs["_literal"] == "0"
    assert _inst(m, "zero").operands == ()
    assert _inst(m, "ninf").attrs["_literal"] == "-inf"
    vec = _inst(m, "vec")
    assert vec.attrs["_literal"] == "{1, 2}"
    assert vec.operands == ()
    assert vec.shape == Shape("s32", (2,))


def test_parameter_number():
    m = parse_module(MODULE)
    assert _inst(m, "p1").attrs["_number"] == "1"
    assert _inst(m, "p1").operands == ()


@pytest.mark.parametrize(
    "groups",
    [
        "mesh['tp'=4] {'tp'}",
        "mesh['axis_0'=2,'axis_1'=4] {'axis_1'}",
        "[2,2]<=[4]",
        "[4,2]<=[2,4]T(1,0)",
        "{}",
    ],
)
def test_replica_group_forms_kept_raw(groups):
    text = (
        "HloModule m\n\nadd {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n\n"
        "ENTRY main {\n  p = f32[4]{0} parameter(0)\n"
        f"  ROOT r = f32[4]{{0}} all-reduce(p), channel_id=3, replica_groups={groups}, use_global_device_ids=true, to_apply=add\n}}\n"
    )
    r = parse_module(text).entry.root
    assert r.attrs["replica_groups"] == groups
    assert r.attrs["use_global_device_ids"] == "true"
    assert r.attrs["to_apply"] == "add"
    assert r.operands == ("p",)


def test_metadata_with_quoted_specials_and_inline_source():
    text = """HloModule m

ENTRY main {
  p = f32[4]{0} parameter(0), metadata={op_name="jit(f)/a b, c=d {x}/transpose(jvp(g))" source_file="/home/u/my models/m.py" source_line=42}
  ROOT n = f32[4]{0} negate(p), metadata={op_name="neg" source_file="/src/x.py" source_line=7}, backend_config={"a":[1,2],"b":"x=y, z"}
}
"""
    m = parse_module(text)
    p = _inst(m, "p")
    assert p.op_name == "jit(f)/a b, c=d {x}/transpose(jvp(g))"
    assert p.stack == (SourceLoc("/home/u/my models/m.py", 42),)
    n = m.entry.root
    assert n.op_name == "neg"
    assert n.stack == (SourceLoc("/src/x.py", 7),)
    assert n.attrs["backend_config"] == '{"a":[1,2],"b":"x=y, z"}'


# --------------------------------------------------------------------------- stack-frame tables (JAX >= 0.9)

FRAMES = """\
HloModule jit_f, entry_computation_layout={(f32[4]{0})->f32[4]{0}}

FileNames
1 "/usr/lib/python3.12/runpy.py"
2 "/repo/models/layers.py"
3 "/repo/models/model.py"

FunctionNames
1 "run"
2 "mlp"
3 "forward"
4 "main"

FileLocations
1 {file_name_id=1 function_name_id=1 line=88 end_line=88 column=4 end_column=27}
2 {file_name_id=3 function_name_id=4 line=50 end_line=50 column=11 end_column=20}
3 {file_name_id=3 function_name_id=3 line=30 end_line=30 column=8 end_column=19}
4 {file_name_id=2 function_name_id=2 line=12 end_line=12 column=15 end_column=40}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=1}
3 {file_location_id=3 parent_frame_id=3}
4 {file_location_id=4 parent_frame_id=4}


ENTRY main.3 {
  x.1 = f32[4]{0} parameter(0), metadata={op_name="x"}
  t.1 = f32[4]{0} tanh(x.1), metadata={op_name="jit(f)/tanh" stack_frame_id=4}
  ROOT n.1 = f32[4]{0} negate(t.1), metadata={op_name="jit(f)/neg" stack_frame_id=1}
}
"""


def test_stack_frames_resolve_innermost_first():
    m = parse_module(FRAMES)
    t = _inst(m, "t.1")
    # frame 4 -> parent printed 4 = frame 3 -> parent printed 3 = frame 2 -> parent printed 1 = none
    assert t.stack == (
        SourceLoc("/repo/models/layers.py", 12, "mlp"),
        SourceLoc("/repo/models/model.py", 30, "forward"),
        SourceLoc("/repo/models/model.py", 50, "main"),
    )
    assert t.op_name == "jit(f)/tanh"


def test_stack_frame_without_parent():
    m = parse_module(FRAMES)
    assert m.entry.root.stack == (SourceLoc("/usr/lib/python3.12/runpy.py", 88, "run"),)
    assert _inst(m, "x.1").stack == ()


def test_shared_frames_give_the_same_stacks_in_any_order():
    """Stacks are kept per frame: an instruction whose frame is the parent of one seen before
    gets the same stack as when it comes first; in a cyclic table a stack ends where it closes."""
    head = FRAMES[: FRAMES.index("ENTRY main.3 {") + len("ENTRY main.3 {")]
    body = """
  a.1 = f32[4]{0} parameter(0), metadata={op_name="x"}
  b.1 = f32[4]{0} tanh(a.1), metadata={op_name="f/b" stack_frame_id=%d}
  ROOT c.1 = f32[4]{0} negate(b.1), metadata={op_name="f/c" stack_frame_id=%d}
}
"""
    mlp, forward, main, run = (SourceLoc("/repo/models/layers.py", 12, "mlp"), SourceLoc("/repo/models/model.py", 30, "forward"),
                               SourceLoc("/repo/models/model.py", 50, "main"), SourceLoc("/usr/lib/python3.12/runpy.py", 88, "run"))
    first, second = parse_module(head + body % (4, 3)), parse_module(head + body % (3, 4))
    assert _inst(first, "b.1").stack == _inst(second, "c.1").stack == (mlp, forward, main)
    assert _inst(first, "c.1").stack == _inst(second, "b.1").stack == (forward, main)
    # Frame 3's parent becomes frame 5, whose parent is frame 3 (parent ids are printed one up).
    cyclic = head.replace("3 {file_location_id=3 parent_frame_id=3}", "3 {file_location_id=3 parent_frame_id=6}")
    cyclic = cyclic.replace("4 {file_location_id=4 parent_frame_id=4}\n",
                            "4 {file_location_id=4 parent_frame_id=4}\n5 {file_location_id=1 parent_frame_id=4}\n")
    for frames, expected in (((4, 5), ((mlp, forward, run), (run, forward))), ((5, 4), ((run, forward), (mlp, forward, run)))):
        m = parse_module(cyclic + body % frames)
        assert (_inst(m, "b.1").stack, _inst(m, "c.1").stack) == expected


# --------------------------------------------------------------------------- errors

def test_no_entry_is_an_error():
    text = "HloModule m\n\nf {\n  ROOT p = f32[] parameter(0)\n}\n"
    with pytest.raises(HloParseError, match="no ENTRY computation"):
        parse_module(text)


def test_bad_instruction_names_the_line():
    text = "HloModule m\n\nENTRY main {\n  p = f32[4]{0} parameter(0)\n  this is not hlo\n}\n"
    with pytest.raises(HloParseError, match="this is not hlo"):
        parse_module(text)


def test_bad_shape_in_instruction_names_the_text():
    text = "HloModule m\n\nENTRY main {\n  ROOT p = float32<4> parameter(0)\n}\n"
    with pytest.raises(HloParseError, match="float32<4>"):
        parse_module(text)


def test_unbalanced_brackets():
    text = "HloModule m\n\nENTRY main {\n  p = f32[4]{0} parameter(0)\n  ROOT n = f32[4]{0} negate(p\n}\n"
    with pytest.raises(HloParseError, match="unbalanced"):
        parse_module(text)


def test_index_comments_in_long_tuples():
    text = """HloModule jit_f, entry_computation_layout={(f32[2]{0}, f32[2]{0}, f32[2]{0}, f32[2]{0}, f32[2]{0}, /*index=5*/f32[2]{0})->f32[2]{0}}

ENTRY main.1 {
  a = f32[2]{0} parameter(0)
  ROOT t = (f32[2]{0}, f32[2]{0}, f32[2]{0}, f32[2]{0}, f32[2]{0}, /*index=5*/f32[2]{0}) tuple(a, a, a, a, a, /*index=5*/a)
}
"""
    root = parse_module(text).entry.root
    assert len(root.shape.elements) == 6
    assert root.operands == ("a",) * 6


# --------------------------------------------------------------------------- captured samples

def test_captured_reference_sample():
    m = parse_module((DATA / "tp_mlp_reference.hlo").read_text())
    assert m.name == "jit_reference"
    assert [p.shape for p in m.entry.parameters()] == [Shape("f32", (8, 16)), Shape("f32", (16, 16)), Shape("f32", (16, 16))]
    dots = [i for i in m.entry.instructions if i.opcode == "dot"]
    assert len(dots) == 2
    assert dots[0].stack[0] == SourceLoc("/tmp/tw/mlp.py", 11, "reference")
    # the frame chain goes out through the capture child to runpy
    assert dots[0].stack[-1].file == "<frozen runpy>"
    assert m.entry.root.is_root and m.entry.root.opcode == "dot"


def test_captured_distributed_sample():
    m = parse_module((DATA / "tp_mlp_distributed.hlo").read_text())
    assert m.attrs["num_partitions"] == "2"
    # per-device: local shapes of the shard_map in_specs (P(), P(None,'tp'), P('tp',None))
    assert [str(p.shape) for p in m.entry.parameters()] == ["f32[8,16]", "f32[16,8]", "f32[8,16]"]
    body = next(c for name, c in m.computations.items() if name.startswith("xla.sdy.inlinable_manual_computation_body"))
    call = next(i for i in m.entry.instructions if i.opcode == "call")
    assert call.attrs["to_apply"].lstrip("%") == body.name
    ar = body.root
    assert ar.opcode == "all-reduce"
    assert ar.attrs["replica_groups"] == "mesh['tp'=2] {'tp'}"
    assert ar.attrs["to_apply"].lstrip("%") in m.computations
    dot = next(i for i in body.instructions if i.opcode == "dot")
    assert dot.stack == (SourceLoc("/tmp/tw/mlp.py", 16, "tp.<locals>.body"),)
    # the reducer's add points at the psum line through a parent link (printed id 12 -> frame 11)
    add = m.computations[ar.attrs["to_apply"].lstrip("%")].root
    assert [(s.line, s.function) for s in add.stack] == [(17, "tp.<locals>.body"), (17, "tp.<locals>.body")]


def test_captured_gspmd_sample_has_partitioner_collective():
    m = parse_module((DATA / "gspmd_mlp_distributed.hlo").read_text())
    ars = [i for i in m.entry.instructions if i.opcode == "all-reduce"]
    assert len(ars) == 1
    assert ars[0].attrs["frontend_attributes"] == '{is_spmd_generated="true"}'
    assert ars[0].attrs["replica_groups"] == "mesh['axis_0'=2] {'axis_0'}"
