"""Parse and format durations: ``"1h30m"``, ``"2 days, 4 hours"``, ``"01:30:00"`` and ISO 8601 ``"PT1H30M"``."""

from __future__ import annotations

import re

__all__ = [
    "DurationError",
    "format_clock",
    "format_duration",
    "format_iso",
    "humanize",
    "parse_clock",
    "parse_duration",
    "parse_iso",
    "round_to",
    "split_units",
]

MINUTE = 60
HOUR = 60 * MINUTE
DAY = 24 * HOUR
WEEK = 7 * DAY

UNITS: dict[str, int] = {"w": WEEK, "d": DAY, "h": HOUR, "m": MINUTE, "s": 1}
UNIT_NAMES: dict[str, str] = {"w": "week", "d": "day", "h": "hour", "m": "minute", "s": "second"}
ALIASES: dict[str, str] = {
    "wk": "w", "week": "w", "weeks": "w",
    "day": "d", "days": "d",
    "hr": "h", "hrs": "h", "hour": "h", "hours": "h",
    "min": "m", "mins": "m", "minute": "m", "minutes": "m",
    "sec": "s", "secs": "s", "second": "s", "seconds": "s",
}
_PART = re.compile(r"(\d+)\s*([a-z]+)")
_ISO = re.compile(r"^P(?:(\d+)W)?(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?$")


class DurationError(ValueError):
    """Raised when a duration string cannot be parsed."""


def _unit(name: str) -> str:
    key = name.lower()
    if key in UNITS:
        return key
    elif key in ALIASES:
        return ALIASES[key]
    raise DurationError(f"unknown unit {name!r}")


def parse_duration(text: str) -> int:
    """Parse ``"1h 30m"``, ``"2 days, 4 hours"`` or ``"-5m"`` into whole seconds; a bare number means seconds."""
    cleaned = text.strip().lower()
    if not cleaned:
        raise DurationError("empty duration")
    sign = 1
    if cleaned[0] == "-":
        sign = -1
        cleaned = cleaned[1:].strip()
    elif cleaned[0] == "+":
        cleaned = cleaned[1:].strip()
    if cleaned.isdigit():
        return sign * int(cleaned)
    total = 0
    position = 0
    for match in _PART.finditer(cleaned):
        between = cleaned[position : match.start()]
        if between.strip(" ,") and between.strip(" ,") != "and":
            raise DurationError(f"unexpected text {between.strip()!r} in {text!r}")
        total += int(match.group(1)) * UNITS[_unit(match.group(2))]
        position = match.end()
    if position == 0 or cleaned[position:].strip(" ,"):
        raise DurationError(f"cannot parse duration {text!r}")
    return sign * total


def parse_clock(text: str) -> int:
    """Parse ``"MM:SS"`` or ``"HH:MM:SS"``; minutes and seconds must be below 60."""
    parts = text.strip().split(":")
    if len(parts) < 2 or len(parts) > 3 or not all(p.isdigit() for p in parts):
        raise DurationError(f"invalid clock value {text!r}")
    numbers = [int(p) for p in parts]
    if len(numbers) == 2:
        numbers.insert(0, 0)
    hours, minutes, seconds = numbers
    if minutes >= 60 or seconds >= 60:
        raise DurationError(f"minutes and seconds must be below 60 in {text!r}")
    return hours * HOUR + minutes * MINUTE + seconds


def parse_iso(text: str) -> int:
    """Parse an ISO 8601 duration with weeks, days, hours, minutes and seconds (``"P1DT2H"``)."""
    match = _ISO.match(text.strip().upper())
    if not match or text.strip().upper() in ("P", "PT") or text.strip().upper().endswith("T"):
        raise DurationError(f"invalid ISO 8601 duration {text!r}")
    weeks, days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return weeks * WEEK + days * DAY + hours * HOUR + minutes * MINUTE + seconds


def split_units(seconds: int, units: str = "wdhms") -> list[tuple[str, int]]:
    """Break a non-negative number of seconds into (unit, amount) pairs, largest unit first, zeros skipped."""
    if seconds < 0:
        raise DurationError("split_units needs a non-negative duration")
    parts: list[tuple[str, int]] = []
    remaining = seconds
    for unit in sorted(units, key=lambda u: -UNITS[u]):
        amount, remaining = divmod(remaining, UNITS[unit])
        if amount > 0:
            parts.append((unit, amount))
    return parts


def format_duration(seconds: int) -> str:
    """Format seconds compactly, e.g. ``5400 -> "1h30m"``; zero is ``"0s"`` and negatives get a minus sign."""
    if seconds == 0:
        return "0s"
    sign = "-" if seconds < 0 else ""
    return sign + "".join(f"{amount}{unit}" for unit, amount in split_units(abs(seconds)))


def humanize(seconds: int, max_units: int = 2) -> str:
    """Describe a duration in words using at most ``max_units`` units: ``"1 hour and 30 minutes"``."""
    if seconds < 0:
        return humanize(-seconds, max_units) + " ago"
    parts = split_units(seconds)[:max_units]
    if not parts:
        return "0 seconds"
    words = [f"{amount} {UNIT_NAMES[unit]}" + ("" if amount == 1 else "s") for unit, amount in parts]
    if len(words) == 1:
        return words[0]
    return ", ".join(words[:-1]) + " and " + words[-1]


def format_clock(seconds: int) -> str:
    """Format as ``"H:MM:SS"``, or ``"M:SS"`` below one hour; negatives get a leading minus sign."""
    sign = "-" if seconds < 0 else ""
    hours, rest = divmod(abs(seconds), HOUR)
    minutes, secs = divmod(rest, MINUTE)
    if hours:
        return f"{sign}{hours}:{minutes:02d}:{secs:02d}"
    return f"{sign}{minutes}:{secs:02d}"


def format_iso(seconds: int) -> str:
    """Format a non-negative duration as ISO 8601 using days, hours, minutes and seconds."""
    if seconds < 0:
        raise DurationError("ISO 8601 durations cannot be negative")
    if seconds == 0:
        return "PT0S"
    days, rest = divmod(seconds, DAY)
    hours, rest = divmod(rest, HOUR)
    minutes, secs = divmod(rest, MINUTE)
    date_part = f"{days}D" if days else ""
    time_part = "".join(f"{value}{letter}" for value, letter in ((hours, "H"), (minutes, "M"), (secs, "S")) if value)
    return "P" + date_part + ("T" + time_part if time_part else "")


def round_to(seconds: int, unit: str) -> int:
    """Round seconds to the nearest multiple of ``unit`` (e.g. ``"m"``); halves round up."""
    size = UNITS[_unit(unit)]
    quotient, remainder = divmod(seconds, size)
    if remainder * 2 >= size:
        quotient += 1
    return quotient * size
