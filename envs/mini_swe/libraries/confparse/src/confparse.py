"""A small INI-style configuration parser with typed values and ``${section:key}`` interpolation."""

from __future__ import annotations

import re
from typing import TypeAlias

__all__ = ["Config", "ConfigError", "dump", "parse", "parse_size", "parse_value", "split_list", "strip_comment"]

Value: TypeAlias = "bool | int | float | str | list[Value]"

TRUE_WORDS = frozenset({"true", "yes", "on"})
FALSE_WORDS = frozenset({"false", "no", "off"})
MAX_INTERPOLATION_DEPTH = 5
_REFERENCE = re.compile(r"\$\{([^}:]+):([^}]+)\}")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


class ConfigError(ValueError):
    """Raised for malformed configuration text; ``line`` is 1-based (0 when unknown)."""

    def __init__(self, message: str, line: int = 0) -> None:
        super().__init__(f"line {line}: {message}" if line > 0 else message)
        self.line = line


def strip_comment(line: str) -> str:
    """Remove a ``#`` or ``;`` comment from ``line`` unless the marker sits inside quotes."""
    quote = ""
    for index, char in enumerate(line):
        if quote:
            if char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        elif char in "#;":
            return line[:index]
    return line


def split_list(text: str) -> list[str]:
    """Split ``text`` on commas that are not inside quotes, stripping each item."""
    items: list[str] = []
    current: list[str] = []
    quote = ""
    for char in text:
        if quote:
            if char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        elif char == ",":
            items.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    tail = "".join(current).strip()
    if tail or items:
        items.append(tail)
    return items


def _unescape(text: str) -> str:
    return text.replace("\\n", "\n").replace("\\t", "\t").replace('\\"', '"')


def parse_value(raw: str) -> Value:
    """Convert a raw value to bool, int, float, list or str (quoted text always stays a string)."""
    text = raw.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return _unescape(text[1:-1])
    lowered = text.lower()
    if lowered in TRUE_WORDS:
        return True
    elif lowered in FALSE_WORDS:
        return False
    elif text.startswith("[") and text.endswith("]"):
        return [parse_value(item) for item in split_list(text[1:-1])]
    try:
        return int(text, 0) if lowered.startswith(("0x", "0o", "0b")) else int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def parse_size(text: str) -> int:
    """Parse a byte size such as ``"512"``, ``"10KB"``, ``"1.5M"`` or ``"2GiB"`` (``KiB``/``MiB`` use 1024)."""
    match = _SIZE.match(text)
    if not match:
        raise ConfigError(f"invalid size {text!r}")
    number, prefix, binary = match.groups()
    power = "_kmgt".index(prefix.lower() or "_")
    base = 1024 if binary else 1000
    return int(float(number) * base**power)


class Config:
    """Parsed configuration: an ordered mapping of section name to ordered key/value pairs."""

    def __init__(self) -> None:
        self._sections: dict[str, dict[str, Value]] = {}

    def sections(self) -> list[str]:
        """Return the section names in file order."""
        return list(self._sections)

    def add_section(self, name: str) -> None:
        """Create an empty section; raise ConfigError if it already exists."""
        if name in self._sections:
            raise ConfigError(f"duplicate section {name!r}")
        self._sections[name] = {}

    def set(self, section: str, key: str, value: Value) -> None:
        """Set ``key`` in ``section``, creating the section when needed."""
        self._sections.setdefault(section, {})[key] = value

    def has(self, section: str, key: str) -> bool:
        """Return True when ``section`` defines ``key``."""
        return key in self._sections.get(section, {})

    def keys(self, section: str) -> list[str]:
        """Return the keys of ``section`` in file order (empty for an unknown section)."""
        return list(self._sections.get(section, {}))

    def get(self, section: str, key: str, default: Value | None = None) -> Value | None:
        """Return the interpolated value of ``key`` in ``section``, or ``default`` when it is missing."""
        if not self.has(section, key):
            return default
        return self._interpolate(self._sections[section][key], 0)

    def get_int(self, section: str, key: str, default: int = 0) -> int:
        """Return the value as an int; raise ConfigError when it is not an integer."""
        value = self.get(section, key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{section}.{key} is not an integer: {value!r}")
        return value

    def get_size(self, section: str, key: str, default: int = 0) -> int:
        """Return the value as a byte count (see ``parse_size``), or ``default`` when the key is missing."""
        value = self.get(section, key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ConfigError(f"{section}.{key} is not a size: {value!r}")
        return parse_size(str(value))

    def get_list(self, section: str, key: str) -> list[Value]:
        """Return the value as a list; a scalar becomes a one-element list and a missing key an empty list."""
        value = self.get(section, key)
        if value is None:
            return []
        if isinstance(value, list):
            return value
        return [value]

    def _interpolate(self, value: Value, depth: int) -> Value:
        if isinstance(value, list):
            return [self._interpolate(item, depth) for item in value]
        if not isinstance(value, str) or "${" not in value:
            return value
        if depth >= MAX_INTERPOLATION_DEPTH:
            raise ConfigError(f"interpolation too deep in {value!r}")

        def replace(match: re.Match[str]) -> str:
            section, key = match.group(1).strip(), match.group(2).strip()
            if not self.has(section, key):
                raise ConfigError(f"unknown reference ${{{section}:{key}}}")
            return str(self._interpolate(self._sections[section][key], depth + 1))

        return _REFERENCE.sub(replace, value)

    def to_dict(self) -> dict[str, dict[str, Value | None]]:
        """Return all sections as plain dicts with interpolated values."""
        return {name: {key: self.get(name, key) for key in keys} for name, keys in self._sections.items()}


def parse(text: str, *, default_section: str = "") -> Config:
    """Parse configuration text; keys before the first header go to ``default_section``."""
    config = Config()
    section = default_section
    last_key = ""
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = strip_comment(raw).rstrip()
        if not line.strip():
            continue
        if raw[:1] in " \t" and last_key:
            previous = config._sections[section][last_key]
            config.set(section, last_key, parse_value(f"{previous} {line.strip()}"))
            continue
        line = line.strip()
        if line.startswith("["):
            if not line.endswith("]"):
                raise ConfigError("unterminated section header", lineno)
            name = line[1:-1].strip()
            if not name:
                raise ConfigError("empty section name", lineno)
            try:
                config.add_section(name)
            except ConfigError as exc:
                raise ConfigError(str(exc), lineno) from None
            section = name
            last_key = ""
        elif "=" in line or ":" in line:
            separator = "=" if "=" in line else ":"
            key, _, value = line.partition(separator)
            key = key.strip()
            if not _KEY.match(key):
                raise ConfigError(f"invalid key {key!r}", lineno)
            config.set(section, key, parse_value(value))
            last_key = key
        else:
            raise ConfigError(f"expected 'key = value', got {line!r}", lineno)
    return config


def _format_value(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_format_value(item) for item in value) + "]"
    if isinstance(value, str):
        if value != value.strip() or any(c in value for c in "#;,\"'[]") or parse_value(value) != value:
            return '"' + value.replace('"', '\\"').replace("\n", "\\n") + '"'
        return value
    return repr(value)


def dump(config: Config) -> str:
    """Render ``config`` back to text that ``parse`` reads as an equal configuration."""
    blocks: list[str] = []
    for name in config.sections():
        lines = [f"[{name}]"] if name else []
        for key in config.keys(name):
            lines.append(f"{key} = {_format_value(config._sections[name][key])}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"
