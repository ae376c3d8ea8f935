import pytest
from textkit import (
    camel_case,
    center,
    initials,
    kebab_case,
    ordinal,
    pascal_case,
    pluralize,
    slugify,
    snake_case,
    split_words,
    title_case,
    truncate,
    wrap,
)


def test_split_words_on_case_and_punctuation():
    assert split_words("parseHTTPResponse") == ["parse", "HTTP", "Response"]
    assert split_words("snake_case-and kebab") == ["snake", "case", "and", "kebab"]
    assert split_words("version2Update") == ["version", "2", "Update"]
    assert split_words("") == []


@pytest.mark.parametrize(
    ("text", "snake", "kebab"),
    [
        ("HelloWorld", "hello_world", "hello-world"),
        ("XMLHttpRequest", "xml_http_request", "xml-http-request"),
        ("already_snake", "already_snake", "already-snake"),
        ("  many   spaces ", "many_spaces", "many-spaces"),
    ],
)
def test_snake_and_kebab_case(text, snake, kebab):
    assert snake_case(text) == snake
    assert kebab_case(text) == kebab


def test_pascal_and_camel_case():
    assert pascal_case("hello_world") == "HelloWorld"
    assert camel_case("hello_world example") == "helloWorldExample"
    assert camel_case("URL parser") == "urlParser"
    assert camel_case("") == ""


def test_title_case_small_words():
    assert title_case("the lord of the rings") == "The Lord of the Rings"
    assert title_case("what are you looking at") == "What Are You Looking At"
    assert title_case("a tale OF two cities") == "A Tale of Two Cities"


def test_slugify_basic():
    assert slugify("Hello, World!") == "hello-world"
    assert slugify("  Crème brûlée  recipe ") == "creme-brulee-recipe"
    assert slugify("a_b c", separator="_") == "a_b_c"


def test_slugify_max_length_cuts_at_word_boundary():
    assert slugify("the quick brown fox", max_length=9) == "the-quick"
    assert slugify("the quick brown fox", max_length=12) == "the-quick"
    assert slugify("the quick brown fox", max_length=15) == "the-quick-brown"
    assert slugify("supercalifragilistic", max_length=5) == "super"
    assert slugify("short", max_length=10) == "short"


@pytest.mark.parametrize(
    ("text", "width", "expected"),
    [
        ("hello world", 20, "hello world"),
        ("hello world", 11, "hello world"),
        ("hello world", 8, "hello..."),
        ("hello world", 9, "hello..."),
        ("hello", 2, ".."),
        ("hello", 0, ""),
    ],
)
def test_truncate(text, width, expected):
    assert truncate(text, width) == expected


def test_truncate_custom_ellipsis_and_errors():
    assert truncate("abcdefgh", 5, ellipsis="~") == "abcd~"
    with pytest.raises(ValueError):
        truncate("abc", -1)


def test_wrap_greedy_lines():
    text = "the quick brown fox jumps over the lazy dog"
    assert wrap(text, 10) == ["the quick", "brown fox", "jumps over", "the lazy", "dog"]
    assert all(len(line) <= 10 for line in wrap(text, 10))


def test_wrap_exact_width_and_long_words():
    assert wrap("aaa bbb", 7) == ["aaa bbb"]
    assert wrap("abcdefghij", 4) == ["abcd", "efgh", "ij"]
    assert wrap("", 5) == []
    with pytest.raises(ValueError):
        wrap("x", 0)


def test_center():
    assert center("ab", 6) == "  ab  "
    assert center("ab", 5, "*") == "*ab**"
    assert center("abcdef", 3) == "abcdef"
    with pytest.raises(ValueError):
        center("x", 5, "--")


@pytest.mark.parametrize(
    ("number", "expected"),
    [
        (1, "1st"),
        (2, "2nd"),
        (3, "3rd"),
        (4, "4th"),
        (11, "11th"),
        (12, "12th"),
        (13, "13th"),
        (21, "21st"),
        (22, "22nd"),
        (101, "101st"),
        (111, "111th"),
        (0, "0th"),
        (-1, "-1st"),
    ],
)
def test_ordinal(number, expected):
    assert ordinal(number) == expected


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        ("cat", "cats"),
        ("box", "boxes"),
        ("church", "churches"),
        ("city", "cities"),
        ("day", "days"),
        ("knife", "knives"),
        ("leaf", "leaves"),
        ("cliff", "cliffs"),
        ("child", "children"),
        ("Person", "People"),
    ],
)
def test_pluralize(word, expected):
    assert pluralize(word) == expected


def test_pluralize_respects_count():
    assert pluralize("cat", 1) == "cat"
    assert pluralize("cat", 0) == "cats"
    assert pluralize("", 5) == ""


def test_initials():
    assert initials("Ada Lovelace") == "AL"
    assert initials("jean-luc picard") == "JLP"
    assert initials("John Ronald Reuel Tolkien") == "JRT"
    assert initials("John Ronald Reuel Tolkien", max_letters=4) == "JRRT"
    assert initials("  ") == ""
