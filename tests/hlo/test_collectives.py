"""Device groups of collectives in XLA's three printed forms, source-target pairs, mesh axis groups."""

from __future__ import annotations

import pytest

from equivci.hlo.collectives import UnsupportedGroups, axis_groups, parse_groups, parse_pairs

# --------------------------------------------------------------------------- explicit lists

def test_explicit_groups():
    assert parse_groups("{{0,1},{2,3}}", 4) == [[0, 1], [2, 3]]


def test_explicit_groups_with_spaces_and_order_kept():
    assert parse_groups("{{0, 2}, {1, 3}}", 4) == [[0, 2], [1, 3]]
    assert parse_groups("{{3,2,1,0}}", 4) == [[3, 2, 1, 0]]


@pytest.mark.parametrize("text", [None, "", "{}", "  {}  "])
def test_empty_groups_mean_all_devices(text):
    assert parse_groups(text, 4) == [[0, 1, 2, 3]]


# --------------------------------------------------------------------------- iota form

def test_iota_plain():
    assert parse_groups("[2,2]<=[4]", 4) == [[0, 1], [2, 3]]
    assert parse_groups("[2,4]<=[8]", 8) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert parse_groups("[1,4]<=[4]", 4) == [[0, 1, 2, 3]]


def test_iota_with_transpose():
    # arange(8).reshape(2,4).T -> rows (0,4), (1,5), (2,6), (3,7)
    assert parse_groups("[4,2]<=[2,4]T(1,0)", 8) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # a 3-D source: groups along the middle axis of a (2,2,2) mesh
    assert parse_groups("[4,2]<=[2,2,2]T(0,2,1)", 8) == [[0, 2], [1, 3], [4, 6], [5, 7]]


# --------------------------------------------------------------------------- mesh-axes form

def test_mesh_one_axis():
    assert parse_groups("mesh['tp'=4] {'tp'}", 4) == [[0, 1, 2, 3]]


def test_mesh_2d_minor_axis():
    assert parse_groups("mesh['axis_0'=2,'axis_1'=4] {'axis_1'}", 8) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_mesh_2d_major_axis():
    assert parse_groups("mesh['axis_0'=2,'axis_1'=4] {'axis_0'}", 8) == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_mesh_multiple_listed_axes():
    assert parse_groups("mesh['x'=2,'y'=2] {'x','y'}", 4) == [[0, 1, 2, 3]]
    # listing non-adjacent axes of a 3-D mesh: the kept axis 'b' indexes the groups,
    # the listed axes vary inside a group in row-major order
    assert parse_groups("mesh['a'=2,'b'=2,'c'=2] {'a','c'}", 8) == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_mesh_with_spaces():
    assert parse_groups("mesh['dp'=2, 'tp'=2] {'tp'}", 4) == [[0, 1], [2, 3]]


def test_mesh_no_listed_axes_is_singletons():
    assert parse_groups("mesh['dp'=2,'tp'=2] {}", 4) == [[0], [1], [2], [3]]


# --------------------------------------------------------------------------- errors

def test_groups_must_cover_every_device():
    with pytest.raises(UnsupportedGroups):
        parse_groups("{{0,1}}", 4)
    with pytest.raises(UnsupportedGroups):
        parse_groups("{{0,1},{1,2}}", 3)


def test_unknown_mesh_axis_is_unsupported():
    with pytest.raises(UnsupportedGroups):
        parse_groups("mesh['x'=4] {'y'}", 4)


def test_sub_axis_is_unsupported():
    with pytest.raises(UnsupportedGroups):
        parse_groups("mesh['x'=4] {'x':(1)2}", 4)


def test_unknown_form_is_unsupported():
    with pytest.raises(UnsupportedGroups):
        parse_groups("replicas(0..3)", 4)


def test_iota_device_count_mismatch():
    with pytest.raises(UnsupportedGroups):
        parse_groups("[2,2]<=[4]", 8)


# --------------------------------------------------------------------------- pairs and axes

def test_source_target_pairs():
    assert parse_pairs("{{0,1},{1,2},{2,3},{3,0}}") == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert parse_pairs("{{0, 1}, {1, 0}}") == [(0, 1), (1, 0)]
    assert parse_pairs("{}") == []


def test_axis_groups_dp_tp():
    groups = axis_groups((("dp", 2), ("tp", 2)))
    assert groups == {"dp": [[0, 2], [1, 3]], "tp": [[0, 1], [2, 3]]}


def test_axis_groups_skip_size_one_axes():
    assert axis_groups((("dp", 1), ("tp", 4))) == {"tp": [[0, 1, 2, 3]]}


def test_axis_groups_agree_with_mesh_form():
    mesh = (("dp", 2), ("tp", 4))
    groups = axis_groups(mesh)
    assert groups["tp"] == parse_groups("mesh['axis_0'=2,'axis_1'=4] {'axis_1'}", 8)
    assert groups["dp"] == parse_groups("mesh['axis_0'=2,'axis_1'=4] {'axis_0'}", 8)
    assert groups["dp"] == parse_groups("[4,2]<=[2,4]T(1,0)", 8)
