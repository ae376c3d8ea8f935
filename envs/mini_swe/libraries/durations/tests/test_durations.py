import pytest
from durations import (
    DurationError,
    format_clock,
    format_duration,
    format_iso,
    humanize,
    parse_clock,
    parse_duration,
    parse_iso,
    round_to,
    split_units,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90", 90),
        ("1h30m", 5400),
        ("1h 30m", 5400),
        ("2 days, 4 hours", 187200),
        ("1w", 604800),
        ("3 mins and 5 secs", 185),
        ("-5m", -300),
        ("+10s", 10),
        ("1H2M3S", 3723),
        ("- 2 hrs", -7200),
    ],
)
def test_parse_duration(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "   ", "5 parsecs", "1h junk 3m", "h", "10 minutes later"])
def test_parse_duration_rejects_garbage(text):
    with pytest.raises(DurationError):
        parse_duration(text)


def test_parse_clock():
    assert parse_clock("01:30") == 90
    assert parse_clock("1:00:00") == 3600
    assert parse_clock("25:59:59") == 25 * 3600 + 59 * 60 + 59
    assert parse_clock("0:59") == 59


@pytest.mark.parametrize("text", ["1:60", "1:00:60", "12", "1:2:3:4", "a:bc", "-1:00"])
def test_parse_clock_rejects_invalid(text):
    with pytest.raises(DurationError):
        parse_clock(text)


def test_parse_iso():
    assert parse_iso("PT1H30M") == 5400
    assert parse_iso("P1DT2H") == 93600
    assert parse_iso("P2W") == 1209600
    assert parse_iso("pt45s") == 45
    assert parse_iso("P1D") == 86400


@pytest.mark.parametrize("text", ["P", "PT", "P1DT", "1H", "PT1.5H", "P1H"])
def test_parse_iso_rejects_invalid(text):
    with pytest.raises(DurationError):
        parse_iso(text)


def test_split_units():
    assert split_units(93784) == [("d", 1), ("h", 2), ("m", 3), ("s", 4)]
    assert split_units(7200) == [("h", 2)]
    assert split_units(0) == []
    assert split_units(3 * 604800 + 60) == [("w", 3), ("m", 1)]
    assert split_units(90061, units="hs") == [("h", 25), ("s", 61)]
    with pytest.raises(DurationError):
        split_units(-1)


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [(0, "0s"), (5400, "1h30m"), (59, "59s"), (60, "1m"), (-3600, "-1h"), (694861, "1w1d1h1m1s")],
)
def test_format_duration(seconds, expected):
    assert format_duration(seconds) == expected


def test_format_duration_round_trips_through_parse():
    for seconds in (1, 61, 3599, 3601, 86399, 1000000):
        assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.parametrize(
    ("seconds", "max_units", "expected"),
    [
        (0, 2, "0 seconds"),
        (1, 2, "1 second"),
        (5400, 2, "1 hour and 30 minutes"),
        (93784, 2, "1 day and 2 hours"),
        (93784, 3, "1 day, 2 hours and 3 minutes"),
        (120, 1, "2 minutes"),
        (-90, 2, "1 minute and 30 seconds ago"),
    ],
)
def test_humanize(seconds, max_units, expected):
    assert humanize(seconds, max_units) == expected


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [(0, "0:00"), (59, "0:59"), (61, "1:01"), (3600, "1:00:00"), (3723, "1:02:03"), (-75, "-1:15")],
)
def test_format_clock(seconds, expected):
    assert format_clock(seconds) == expected


def test_clock_round_trip():
    for seconds in (0, 59, 600, 3599, 3600, 45296):
        assert parse_clock(format_clock(seconds)) == seconds


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [(0, "PT0S"), (45, "PT45S"), (5400, "PT1H30M"), (86400, "P1D"), (93784, "P1DT2H3M4S")],
)
def test_format_iso(seconds, expected):
    assert format_iso(seconds) == expected


def test_format_iso_round_trip_and_negative():
    for seconds in (1, 3600, 86401, 1209600):
        assert parse_iso(format_iso(seconds)) == seconds
    with pytest.raises(DurationError):
        format_iso(-1)


@pytest.mark.parametrize(
    ("seconds", "unit", "expected"),
    [(89, "m", 60), (90, "m", 120), (29, "m", 0), (5399, "hours", 3600), (5400, "h", 7200), (-31, "m", -60)],
)
def test_round_to(seconds, unit, expected):
    assert round_to(seconds, unit) == expected


def test_round_to_unknown_unit():
    with pytest.raises(DurationError):
        round_to(10, "fortnight")
