import pytest
from fractionlib import Frac, continued_fraction, from_continued_fraction, harmonic, mediant, parse_frac


def test_normalises_to_lowest_terms():
    f = Frac(6, -8)
    assert (f.num, f.den) == (-3, 4)
    assert Frac(0, 5) == Frac(0, 1)
    assert Frac(0, 5).den == 1


def test_zero_denominator_rejected():
    with pytest.raises(ZeroDivisionError):
        Frac(1, 0)


def test_str_and_repr():
    assert str(Frac(3, 4)) == "3/4"
    assert str(Frac(8, 4)) == "2"
    assert repr(Frac(-1, 2)) == "Frac(-1, 2)"


def test_equality_with_ints_and_hash():
    assert Frac(4, 2) == 2
    assert Frac(1, 3) != Frac(1, 4)
    assert hash(Frac(2, 4)) == hash(Frac(1, 2))
    assert Frac(1, 2) != "1/2"


def test_ordering():
    assert Frac(1, 3) < Frac(1, 2)
    assert Frac(-1, 2) < 0
    assert Frac(1, 2) <= Frac(2, 4)
    assert Frac(3, 2) > 1
    assert Frac(3, 2) >= Frac(3, 2)
    assert not Frac(1, 2) < Frac(1, 2)
    assert sorted([Frac(2, 3), Frac(1, 6), Frac(1, 2)]) == [Frac(1, 6), Frac(1, 2), Frac(2, 3)]


def test_addition_and_subtraction():
    assert Frac(1, 2) + Frac(1, 3) == Frac(5, 6)
    assert Frac(1, 2) - Frac(1, 3) == Frac(1, 6)
    assert 1 + Frac(1, 2) == Frac(3, 2)
    assert 1 - Frac(1, 4) == Frac(3, 4)
    assert -Frac(2, 3) == Frac(-2, 3)


def test_multiplication_and_division():
    assert Frac(2, 3) * Frac(3, 4) == Frac(1, 2)
    assert 3 * Frac(1, 6) == Frac(1, 2)
    assert Frac(1, 2) / Frac(1, 4) == 2
    assert 2 / Frac(4, 3) == Frac(3, 2)
    with pytest.raises(ZeroDivisionError):
        Frac(1, 2) / Frac(0)


def test_mixing_with_unsupported_types_fails():
    with pytest.raises(TypeError):
        Frac(1, 2) + 0.5


def test_powers():
    assert Frac(2, 3) ** 2 == Frac(4, 9)
    assert Frac(2, 3) ** 0 == 1
    assert Frac(2, 3) ** -2 == Frac(9, 4)
    assert Frac(-2, 3) ** -1 == Frac(-3, 2)
    with pytest.raises(ZeroDivisionError):
        Frac(0) ** -1


def test_abs_and_float():
    assert abs(Frac(-3, 4)) == Frac(3, 4)
    assert float(Frac(1, 8)) == 0.125


@pytest.mark.parametrize(
    ("value", "floor", "ceil"),
    [(Frac(7, 2), 3, 4), (Frac(-7, 2), -4, -3), (Frac(4), 4, 4), (Frac(1, 3), 0, 1)],
)
def test_floor_and_ceil(value, floor, ceil):
    assert value.floor() == floor
    assert value.ceil() == ceil


@pytest.mark.parametrize(
    ("value", "expected"),
    [(Frac(5, 2), 2), (Frac(7, 2), 4), (Frac(-5, 2), -2), (Frac(13, 10), 1), (Frac(17, 10), 2)],
)
def test_round_half_even(value, expected):
    assert value.round_half_even() == expected


def test_reciprocal():
    assert Frac(-2, 5).reciprocal() == Frac(-5, 2)
    with pytest.raises(ZeroDivisionError):
        Frac(0).reciprocal()


@pytest.mark.parametrize(
    ("value", "expected"),
    [(Frac(3, 2), "1 1/2"), (Frac(-7, 3), "-2 1/3"), (Frac(2, 5), "2/5"), (Frac(-4), "-4"), (Frac(0), "0")],
)
def test_to_mixed(value, expected):
    assert value.to_mixed() == expected


def test_to_decimal_rounding():
    assert Frac(1, 3).to_decimal() == "0.333"
    assert Frac(2, 3).to_decimal(2) == "0.67"
    assert Frac(-1, 8).to_decimal(2) == "-0.13"
    assert Frac(5, 2).to_decimal(0) == "3"
    assert Frac(-1, 1000).to_decimal(2) == "0.00"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3/4", Frac(3, 4)),
        ("-6/8", Frac(-3, 4)),
        ("5", Frac(5)),
        ("1 1/2", Frac(3, 2)),
        ("-2 1/4", Frac(-9, 4)),
        ("0.125", Frac(1, 8)),
        ("-.5", Frac(-1, 2)),
        (" 7/1 ", Frac(7)),
    ],
)
def test_parse_frac(text, expected):
    assert parse_frac(text) == expected


def test_parse_frac_errors():
    with pytest.raises(ValueError):
        parse_frac("   ")
    with pytest.raises(ValueError):
        parse_frac("a/b")
    with pytest.raises(ZeroDivisionError):
        parse_frac("1/0")


def test_mediant_lies_between():
    a, b = Frac(1, 3), Frac(1, 2)
    m = mediant(a, b)
    assert m == Frac(2, 5)
    assert a < m < b


def test_continued_fraction_round_trip():
    assert continued_fraction(Frac(415, 93)) == [4, 2, 6, 7]
    assert continued_fraction(Frac(-7, 2)) == [-4, 2]
    assert from_continued_fraction([4, 2, 6, 7]) == Frac(415, 93)
    assert from_continued_fraction(continued_fraction(Frac(-7, 2))) == Frac(-7, 2)
    with pytest.raises(ValueError):
        from_continued_fraction([])


def test_harmonic_numbers():
    assert harmonic(0) == 0
    assert harmonic(1) == 1
    assert harmonic(4) == Frac(25, 12)
    with pytest.raises(ValueError):
        harmonic(-1)
