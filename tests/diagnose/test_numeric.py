"""Numeric localization's matching: a distributed value matches a reference value when it is one
of its shards (a block of a grid) or, summed over a mesh axis, one; within the dtype's tolerance
measured against the value's own magnitude."""

import functools

import numpy as np

from equivci.diagnose import numeric
from equivci.diagnose.numeric import _partial, _ReferenceIndex
from equivci.hlo.ir import Instruction, Shape
from equivci.translate.evaluator import Event

RNG = np.random.default_rng(0)


def index_of(*values: np.ndarray) -> _ReferenceIndex:
    index = _ReferenceIndex()
    for v in values:
        index.add(v)
    return index


def test_a_shard_matches_and_a_changed_value_does_not():
    ref = RNG.normal(size=(8, 32)).astype(np.float32)
    index = index_of(ref)
    assert index.matches(ref[:, 16:24].copy())
    assert index.matches(ref + np.float32(1e-7))  # rounding
    assert not index.matches(ref[:, 16:24] * 2)
    assert not index.matches(ref[:, 4:12].copy())  # not on the grid of 8-wide shards


def test_a_huge_reference_value_does_not_match_everything():
    # an exp that overflows in the reference must not swallow every value of its shape
    index = index_of(np.full((8, 16), 1e30, np.float32))
    assert not index.matches(RNG.normal(size=(8, 16)).astype(np.float32))


def test_among_several_matches_the_one_nearest_the_last_match_is_taken(monkeypatch):
    """The index compares the values of one shape at once (in chunks): whatever the chunk size, the
    match it settles on is the first a search outwards one value at a time would find, from the
    last match's position: that value, the one before, the one after, two before, ..."""
    shard = RNG.normal(size=(4, 8)).astype(np.float32)
    other = lambda: RNG.normal(size=(4, 16)).astype(np.float32)  # noqa: E731
    holder = lambda: np.concatenate([shard, other()[:, :8]], axis=1)  # noqa: E731 - shard in its first block
    for chunk in (1 << 22, 32, 64):
        monkeypatch.setattr(numeric, "_CHUNK_ELEMENTS", chunk)
        index = _ReferenceIndex()
        for position, value in enumerate([holder(), other(), other(), holder(), other(), holder()]):
            index.add(value, position)
        index.near = 2
        assert index.matches(shard) and index.near == 3  # 2, 1, then 3: not 0 or 5, farther
        index.near = 5
        assert index.matches(shard) and index.near == 5
        index.near = 4
        assert index.matches(shard) and index.near == 3  # 4, then 3 before 5
        index.near = 1
        assert index.matches(shard) and index.near == 0
        assert not index.matches(shard * 2) and index.near == 0  # no match leaves the position


def test_a_partial_sum_matches_through_its_axis():
    ref = RNG.normal(size=(4, 8)).astype(np.float32)
    parts = [RNG.normal(size=(4, 8)).astype(np.float32) for _ in range(3)]
    parts.append(ref - sum(parts))
    index = index_of(ref)
    assert not index.matches(parts[0])
    assert _partial(index, parts, 0, {"tp": [[0, 1, 2, 3]]})
    assert not _partial(index, parts, 0, {"tp": [[0, 1], [2, 3]]})


def test_a_value_with_unit_dims_added_or_dropped_matches():
    """`x[:, None, :]` (a dynamic-update-slice's update) holds x's data, and a reference value
    with a unit dim holds the data of the device's value without it."""
    x = RNG.normal(size=(2, 8)).astype(np.float32)
    assert index_of(x).matches(x[:, None, :].copy())
    assert index_of(x[:, :, None].copy()).matches(x)
    assert not index_of(x).matches(x[:, None, :] + 1)  # near miss: other data, same layout


def test_one_group_of_a_reference_vmapped_over_groups_matches():
    """A reference vmapped over groups computes [G, S, E]; a device holding group g computes its
    [S, E] (and a shard of it): rows of the two leading dims merged."""
    ref = RNG.normal(size=(4, 8, 6)).astype(np.float32)
    index = index_of(ref)
    assert index.matches(ref[2].copy())
    assert index.matches(ref[2, :, :3].copy())
    assert not index.matches(ref[2, 1:5].copy())  # near miss: rows straddling the group's tiles
    assert not index.matches(ref[:, 2].copy())  # near miss: row 2 of every group, not one group


def test_a_value_no_input_reaches_is_not_compared():
    """A device's offset or position table (folded from the device index) has no counterpart the
    reference must hold; a data value computed from it does."""
    from equivci.diagnose.numeric import _Values
    from equivci.terms.ir import TermTable

    table = TermTable()
    x = table.make("param", (0,), (), (4,), "f32")
    offset = table.make("const", ("offset",), (), (4,), "s32")
    shifted = table.make("convert", ("f32",), (offset,), (4,), "f32")
    summed = table.make("add", (), (x, shifted), (4,), "f32")
    values = _Values({0: np.zeros(4, np.float32)}, {offset: np.arange(4, dtype=np.int32)})
    assert not values.reads_input(offset) and not values.reads_input(shifted)
    assert values.reads_input(summed) and values.reads_input(x)


def _event(opcode: str, name: str, term, dtype: str = "f32", operands: tuple[str, ...] = ()) -> Event:
    return Event(Instruction(name, opcode, Shape(dtype, term.shape), operands, {}), [term])


def test_the_frontier_passes_gathered_inputs_and_device_constants_and_stops_at_a_difference():
    """The inputs are reference values (an all-gathered shard of one matches); a value no input
    reaches (a device's position table) and index arithmetic (ids shifted into a shard) are not
    compared; the first data value matching nothing is the frontier."""
    from equivci.capture.types import LeafPlacement
    from equivci.diagnose.numeric import numeric_frontier
    from equivci.terms.ir import TermTable

    table = TermTable()
    x = table.make("param", (0,), (), (4, 8), "f32")
    twice = table.make("binary", ("add",), (x, x), (4, 8), "f32")
    positions = table.make("const", ("positions",), (), (4, 8), "f32")
    thrice = table.make("binary", ("add",), (twice, x), (4, 8), "f32")
    ids = table.make("unary", ("convert",), (thrice,), (4, 8), "s32")
    leaf = LeafPlacement("[0]", (4, 8), "float32", (((0, 4), (0, 8)),))
    found = numeric_frontier(
        [_event("add", "ref", twice)],
        [
            _event("all-gather", "gathered", x),
            _event("add", "table", positions),
            _event("convert", "ids", ids, "s32"),
            _event("add", "wrong", thrice),
        ],
        {positions: np.full((4, 8), 7.0, np.float32)},
        (leaf,),
        {},
        10,
    )
    assert found.event is not None and found.event.inst.name == "wrong", found
    # Before the proof's stop every value is proved related: a value there that numerics cannot
    # match (here one made to differ) is passed over.
    early, stop = _event("add", "early", thrice), _event("add", "stop", twice)
    events = [early, stop, _event("add", "wrong", thrice)]
    args = ({positions: np.full((4, 8), 7.0, np.float32)}, (leaf,), {}, 10)
    assert numeric_frontier([_event("add", "ref", twice)], events, *args).event is early
    found = numeric_frontier([_event("add", "ref", twice)], events, *args, start=stop.inst)
    assert found.event is events[2], found


def test_the_draw_keeps_integer_inputs_in_the_ranges_the_oracle_draws_in():
    from equivci.capture.types import LeafPlacement
    from equivci.diagnose.numeric import draw_inputs

    leaf = LeafPlacement("[0]", (64,), "int32", (((0, 64),),))
    drawn = draw_inputs((leaf,), ranges={0: (3, 17)})[0]
    assert drawn.min() >= 3 and drawn.max() < 17 and len(set(drawn.tolist())) > 4


def test_a_difference_a_matching_value_is_computed_from_is_no_frontier():
    """A value that differs only where a later op masks it out or sums it away (a vocabulary
    shard's rows outside the shard) is passed over once a value computed from it matches; one that
    nothing matching is computed from stays the frontier."""
    from equivci.capture.types import LeafPlacement
    from equivci.diagnose.numeric import numeric_frontier
    from equivci.terms.ir import TermTable

    table = TermTable()
    x = table.make("param", (0,), (), (4, 8), "f32")
    twice = table.make("binary", ("add",), (x, x), (4, 8), "f32")
    garbage = table.make("binary", ("add",), (twice, x), (4, 8), "f32")
    wrong = table.make("binary", ("add",), (garbage, x), (4, 8), "f32")
    leaf = LeafPlacement("[0]", (4, 8), "float32", (((0, 4), (0, 8)),))
    reference = [_event("add", "ref", twice)]
    masked, kept = _event("add", "masked", garbage), _event("add", "kept", twice, operands=("masked",))
    found = numeric_frontier(reference, [masked, kept, _event("add", "wrong", wrong)], {}, (leaf,), {}, 10)
    assert found.event is not None and found.event.inst.name == "wrong", found
    unlinked = _event("add", "kept", twice)  # near miss: the matching value is not computed from it
    found = numeric_frontier(reference, [masked, unlinked, _event("add", "wrong", wrong)], {}, (leaf,), {}, 10)
    assert found.event is masked, found


def test_a_value_that_may_be_a_window_of_a_reference_value_numerics_cannot_evaluate_is_undecided():
    """A reference op without a numpy model (an opaque scatter) leaves its value unknown: a device
    value that could be a block of it is no evidence of a difference; one of another shape is."""
    from equivci.capture.types import LeafPlacement
    from equivci.diagnose.numeric import numeric_frontier
    from equivci.terms.ir import TermTable

    table = TermTable()
    x = table.make("param", (0,), (), (4, 8), "f32")
    opaque = table.make("opaque", ("scatter",), (x,), (4, 8), "f32")
    wrong = table.make("binary", ("add",), (x, x), (4, 8), "f32")
    wide = table.make("concat", (1,), (x, wrong), (4, 16), "f32")
    leaf = LeafPlacement("[0]", (4, 8), "float32", (((0, 4), (0, 8)),))
    reference = [_event("scatter", "ref", opaque)]
    half = table.make("slice", (1, 0, 4), (wrong,), (4, 4), "f32")
    events = [_event("add", "d", wrong), _event("slice", "h", half)]
    assert numeric_frontier(reference, events, {}, (leaf,), {}, 10).event is None
    found = numeric_frontier(reference, [_event("concatenate", "w", wide)], {}, (leaf,), {}, 10)
    assert found.event is not None and found.event.inst.name == "w", found  # near miss: no block of [4, 8]


def test_the_start_matches_when_a_value_computed_from_it_does():
    """The proof's stop is no difference numerics can see when its value, or one computed from it
    (a mask's use summed into a reference value), matches; a mask whose use matches nothing is
    no evidence either way."""
    from equivci.capture.types import LeafPlacement
    from equivci.diagnose.numeric import numeric_frontier
    from equivci.terms.ir import TermTable

    table = TermTable()
    x = table.make("param", (0,), (), (4, 8), "f32")
    twice = table.make("binary", ("add",), (x, x), (4, 8), "f32")
    wrong = table.make("binary", ("add",), (twice, x), (4, 8), "f32")
    mask = table.make("unary", ("convert",), (x,), (4, 8), "s32")
    leaf = LeafPlacement("[0]", (4, 8), "float32", (((0, 4), (0, 8)),))
    reference, stop = [_event("add", "ref", twice)], _event("compare", "mask", mask, "s32")
    used = _event("select", "used", twice, operands=("mask",))
    found = numeric_frontier(reference, [stop, used, _event("add", "w", wrong)], {}, (leaf,), {}, 10, start=stop.inst)
    assert found.start_matches and found.event is not None and found.event.inst.name == "w", found
    unmatched = _event("select", "used", wrong, operands=("mask",))  # near miss: its use differs
    found = numeric_frontier(reference, [stop, unmatched], {}, (leaf,), {}, 10, start=stop.inst)
    assert not found.start_matches and found.event is unmatched, found


def test_a_value_of_equal_elements_that_matches_is_no_evidence():
    """A fully masked shard's maximum (all -1e9) matches the reference's masked scores: that says
    nothing of the stop, which stays unconfirmed; near miss: a value of distinct elements does."""
    from equivci.capture.types import LeafPlacement
    from equivci.diagnose.numeric import numeric_frontier
    from equivci.terms.ir import TermTable

    table = TermTable()
    x = table.make("param", (0,), (), (4, 8), "f32")
    masked = table.make("opaque", ("masked",), (x,), (4, 8), "f32")
    column = table.make("slice", (1, 0, 1), (x,), (4, 1), "f32")
    uniform = table.make("binary", ("subtract",), (column, column), (4, 1), "f32")
    wrong = table.make("binary", ("add",), (x, x), (4, 8), "f32")
    leaf = LeafPlacement("[0]", (4, 8), "float32", (((0, 4), (0, 8)),))
    reference = [_event("select", "ref", masked)]
    for stop, matches in ((_event("subtract", "max", uniform), False), (_event("slice", "max", column), True)):
        events = [stop, _event("add", "w", wrong, operands=("max",))]
        found = numeric_frontier(
            reference, events, {masked: np.zeros((4, 8), np.float32)}, (leaf,), {}, 10, start=stop.inst
        )
        assert found.start_matches == matches and found.event is events[1], (stop, found)


def test_a_value_replicated_over_an_axis_is_no_partial_sum_there():
    """A mean taken where a sum was due (`pmean` for `psum`) holds the same value on every device
    of the axis: its sum over the axis is that value times the axis size, no piece of a sum. Near
    miss: distinct pieces summing to the reference value are a partial sum."""
    ref = RNG.normal(size=(4, 8)).astype(np.float32)
    halves = [ref / 2, ref / 2]
    index = index_of(ref)
    assert not _partial(index, halves, 0, {"model": [[0, 1]]})
    piece = RNG.normal(size=(4, 8)).astype(np.float32)
    assert _partial(index, [piece, ref - piece], 0, {"model": [[0, 1]]})
    # Replicated over one axis, but pieces over another: that axis still sums it.
    parts = [piece / 2, piece / 2, (ref - piece) / 2, (ref - piece) / 2]
    assert _partial(index, [2 * p for p in parts], 0, {"model": [[0, 1], [2, 3]], "data": [[0, 2], [1, 3]]})


def test_a_difference_passed_into_a_called_body_is_absorbed_by_what_the_body_computes():
    """A shard_map body's parameter is no op of the program: the op that reads it names the
    body's parameter, not the call's operand. What it is computed from comes with its terms: a
    flat buffer's shard (matching nothing alone) whose gathered pieces match the reference's
    inputs is no frontier; near miss: a body whose values match nothing keeps it."""
    from equivci.capture.types import LeafPlacement
    from equivci.diagnose.numeric import numeric_frontier
    from equivci.terms.ir import TermTable

    table = TermTable()
    x = table.make("param", (0,), (), (4, 8), "f32")
    twice = table.make("binary", ("add",), (x, x), (4, 8), "f32")
    garbage = table.make("binary", ("add",), (twice, x), (4, 8), "f32")
    wrong = table.make("binary", ("add",), (garbage, x), (4, 8), "f32")
    kept = table.make("binary", ("subtract",), (garbage, x), (4, 8), "f32")  # = twice
    leaf = LeafPlacement("[0]", (4, 8), "float32", (((0, 4), (0, 8)),))
    reference = [_event("add", "ref", twice)]
    shard = _event("add", "shard", garbage)
    body = _event("subtract", "body", kept, operands=("param.1",))  # the body's parameter
    found = numeric_frontier(reference, [shard, body, _event("add", "wrong", wrong)], {}, (leaf,), {}, 10)
    assert found.event is not None and found.event.inst.name == "wrong", found
    lost = _event("add", "body", wrong, operands=("param.1",))  # near miss: its value differs too
    found = numeric_frontier(reference, [shard, lost], {}, (leaf,), {}, 10)
    assert found.event is shard, found


def test_a_partial_sum_over_two_axes_at_once_matches():
    """`psum(h, ("x", "y"))`: each of the 4 devices of a 2x2 mesh holds a piece of a sum over
    both axes. Its sum along one axis alone is no reference value; over the plane it is. Near
    miss: pieces whose sum over the plane is another value match along no set of axes."""
    from equivci.diagnose.numeric import with_axis_sets
    from equivci.hlo.collectives import axis_groups

    ref = RNG.normal(size=(4, 8)).astype(np.float32)
    parts = [RNG.normal(size=(4, 8)).astype(np.float32) for _ in range(3)]
    parts.append(ref - sum(parts))
    index = index_of(ref)
    per_axis = axis_groups((("x", 2), ("y", 2)))
    assert not _partial(index, parts, 0, per_axis)
    planes = with_axis_sets(per_axis)
    assert planes["x,y"] == [[0, 1, 2, 3]]
    assert _partial(index, parts, 0, planes)
    assert not _partial(index, [p * 2 for p in parts], 0, planes)
    cube = with_axis_sets(axis_groups((("a", 2), ("b", 2), ("c", 2))))
    assert cube["a,c"] == [[0, 1, 4, 5], [2, 3, 6, 7]] and cube["a,b,c"] == [list(range(8))]


def test_the_frontier_passes_a_partial_sum_over_two_axes():
    """The frontier is given the groups of each axis; a piece of a sum over the plane of two
    axes is no difference there. Near miss: squares of the blocks summed over the plane are no
    reference value when the reference sums the blocks themselves."""
    from equivci.capture.types import LeafPlacement
    from equivci.diagnose.numeric import numeric_frontier
    from equivci.hlo.collectives import axis_groups
    from equivci.terms.ir import TermTable

    table = TermTable()
    x = table.make("param", (0,), (), (4, 8), "f32")
    blocks = [table.make("slice", (1, 2 * d, 2 * d + 2), (x,), (4, 2), "f32") for d in range(4)]
    squares = [table.make("binary", ("multiply",), (b, b), (4, 2), "f32") for b in blocks]
    total = squares[0]
    for sq in squares[1:]:
        total = table.make("binary", ("add",), (total, sq), (4, 2), "f32")
    leaf = LeafPlacement("[0]", (4, 8), "float32", (((0, 4), (0, 8)),))
    mesh = axis_groups((("x", 2), ("y", 2)))
    piece = Event(Instruction("piece", "multiply", Shape("f32", (4, 2)), (), {}), squares)
    assert numeric_frontier([_event("add", "ref", total)], [piece], {}, (leaf,), mesh, 10).event is None
    plain = functools.reduce(lambda a, b: table.make("binary", ("add",), (a, b), (4, 2), "f32"), blocks)
    found = numeric_frontier([_event("add", "ref", plain)], [piece], {}, (leaf,), mesh, 10)
    assert found.event is piece, found


def test_a_partial_sum_no_all_reduce_follows_is_reported_with_its_use():
    """A softmax denominator summed over the local key block only: a partial sum over the plane
    whose all-reduce never comes, and the op that uses it as the full value differs. Near miss: the
    same partial sum all-reduced (a value matching in full is computed from it) is no such sum,
    even where a later op differs for another reason."""
    from equivci.capture.types import LeafPlacement
    from equivci.diagnose.numeric import numeric_frontier
    from equivci.hlo.collectives import axis_groups
    from equivci.terms.ir import TermTable

    table = TermTable()
    x = table.make("param", (0,), (), (4, 8), "f32")
    blocks = [table.make("slice", (1, 2 * d, 2 * d + 2), (x,), (4, 2), "f32") for d in range(4)]
    squares = [table.make("binary", ("multiply",), (b, b), (4, 2), "f32") for b in blocks]
    total = functools.reduce(lambda a, b: table.make("binary", ("add",), (a, b), (4, 2), "f32"), squares)
    mean = table.make("binary", ("divide",), (blocks[0], total), (4, 2), "f32")
    leaf = LeafPlacement("[0]", (4, 8), "float32", (((0, 4), (0, 8)),))
    mesh = axis_groups((("x", 2), ("y", 2)))
    reference = [_event("add", "total", total), _event("divide", "mean", mean)]
    piece = Event(Instruction("piece", "multiply", Shape("f32", (4, 2)), (), {}), squares)
    local = [table.make("binary", ("divide",), (blocks[0], sq), (4, 2), "f32") for sq in squares]
    use = Event(Instruction("use", "divide", Shape("f32", (4, 2)), ("piece",), {}), local)
    found = numeric_frontier(reference, [piece, use], {}, (leaf,), mesh, 10)
    assert found.event is use and found.partial == (piece, "x,y", use), found
    reduced = Event(Instruction("reduced", "all-reduce", Shape("f32", (4, 2)), ("piece",), {}), [total] * 4)
    other = table.make("binary", ("add",), (mean, blocks[0]), (4, 2), "f32")
    wrong = Event(Instruction("wrong", "add", Shape("f32", (4, 2)), ("reduced",), {}), [other] * 4)
    found = numeric_frontier(reference, [piece, reduced, wrong], {}, (leaf,), mesh, 10)
    assert found.event is wrong and found.partial is None, found


def test_far_apart_rules_out_a_what_if_only_on_a_clear_difference():
    """A what-if of the localization (a ppermute sent another way) is saturated only when one draw
    does not already show its outputs far from their targets: rounding alone is no difference, and
    where the draw cannot tell (an index input, whose valid range it does not know) it says so."""
    from equivci.diagnose.numeric import far_apart
    from equivci.terms.ir import TermTable

    table = TermTable()
    x = table.make("param", (0,), (), (4, 8), "f32")
    y = table.make("param", (1,), (), (4, 8), "f32")
    ids = table.make("param", (2,), (), (4, 8), "s32")
    xy = table.make("binary", ("add",), (x, y), (4, 8), "f32")
    yx = table.make("binary", ("add",), (y, x), (4, 8), "f32")
    tiny = table.make("const", ("tiny",), (), (4, 8), "f32")
    rounded = table.make("binary", ("add",), (xy, tiny), (4, 8), "f32")
    assert not far_apart([(xy, yx)], {})
    assert not far_apart([(xy, rounded)], {tiny: np.full((4, 8), 1e-6, np.float32)})
    assert far_apart([(xy, yx), (xy, x)], {})  # one pair apart is enough
    assert far_apart([(xy, rounded)], {tiny: np.ones((4, 8), np.float32)})
    with_ids = table.make("binary", ("add",), (x, table.make("convert", ("f32",), (ids,), (4, 8), "f32")), (4, 8), "f32")
    assert not far_apart([(with_ids, x)], {})  # near miss: an index input, not drawn


def test_a_difference_not_computed_from_the_start_is_apart():
    """The first differing value says nothing of the proof's stop unless it is computed from it: a
    difference on another path (another output's arithmetic) is apart from a stop numerics cannot
    see (an index), one computed from the stop is not, nor one a value computed from the stop reads
    too (rows the stop's test selects: the test decides which of them stay)."""
    from equivci.capture.types import LeafPlacement
    from equivci.diagnose.numeric import numeric_frontier
    from equivci.terms.ir import TermTable

    table = TermTable()
    x = table.make("param", (0,), (), (4, 8), "f32")
    twice = table.make("binary", ("add",), (x, x), (4, 8), "f32")
    wrong = table.make("binary", ("add",), (twice, x), (4, 8), "f32")
    ids = table.make("unary", ("convert",), (x,), (4, 8), "s32")
    leaf = LeafPlacement("[0]", (4, 8), "float32", (((0, 4), (0, 8)),))
    reference, stop = [_event("add", "ref", twice)], _event("compare", "ids", ids, "s32")
    elsewhere = _event("add", "w", wrong)
    found = numeric_frontier(reference, [stop, elsewhere], {}, (leaf,), {}, 10, start=stop.inst)
    assert found.event is elsewhere and found.apart, found
    downstream = _event("add", "w", wrong, operands=("ids",))  # near miss: computed from the stop
    found = numeric_frontier(reference, [stop, downstream], {}, (leaf,), {}, 10, start=stop.inst)
    assert found.event is downstream and not found.apart, found
    found = numeric_frontier(reference, [stop, elsewhere], {}, (leaf,), {}, 10)  # no stop given: nothing apart
    assert found.event is elsewhere and not found.apart, found
    # The difference meets the stop later (rows selected by the stop's test): the stop may account for it.
    owned = table.make("unary", ("convert",), (ids,), (4, 8), "pred")
    kept = table.make("ternary", ("select",), (owned, wrong, x), (4, 8), "f32")
    selected = _event("select", "sel", kept, operands=("ids", "w"))
    found = numeric_frontier(reference, [stop, elsewhere, selected], {}, (leaf,), {}, 10, start=stop.inst)
    assert found.event is elsewhere and not found.apart, found


def test_a_broadcast_of_a_matching_value_is_no_frontier_the_op_that_uses_it_is():
    """A kernel row cut from an input (a window: it matches), its unit dim dropped (the same
    elements) and broadcast over every position repeats values that are right: the first value
    that matches nothing is the op that combines it. Near miss: a broadcast of a value that
    matches nothing is a difference of its own (it stays the frontier)."""
    from equivci.capture.types import LeafPlacement
    from equivci.diagnose.numeric import numeric_frontier
    from equivci.terms.ir import TermTable
    from equivci.terms.spec import bcast_spec, reshape_spec

    table = TermTable()
    x = table.make("param", (0,), (), (2, 8), "f32")
    z = table.make("param", (1,), (), (4, 8), "f32")
    leaves = (
        LeafPlacement("[0]", (2, 8), "float32", (((0, 2), (0, 8)),)),
        LeafPlacement("[1]", (4, 8), "float32", (((0, 4), (0, 8)),)),
    )
    row = table.make("slice", (0, 0, 1), (x,), (1, 8), "f32")
    flat = table.make("reshape", (reshape_spec((1, 8), (8,)),), (row,), (8,), "f32")
    wide = table.make("bcast", (bcast_spec(1, (4, 8), (1,)),), (flat,), (4, 8), "f32")
    used = table.make("binary", ("add",), (wide, z), (4, 8), "f32")
    reference = [_event("add", "ref", table.make("binary", ("add",), (z, z), (4, 8), "f32"))]
    events = [
        _event("slice", "row", row),
        _event("reshape", "flat", flat, operands=("row",)),
        _event("broadcast", "wide", wide, operands=("flat",)),
        _event("add", "used", used, operands=("wide",)),
    ]
    found = numeric_frontier(reference, events, {}, leaves, {}, 10)
    assert found.event is not None and found.event.inst.name == "used", found
    doubled = table.make("binary", ("add",), (x, x), (2, 8), "f32")  # near miss: matches nothing
    wrong = table.make("bcast", (bcast_spec(2, (4, 2, 8), (1, 2)),), (doubled,), (4, 2, 8), "f32")
    found = numeric_frontier(reference, [_event("broadcast", "wrong", wrong)], {}, leaves, {}, 10)
    assert found.event is not None and found.event.inst.name == "wrong", found
