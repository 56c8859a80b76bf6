"""Who wrote a document, from its own properties (files.authors; the search filter `authors`).

Each format reads its field (PDF /Author, Office and EPUB dc:creator, an e-mail's From, HTML
<meta name="author">) and passes it here: one property may hold several names separated by ';' or
line breaks (what Word and Acrobat write for several authors); ',' is not a separator ("Doe, Jane" is
one name). Whitespace is collapsed; the first occurrence of each name is kept.
"""

from __future__ import annotations

import re

_SEPARATORS = re.compile(r"[;\r\n]+")


def names(*values: str | None) -> list[str]:
    out: list[str] = []
    for value in values:
        if isinstance(value, str):
            out.extend(" ".join(part.split()) for part in _SEPARATORS.split(value))
    return list(dict.fromkeys(n for n in out if n))
