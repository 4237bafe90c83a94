"""URL slugs from titles."""

import re
import unicodedata


def slugify(title: str, max_length: int = 40) -> str:
    """`Hello, World!` -> `hello-world`: ASCII letters and digits joined by single hyphens."""
    ascii_text = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_text.lower()).strip("-")
    return slug[:max_length].rstrip("-")
