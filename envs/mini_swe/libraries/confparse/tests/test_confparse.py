import pytest
from confparse import Config, ConfigError, dump, parse, parse_size, parse_value, split_list, strip_comment

SAMPLE = """
# global settings
name = demo
debug = yes

[server]
host = "0.0.0.0"   ; listen everywhere
port = 8080
timeout: 2.5
tags = [web, "a,b", 3]

[paths]
root = /srv/app
logs = ${paths:root}/logs
"""


def test_strip_comment_variants():
    assert strip_comment("a = 1 # note") == "a = 1 "
    assert strip_comment("a = 1 ; note") == "a = 1 "
    assert strip_comment('a = "x # y"') == 'a = "x # y"'
    assert strip_comment("no comment") == "no comment"


def test_split_list_respects_quotes():
    assert split_list('a, "b,c", d') == ["a", '"b,c"', "d"]
    assert split_list("") == []
    assert split_list("a,") == ["a", ""]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("42", 42),
        ("-7", -7),
        ("0x1f", 31),
        ("2.5", 2.5),
        ("yes", True),
        ("Off", False),
        ("hello world", "hello world"),
        ('"42"', "42"),
        ("'true'", "true"),
        ("", ""),
    ],
)
def test_parse_value_scalars(raw, expected):
    value = parse_value(raw)
    assert value == expected
    assert type(value) is type(expected)


def test_parse_value_lists_and_escapes():
    assert parse_value("[1, two, [3]]") == [1, "two", [3]]
    assert parse_value("[]") == []
    assert parse_value('"a\\tb\\n"') == "a\tb\n"


def test_parse_sections_and_types():
    config = parse(SAMPLE)
    assert config.sections() == ["", "server", "paths"]
    assert config.get("", "name") == "demo"
    assert config.get("", "debug") is True
    assert config.get("server", "host") == "0.0.0.0"
    assert config.get_int("server", "port") == 8080
    assert config.get("server", "timeout") == 2.5


def test_parse_list_value_with_quoted_comma():
    config = parse(SAMPLE)
    assert config.get_list("server", "tags") == ["web", "a,b", 3]


def test_interpolation():
    config = parse(SAMPLE)
    assert config.get("paths", "logs") == "/srv/app/logs"
    assert config.to_dict()["paths"] == {"root": "/srv/app", "logs": "/srv/app/logs"}


def test_nested_interpolation_and_lists():
    config = parse("[a]\nx = 1\ny = ${a:x}${a:x}\nz = [${a:y}, q]\n")
    assert config.get("a", "y") == "11"
    assert config.get("a", "z") == ["11", "q"]


def test_unknown_reference_raises():
    config = parse("[a]\nx = ${b:y}\n")
    with pytest.raises(ConfigError):
        config.get("a", "x")


def test_interpolation_cycle_is_detected():
    config = parse("[a]\nx = ${a:y}\ny = ${a:x}\n")
    with pytest.raises(ConfigError, match="too deep"):
        config.get("a", "x")


def test_get_defaults_and_has():
    config = parse("[a]\nx = 1\n")
    assert config.get("a", "missing", "fallback") == "fallback"
    assert config.get("nope", "x") is None
    assert config.has("a", "x")
    assert not config.has("a", "y")
    assert config.get_int("a", "missing", 9) == 9
    assert config.get_list("a", "missing") == []
    assert config.get_list("a", "x") == [1]


def test_get_int_rejects_non_integers():
    config = parse("[a]\nflag = true\nname = bob\n")
    with pytest.raises(ConfigError):
        config.get_int("a", "flag")
    with pytest.raises(ConfigError):
        config.get_int("a", "name")


def test_continuation_lines_join_values():
    config = parse("[a]\nmsg = hello\n  big\n  world\nnext = 1\n")
    assert config.get("a", "msg") == "hello big world"
    assert config.get("a", "next") == 1


def test_later_keys_override_earlier_ones():
    config = parse("[a]\nx = 1\nx = 2\n")
    assert config.get("a", "x") == 2
    assert config.keys("a") == ["x"]


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("[a\nx = 1\n", 1),
        ("[a]\n[]\n", 2),
        ("[a]\nx = 1\n[a]\n", 3),
        ("[a]\njust words\n", 2),
        ("[a]\n1bad = 2\n", 2),
    ],
    ids=["unterminated-header", "empty-section", "duplicate-section", "missing-separator", "invalid-key"],
)
def test_errors_report_line_numbers(text, line):
    with pytest.raises(ConfigError) as info:
        parse(text)
    assert info.value.line == line
    assert str(info.value).startswith(f"line {line}:")


def test_default_section_name():
    config = parse("x = 1\n[b]\ny = 2\n", default_section="main")
    assert config.sections() == ["main", "b"]
    assert config.get("main", "x") == 1


def test_set_and_add_section():
    config = Config()
    config.add_section("s")
    config.set("s", "k", [1, 2])
    config.set("t", "k", "v")
    assert config.sections() == ["s", "t"]
    with pytest.raises(ConfigError):
        config.add_section("s")


def test_dump_round_trip():
    config = parse(SAMPLE)
    again = parse(dump(config))
    assert again.to_dict() == config.to_dict()
    assert again.sections() == config.sections()


def test_dump_quotes_ambiguous_strings():
    config = Config()
    config.set("s", "a", "42")
    config.set("s", "b", "true")
    config.set("s", "c", " padded ")
    config.set("s", "d", False)
    text = dump(config)
    assert 'a = "42"' in text
    assert 'b = "true"' in text
    assert "d = false" in text
    assert parse(text).get("s", "c") == " padded "


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512", 512),
        ("10KB", 10_000),
        ("10k", 10_000),
        ("1.5M", 1_500_000),
        ("2GiB", 2 * 1024**3),
        ("3 kib", 3072),
        ("1T", 10**12),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


def test_parse_size_errors_and_config_sizes():
    with pytest.raises(ConfigError):
        parse_size("ten MB")
    config = parse("[cache]\nlimit = 64MiB\nplain = 100\nflag = on\n")
    assert config.get_size("cache", "limit") == 64 * 1024**2
    assert config.get_size("cache", "plain") == 100
    assert config.get_size("cache", "missing", 7) == 7
    with pytest.raises(ConfigError):
        config.get_size("cache", "flag")
