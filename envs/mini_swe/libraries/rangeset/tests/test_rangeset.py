import pytest
from rangeset import Interval, RangeSet, merge_intervals, parse_ranges


def test_interval_rejects_reversed_bounds():
    with pytest.raises(ValueError):
        Interval(5, 2)


def test_interval_length_and_empty():
    assert Interval(2, 7).length == 5
    assert Interval(3, 3).is_empty()
    assert not Interval(3, 4).is_empty()


@pytest.mark.parametrize(
    ("point", "expected"),
    [(0, True), (4.5, True), (5, False), (-1, False)],
)
def test_interval_contains_is_half_open(point, expected):
    assert Interval(0, 5).contains(point) is expected


def test_overlaps_requires_a_shared_point():
    assert Interval(0, 5).overlaps(Interval(4, 9))
    assert not Interval(0, 5).overlaps(Interval(5, 9))
    assert Interval(3, 4).overlaps(Interval(0, 10))


def test_touches_includes_adjacent_intervals():
    assert Interval(0, 5).touches(Interval(5, 9))
    assert not Interval(0, 5).touches(Interval(6, 9))


def test_interval_intersection():
    assert Interval(0, 5).intersection(Interval(3, 9)) == Interval(3, 5)
    assert Interval(0, 5).intersection(Interval(5, 9)) is None
    assert Interval(2, 3).intersection(Interval(0, 10)) == Interval(2, 3)


@pytest.mark.parametrize(
    ("left", "right", "expected"),
    [
        ((0, 2), (2, 5), "before"),
        ((6, 8), (2, 5), "after"),
        ((2, 5), (2, 5), "equal"),
        ((3, 4), (2, 5), "inside"),
        ((2, 4), (2, 5), "inside"),
        ((1, 6), (2, 5), "contains"),
        ((1, 3), (2, 5), "overlaps"),
        ((4, 9), (2, 5), "overlaps"),
    ],
)
def test_relation(left, right, expected):
    assert Interval(*left).relation(Interval(*right)) == expected


def test_shift_moves_both_ends():
    assert Interval(1, 4).shift(10) == Interval(11, 14)
    assert Interval(1, 4).shift(-1) == Interval(0, 3)


def test_split_at_point():
    assert Interval(0, 10).split(4) == (Interval(0, 4), Interval(4, 10))
    assert Interval(0, 10).split(10) == (Interval(0, 10), Interval(10, 10))
    with pytest.raises(ValueError):
        Interval(0, 10).split(11)


def test_merge_overlapping_and_unsorted():
    merged = merge_intervals([Interval(5, 8), Interval(1, 3), Interval(2, 4)])
    assert merged == [Interval(1, 4), Interval(5, 8)]


def test_merge_joins_adjacent_intervals():
    assert merge_intervals([Interval(0, 2), Interval(2, 5)]) == [Interval(0, 5)]


def test_merge_drops_empty_and_keeps_contained():
    merged = merge_intervals([Interval(3, 3), Interval(0, 10), Interval(2, 4)])
    assert merged == [Interval(0, 10)]


def test_rangeset_accepts_tuples_and_normalises():
    rs = RangeSet([(5, 6), (0, 2), (1, 3)])
    assert rs.intervals == [Interval(0, 3), Interval(5, 6)]
    assert len(rs) == 2
    assert RangeSet() == RangeSet([])
    assert not RangeSet()


@pytest.mark.parametrize(
    ("point", "expected"),
    [(0, True), (2.5, True), (3, False), (4, False), (5, True), (6, False), (-0.5, False)],
)
def test_membership(point, expected):
    rs = RangeSet([(0, 3), (5, 6)])
    assert (point in rs) is expected


def test_find_returns_containing_interval():
    rs = RangeSet([(0, 3), (5, 6)])
    assert rs.find(5.5) == Interval(5, 6)
    assert rs.find(4) is None


def test_total_length_and_bounds():
    rs = RangeSet([(0, 3), (5, 6), (10, 12)])
    assert rs.total_length() == 6
    assert rs.bounds() == Interval(0, 12)
    assert RangeSet().bounds() is None


def test_add_merges_into_existing():
    rs = RangeSet([(0, 3), (6, 9)]).add(3, 6)
    assert rs.intervals == [Interval(0, 9)]


def test_union_and_intersection():
    a = RangeSet([(0, 5), (10, 15)])
    b = RangeSet([(3, 12)])
    assert a.union(b) == RangeSet([(0, 15)])
    assert a.intersection(b) == RangeSet([(3, 5), (10, 12)])
    assert a.intersection(RangeSet()) == RangeSet()


def test_remove_splits_interval():
    rs = RangeSet([(0, 10)]).remove(3, 5)
    assert rs.intervals == [Interval(0, 3), Interval(5, 10)]


def test_remove_edges_and_outside():
    rs = RangeSet([(0, 10)])
    assert rs.remove(0, 4) == RangeSet([(4, 10)])
    assert rs.remove(8, 20) == RangeSet([(0, 8)])
    assert rs.remove(10, 12) == rs


def test_difference():
    a = RangeSet([(0, 10), (20, 30)])
    b = RangeSet([(5, 25)])
    assert a.difference(b) == RangeSet([(0, 5), (25, 30)])


def test_gaps_between_intervals():
    rs = RangeSet([(0, 2), (4, 5), (9, 10)])
    assert rs.gaps() == [Interval(2, 4), Interval(5, 9)]
    assert RangeSet([(0, 1)]).gaps() == []


def test_complement_within_bounds():
    rs = RangeSet([(2, 4), (6, 8)])
    assert rs.complement(0, 10) == RangeSet([(0, 2), (4, 6), (8, 10)])
    with pytest.raises(ValueError):
        rs.complement(5, 1)


def test_parse_ranges_inclusive_bounds():
    rs = parse_ranges("1-3, 7, 10-12")
    assert rs == RangeSet([(1, 4), (7, 8), (10, 13)])


def test_parse_ranges_merges_and_skips_blanks():
    assert parse_ranges("1-2,, 3-4 ,") == RangeSet([(1, 5)])
    with pytest.raises(ValueError):
        parse_ranges("5-2")


def test_to_text_round_trip():
    text = "1-3, 7, 10-12"
    assert parse_ranges(text).to_text() == text
    assert RangeSet([(4, 5)]).to_text() == "4"


def test_repr_and_hash():
    rs = RangeSet([(0, 1)])
    assert repr(rs) == "RangeSet([0, 1))"
    assert hash(rs) == hash(RangeSet([(0, 1)]))
    assert list(iter(rs)) == [Interval(0, 1)]
