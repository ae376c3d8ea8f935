"""Half-open numeric intervals and immutable sets of disjoint intervals."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

__all__ = ["Interval", "RangeSet", "merge_intervals", "parse_ranges"]


@dataclass(frozen=True, order=True)
class Interval:
    """A half-open interval ``[start, end)`` of numbers."""

    start: float
    end: float

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"interval end {self.end} lies before its start {self.start}")

    @property
    def length(self) -> float:
        """Return the length of the interval, ``end - start``."""
        return self.end - self.start

    def is_empty(self) -> bool:
        """Return True when the interval contains no point at all."""
        return self.start == self.end

    def contains(self, point: float) -> bool:
        """Return True when ``point`` lies in the interval (start inclusive, end exclusive)."""
        return self.start <= point < self.end

    def overlaps(self, other: Interval) -> bool:
        """Return True when the two intervals share at least one point."""
        return self.start < other.end and other.start < self.end

    def touches(self, other: Interval) -> bool:
        """Return True when the two intervals overlap or are directly adjacent."""
        return self.start <= other.end and other.start <= self.end

    def intersection(self, other: Interval) -> Interval | None:
        """Return the common part of two intervals, or None when they share no point."""
        start = max(self.start, other.start)
        end = min(self.end, other.end)
        if start >= end:
            return None
        return Interval(start, end)

    def relation(self, other: Interval) -> str:
        """Classify this interval against ``other``: before, after, equal, inside, contains or overlaps."""
        if self.end <= other.start:
            return "before"
        elif other.end <= self.start:
            return "after"
        elif self == other:
            return "equal"
        elif other.start <= self.start and self.end <= other.end:
            return "inside"
        elif self.start <= other.start and other.end <= self.end:
            return "contains"
        return "overlaps"

    def shift(self, offset: float) -> Interval:
        """Return the interval moved by ``offset``."""
        return Interval(self.start + offset, self.end + offset)

    def split(self, point: float) -> tuple[Interval, Interval]:
        """Split the interval at ``point`` into a left part and a right part."""
        if point < self.start or point > self.end:
            raise ValueError(f"split point {point} lies outside {self}")
        return Interval(self.start, point), Interval(point, self.end)


def merge_intervals(intervals: Iterable[Interval]) -> list[Interval]:
    """Return the intervals sorted and merged so that no two overlap or touch; empty ones are dropped."""
    ordered = sorted(iv for iv in intervals if not iv.is_empty())
    merged: list[Interval] = []
    for iv in ordered:
        if merged and iv.start <= merged[-1].end:
            last = merged[-1]
            merged[-1] = Interval(last.start, max(last.end, iv.end))
        else:
            merged.append(iv)
    return merged


def parse_ranges(text: str) -> RangeSet:
    """Parse integer ranges such as ``"1-3, 7, 10-12"`` (inclusive bounds) into a RangeSet."""
    pieces: list[Interval] = []
    for chunk in text.split(","):
        chunk = chunk.strip()
        if not chunk:
            continue
        lo_text, sep, hi_text = chunk.partition("-")
        if not sep:
            value = int(chunk)
            pieces.append(Interval(value, value + 1))
            continue
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise ValueError(f"range {chunk!r} is reversed")
        pieces.append(Interval(lo, hi + 1))
    return RangeSet(pieces)


class RangeSet:
    """An immutable set of numbers stored as sorted, disjoint half-open intervals."""

    def __init__(self, intervals: Iterable[Interval | tuple[float, float]] = ()) -> None:
        items = [iv if isinstance(iv, Interval) else Interval(iv[0], iv[1]) for iv in intervals]
        self._intervals = merge_intervals(items)
        self._starts = [iv.start for iv in self._intervals]

    @property
    def intervals(self) -> list[Interval]:
        """Return a copy of the disjoint intervals, in increasing order."""
        return list(self._intervals)

    def __len__(self) -> int:
        return len(self._intervals)

    def __iter__(self) -> Iterator[Interval]:
        return iter(self._intervals)

    def __bool__(self) -> bool:
        return bool(self._intervals)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RangeSet):
            return NotImplemented
        return self._intervals == other._intervals

    def __hash__(self) -> int:
        return hash(tuple(self._intervals))

    def __repr__(self) -> str:
        inner = ", ".join(f"[{iv.start}, {iv.end})" for iv in self._intervals)
        return f"RangeSet({inner})"

    def find(self, point: float) -> Interval | None:
        """Return the interval that contains ``point``, or None."""
        index = bisect.bisect_right(self._starts, point) - 1
        if index < 0:
            return None
        candidate = self._intervals[index]
        if candidate.contains(point):
            return candidate
        return None

    def __contains__(self, point: float) -> bool:
        return self.find(point) is not None

    def total_length(self) -> float:
        """Return the summed length of all intervals."""
        total: float = 0
        for iv in self._intervals:
            total += iv.length
        return total

    def bounds(self) -> Interval | None:
        """Return the smallest interval covering the whole set, or None when the set is empty."""
        if not self._intervals:
            return None
        return Interval(self._intervals[0].start, self._intervals[-1].end)

    def add(self, start: float, end: float) -> RangeSet:
        """Return a new set that also covers ``[start, end)``."""
        return RangeSet([*self._intervals, Interval(start, end)])

    def union(self, other: RangeSet) -> RangeSet:
        """Return the set of points covered by either set."""
        return RangeSet([*self._intervals, *other._intervals])

    def intersection(self, other: RangeSet) -> RangeSet:
        """Return the set of points covered by both sets."""
        pieces: list[Interval] = []
        for mine in self._intervals:
            for theirs in other._intervals:
                common = mine.intersection(theirs)
                if common is not None:
                    pieces.append(common)
        return RangeSet(pieces)

    def remove(self, start: float, end: float) -> RangeSet:
        """Return a new set without the points of ``[start, end)``."""
        cut = Interval(start, end)
        pieces: list[Interval] = []
        for iv in self._intervals:
            if not iv.overlaps(cut):
                pieces.append(iv)
                continue
            if iv.start < cut.start:
                pieces.append(Interval(iv.start, cut.start))
            if cut.end < iv.end:
                pieces.append(Interval(cut.end, iv.end))
        return RangeSet(pieces)

    def difference(self, other: RangeSet) -> RangeSet:
        """Return the points of this set that are not in ``other``."""
        result = self
        for iv in other._intervals:
            result = result.remove(iv.start, iv.end)
        return result

    def gaps(self) -> list[Interval]:
        """Return the holes between consecutive intervals, in order."""
        holes: list[Interval] = []
        for left, right in zip(self._intervals, self._intervals[1:], strict=False):
            holes.append(Interval(left.end, right.start))
        return holes

    def complement(self, lo: float, hi: float) -> RangeSet:
        """Return the points of ``[lo, hi)`` that are not in the set."""
        if hi < lo:
            raise ValueError("complement bounds are reversed")
        return RangeSet([Interval(lo, hi)]).difference(self)

    def to_text(self) -> str:
        """Render an integer set in the ``"1-3, 7"`` notation accepted by ``parse_ranges``."""
        parts: list[str] = []
        for iv in self._intervals:
            last = int(iv.end) - 1
            if last == iv.start:
                parts.append(str(int(iv.start)))
            else:
                parts.append(f"{int(iv.start)}-{last}")
        return ", ".join(parts)
