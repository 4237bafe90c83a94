"""URL slugs from titles."""

import re
import unicodedata

SEPARATORS = re.compile(r"[^a-z0-9]+")


def slugify(title: str, max_length: int = 40, separator: str = "-") -> str:
    """`Hello, World!` -> `hello-world`: ASCII letters and digits joined by single separators."""
    ascii_text = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    slug = SEPARATORS.sub(separator, ascii_text.lower()).strip(separator)
    return slug[:max_length].rstrip(separator)


def unique_slug(title: str, taken: set[str]) -> str:
    """A slug not in `taken`: `title`, then `title-2`, `title-3`, ..."""
    base = slugify(title)
    candidate, number = base, 2
    while candidate in taken:
        candidate, number = f"{base}-{number}", number + 1
    return candidate
