"""Text helpers: word splitting, case conversion, slugs, wrapping, truncation and English inflection."""

from __future__ import annotations

import re
import unicodedata

__all__ = [
    "camel_case",
    "center",
    "initials",
    "kebab_case",
    "ordinal",
    "pascal_case",
    "pluralize",
    "slugify",
    "snake_case",
    "split_words",
    "title_case",
    "truncate",
    "wrap",
]

SMALL_WORDS = frozenset({"a", "an", "and", "as", "at", "but", "by", "for", "in", "of", "on", "or", "the", "to"})
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_IRREGULAR = {"child": "children", "person": "people", "mouse": "mice", "foot": "feet"}


def split_words(text: str) -> list[str]:
    """Split ``text`` into words at spaces, punctuation, case changes and digit boundaries."""
    return _WORD.findall(text)


def snake_case(text: str) -> str:
    """Return ``text`` as lower-case words joined by underscores."""
    return "_".join(word.lower() for word in split_words(text))


def kebab_case(text: str) -> str:
    """Return ``text`` as lower-case words joined by hyphens."""
    return "-".join(word.lower() for word in split_words(text))


def pascal_case(text: str) -> str:
    """Return ``text`` as capitalised words joined without separators."""
    return "".join(word.capitalize() for word in split_words(text))


def camel_case(text: str) -> str:
    """Return ``text`` in camelCase: like pascal_case but with a lower-case first word."""
    words = split_words(text)
    if not words:
        return ""
    return words[0].lower() + "".join(word.capitalize() for word in words[1:])


def title_case(text: str) -> str:
    """Capitalise each word except small words, which stay lower-case unless first or last."""
    words = text.split()
    result: list[str] = []
    for index, word in enumerate(words):
        lowered = word.lower()
        if 0 < index < len(words) - 1 and lowered in SMALL_WORDS:
            result.append(lowered)
        else:
            result.append(lowered[:1].upper() + lowered[1:])
    return " ".join(result)


def slugify(text: str, max_length: int = 0, separator: str = "-") -> str:
    """Return an ASCII, lower-case slug; when ``max_length`` > 0 the slug is cut at a word boundary."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    words = re.findall(r"[a-z0-9]+", ascii_text.lower())
    slug = separator.join(words)
    if max_length <= 0 or len(slug) <= max_length:
        return slug
    cut = slug[: max_length + 1]
    boundary = cut.rfind(separator)
    if boundary > 0:
        return cut[:boundary]
    return slug[:max_length]


def truncate(text: str, width: int, ellipsis: str = "...") -> str:
    """Shorten ``text`` to at most ``width`` characters, ending with ``ellipsis`` when cut."""
    if width < 0:
        raise ValueError("width must not be negative")
    if len(text) <= width:
        return text
    if width <= len(ellipsis):
        return ellipsis[:width]
    return text[: width - len(ellipsis)].rstrip() + ellipsis


def wrap(text: str, width: int) -> list[str]:
    """Greedily wrap words into lines of at most ``width`` characters; longer words are split."""
    if width < 1:
        raise ValueError("width must be positive")
    lines: list[str] = []
    current = ""
    for word in text.split():
        chunks = [word[i : i + width] for i in range(0, len(word), width)]
        for chunk in chunks:
            if not current:
                current = chunk
            elif len(current) + 1 + len(chunk) <= width:
                current = current + " " + chunk
            else:
                lines.append(current)
                current = chunk
    if current:
        lines.append(current)
    return lines


def center(text: str, width: int, fill: str = " ") -> str:
    """Center ``text`` in ``width`` columns; an odd leftover column goes to the right side."""
    if len(fill) != 1:
        raise ValueError("fill must be a single character")
    padding = width - len(text)
    if padding <= 0:
        return text
    left = padding // 2
    right = padding - left
    return fill * left + text + fill * right


def ordinal(number: int) -> str:
    """Return ``number`` with its English ordinal suffix: 1st, 2nd, 3rd, 4th, 11th, 22nd, ..."""
    remainder = abs(number) % 100
    if 11 <= remainder <= 13:
        suffix = "th"
    elif remainder % 10 == 1:
        suffix = "st"
    elif remainder % 10 == 2:
        suffix = "nd"
    elif remainder % 10 == 3:
        suffix = "rd"
    else:
        suffix = "th"
    return f"{number}{suffix}"


def pluralize(word: str, count: int = 2) -> str:
    """Return the English plural of ``word`` unless ``count`` is exactly 1 (irregular nouns included)."""
    if count == 1 or not word:
        return word
    lowered = word.lower()
    if lowered in _IRREGULAR:
        plural = _IRREGULAR[lowered]
        return plural.capitalize() if word[0].isupper() else plural
    if lowered.endswith(("s", "x", "z", "ch", "sh")):
        return word + "es"
    elif lowered.endswith("y") and len(word) > 1 and lowered[-2] not in "aeiou":
        return word[:-1] + "ies"
    elif lowered.endswith("fe"):
        return word[:-2] + "ves"
    elif lowered.endswith("f") and not lowered.endswith("ff"):
        return word[:-1] + "ves"
    return word + "s"


def initials(name: str, max_letters: int = 3) -> str:
    """Return up to ``max_letters`` upper-case initials of the words in ``name``."""
    letters = [word[0].upper() for word in name.replace("-", " ").split() if word[0].isalpha()]
    if len(letters) > max_letters:
        letters = letters[: max_letters - 1] + letters[-1:]
    return "".join(letters)
