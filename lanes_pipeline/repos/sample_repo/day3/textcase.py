"""Converting and measuring strings: identifier cases, truncation, vowels, palindromes."""

import re

VOWELS = "aeiou"


def camel_to_snake(name: str) -> str:
    """`camelCase` or `PascalCase` to `snake_case`, an acronym kept as one word.

    camel_to_snake("parseHttpRequest") == "parse_http_request"; camel_to_snake("HTTPServer") == "http_server".
    """
    spaced = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", spaced).lower()


def snake_to_camel(name: str, upper_first: bool = False) -> str:
    """`snake_case` to `camelCase` ("max_line_length" -> "maxLineLength"); `PascalCase` when `upper_first`."""
    first, *rest = name.split("_")
    head = first.capitalize() if upper_first else first.lower()
    return head + "".join(part.capitalize() for part in rest)


def kebab_case(text: str) -> str:
    """Words of `text` (split on spaces, `_` and `-`) lower-cased and joined by single hyphens.

    kebab_case("Hello  big_World") == "hello-big-world".
    """
    return "-".join(w.lower() for w in re.split(r"[\s_\-]+", text.strip()) if w)


def truncate(text: str, width: int, suffix: str = "…") -> str:
    """`text` cut to at most `width` characters, ending in `suffix` when cut (the suffix counts in `width`).

    truncate("abcdef", 4) == "abc…"; truncate("abcdef", 5, suffix="...") == "ab..."; "abcd" fits in 4.
    """
    if len(text) <= width:
        return text
    return text[: max(0, width - len(suffix))] + suffix


def count_vowels(text: str) -> int:
    """Number of the letters a, e, i, o, u in `text`, either case: count_vowels("Programming") == 3."""
    return sum(1 for ch in text.lower() if ch in VOWELS)


def is_palindrome(text: str) -> bool:
    """True when `text` reads the same backwards, ignoring case and anything but letters and digits.

    is_palindrome("A man, a plan, a canal: Panama") is True; the empty string is a palindrome.
    """
    kept = [ch.lower() for ch in text if ch.isalnum()]
    return kept == kept[::-1]


def reverse_words(text: str) -> str:
    """The whitespace-separated words of `text` in reverse order, joined by single spaces.

    reverse_words("a  b c") == "c b a".
    """
    return " ".join(reversed(text.split()))


def collapse_spaces(text: str) -> str:
    """`text` with every run of whitespace replaced by one space and no leading or trailing whitespace."""
    return " ".join(text.split())


def initials(name: str) -> str:
    """The upper-case first letters of the words of `name`, without dots.

    initials("ada  king lovelace") == "AKL".
    """
    return "".join(word[0].upper() for word in name.split())


def title_case(text: str, small_words: frozenset[str] = frozenset({"a", "an", "and", "of", "the"})) -> str:
    """The words of `text` capitalized, except `small_words`, which stay lower-case unless first.

    title_case("the lord of the rings") == "The Lord of the Rings"; words are joined by single spaces.
    """
    words = text.lower().split()
    return " ".join(w if i and w in small_words else w.capitalize() for i, w in enumerate(words))


def char_frequencies(text: str) -> dict[str, int]:
    """How often each non-whitespace character occurs in `text`, keys in order of first appearance.

    char_frequencies("aba b") == {"a": 2, "b": 2}.
    """
    counts: dict[str, int] = {}
    for ch in text:
        if not ch.isspace():
            counts[ch] = counts.get(ch, 0) + 1
    return counts


def mask(text: str, visible: int = 4, fill: str = "*") -> str:
    """`text` with all but its last `visible` characters replaced by `fill`; all of it if `visible` <= 0.

    mask("12345678") == "****5678"; a text of `visible` characters or fewer is returned as it is.
    """
    if visible <= 0:
        return fill * len(text)
    hidden = max(0, len(text) - visible)
    return fill * hidden + text[hidden:]
