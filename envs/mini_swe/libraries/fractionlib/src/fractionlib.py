"""Exact rational numbers with parsing, mixed-number formatting and continued fractions."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Union

__all__ = ["Frac", "continued_fraction", "from_continued_fraction", "harmonic", "mediant", "parse_frac"]

Number = Union["Frac", int]


def _gcd(a: int, b: int) -> int:
    return math.gcd(a, b)


class Frac:
    """An exact rational number kept in lowest terms with a positive denominator."""

    __slots__ = ("den", "num")

    def __init__(self, num: int, den: int = 1) -> None:
        if den == 0:
            raise ZeroDivisionError("denominator must not be zero")
        if den < 0:
            num, den = -num, -den
        divisor = _gcd(num, den)
        self.num = num // divisor
        self.den = den // divisor

    @staticmethod
    def _coerce(value: Number) -> Frac:
        if isinstance(value, Frac):
            return value
        if isinstance(value, int):
            return Frac(value)
        raise TypeError(f"cannot use {type(value).__name__} as a fraction")

    def __repr__(self) -> str:
        return f"Frac({self.num}, {self.den})"

    def __str__(self) -> str:
        if self.den == 1:
            return str(self.num)
        return f"{self.num}/{self.den}"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, int):
            other = Frac(other)
        if not isinstance(other, Frac):
            return NotImplemented
        return self.num == other.num and self.den == other.den

    def __hash__(self) -> int:
        return hash((self.num, self.den))

    def __lt__(self, other: Number) -> bool:
        right = Frac._coerce(other)
        return self.num * right.den < right.num * self.den

    def __le__(self, other: Number) -> bool:
        right = Frac._coerce(other)
        return self.num * right.den <= right.num * self.den

    def __gt__(self, other: Number) -> bool:
        return Frac._coerce(other) < self

    def __ge__(self, other: Number) -> bool:
        return Frac._coerce(other) <= self

    def __add__(self, other: Number) -> Frac:
        right = Frac._coerce(other)
        return Frac(self.num * right.den + right.num * self.den, self.den * right.den)

    __radd__ = __add__

    def __neg__(self) -> Frac:
        return Frac(-self.num, self.den)

    def __sub__(self, other: Number) -> Frac:
        right = Frac._coerce(other)
        return Frac(self.num * right.den - right.num * self.den, self.den * right.den)

    def __rsub__(self, other: Number) -> Frac:
        return Frac._coerce(other) - self

    def __mul__(self, other: Number) -> Frac:
        right = Frac._coerce(other)
        return Frac(self.num * right.num, self.den * right.den)

    __rmul__ = __mul__

    def __truediv__(self, other: Number) -> Frac:
        right = Frac._coerce(other)
        if right.num == 0:
            raise ZeroDivisionError("division by a zero fraction")
        return Frac(self.num * right.den, self.den * right.num)

    def __rtruediv__(self, other: Number) -> Frac:
        return Frac._coerce(other) / self

    def __pow__(self, exponent: int) -> Frac:
        if exponent < 0:
            if self.num == 0:
                raise ZeroDivisionError("zero cannot be raised to a negative power")
            return Frac(self.den**-exponent, self.num**-exponent)
        return Frac(self.num**exponent, self.den**exponent)

    def __abs__(self) -> Frac:
        return Frac(abs(self.num), self.den)

    def __float__(self) -> float:
        return self.num / self.den

    def floor(self) -> int:
        """Return the largest integer not greater than the fraction."""
        return self.num // self.den

    def ceil(self) -> int:
        """Return the smallest integer not less than the fraction."""
        return -(-self.num // self.den)

    def round_half_even(self) -> int:
        """Round to the nearest integer; exact halves go to the even neighbour."""
        whole = self.floor()
        rest = self - whole
        doubled = rest.num * 2
        if doubled < rest.den:
            return whole
        if doubled > rest.den:
            return whole + 1
        return whole if whole % 2 == 0 else whole + 1

    def reciprocal(self) -> Frac:
        """Return ``1 / self``."""
        return Frac(self.den, self.num)

    def to_mixed(self) -> str:
        """Format as a mixed number such as ``"-1 1/2"``; whole numbers and proper fractions stay short."""
        sign = "-" if self.num < 0 else ""
        whole, rest = divmod(abs(self.num), self.den)
        if rest == 0:
            return f"{sign}{whole}"
        if whole == 0:
            return f"{sign}{rest}/{self.den}"
        return f"{sign}{whole} {rest}/{self.den}"

    def to_decimal(self, places: int = 3) -> str:
        """Return the value with exactly ``places`` decimals, rounded half away from zero."""
        scale = 10**places
        scaled = abs(self.num) * scale * 2 + self.den
        digits = str(scaled // (2 * self.den)).rjust(places + 1, "0")
        sign = "-" if self.num < 0 and digits.strip("0") else ""
        if places == 0:
            return sign + digits
        return f"{sign}{digits[:-places]}.{digits[-places:]}"


def parse_frac(text: str) -> Frac:
    """Parse ``"3/4"``, ``"-2"``, ``"1 1/2"`` (mixed) or ``"0.125"`` (decimal) into a Frac."""
    cleaned = text.strip()
    if not cleaned:
        raise ValueError("empty fraction")
    negative = cleaned.startswith("-")
    body = cleaned.lstrip("+-").strip()
    if " " in body:
        whole_text, _, frac_text = body.partition(" ")
        value = Frac(int(whole_text)) + parse_frac(frac_text)
    elif "/" in body:
        num_text, _, den_text = body.partition("/")
        value = Frac(int(num_text), int(den_text))
    elif "." in body:
        int_text, _, dec_text = body.partition(".")
        value = Frac(int(int_text or "0") * 10 ** len(dec_text) + int(dec_text or "0"), 10 ** len(dec_text))
    else:
        value = Frac(int(body))
    return -value if negative else value


def mediant(a: Frac, b: Frac) -> Frac:
    """Return the mediant ``(a.num + b.num) / (a.den + b.den)``, which lies between ``a`` and ``b``."""
    return Frac(a.num + b.num, a.den + b.den)


def continued_fraction(value: Frac) -> list[int]:
    """Return the terms of the finite continued fraction of ``value``."""
    terms: list[int] = []
    num, den = value.num, value.den
    for _ in range(64):
        whole = num // den
        terms.append(whole)
        num, den = den, num - whole * den
        if den == 0:
            break
    return terms


def from_continued_fraction(terms: Iterable[int]) -> Frac:
    """Rebuild a fraction from continued-fraction terms."""
    items = list(terms)
    if not items:
        raise ValueError("at least one term is required")
    result = Frac(items[-1])
    for term in reversed(items[:-1]):
        result = term + result.reciprocal()
    return result


def harmonic(n: int) -> Frac:
    """Return the n-th harmonic number ``1 + 1/2 + ... + 1/n`` (zero for n = 0)."""
    if n < 0:
        raise ValueError("n must not be negative")
    total = Frac(0)
    for k in range(1, n + 1):
        total = total + Frac(1, k)
    return total
