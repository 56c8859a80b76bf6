"""A statement's text as the server needs it: comments dropped, whitespace folded.

psycopg parses a statement's `%(name)s` placeholders on every execute unless the text is at most 4,096 bytes
(psycopg._queries.MAX_CACHED_STATEMENT_LENGTH; then the parse is cached). The keyword statement, written
out with its comments and indentation, was 5,712 bytes: its placeholders were parsed again on every search
(psycopg's _query2pg_nocache, 0.4 % of the API's samples under `bench search`: ~20 µs a call, issue 33).
Folded it is 4,061 bytes, and the folding itself is cached per text (the statements are a few shapes, built
per call from the same constants).

Only our own statement texts are folded (never a value: values travel as parameters). The lexer keeps quoted
strings and identifiers as they are; a text it does not read simply (dollar quotes, E'' strings, nested
comments) is left unchanged.
"""

from __future__ import annotations

import re
from functools import lru_cache

_TOKENS = re.compile(r"""
    (?P<quoted>'(?:[^']|'')*'|"(?:[^"]|"")*")
  | (?P<comment>--[^\n]*|/\*(?:[^*]|\*(?!/))*\*/)
  | (?P<space>\s+)
  | (?P<other>[^'"\s/-]+|/(?!\*)|-(?!-))
""", re.VERBOSE)
_TIGHT = frozenset("(),;[]")  # tokens of their own: a space beside one is never needed
# PostgreSQL's operator characters, two of which may merge; "%" counts as a word's: psycopg's placeholders
# (`%(limit)s` becomes `$3`, and `LIMIT$3` would be one identifier)
_OPERATOR = frozenset("+-*/<>=~!@#^&|`?")
_NOT_SIMPLE = re.compile(r"\$[A-Za-z_]*\$|(?<![\w$])[Ee]'|/\*(?:[^*]|\*(?!/))*/\*")


@lru_cache(maxsize=256)
def fold(sql: str) -> str:
    """`sql` without comments and with each run of whitespace (comments included) one space where two tokens
    would otherwise merge (`_spaced`), none leading or trailing; `sql` itself when it holds what this lexer
    does not read (see the module docstring)."""
    if _NOT_SIMPLE.search(sql):
        return sql
    out: list[str] = []
    pending = False  # whitespace or a comment since the last token
    pos = 0
    for match in _TOKENS.finditer(sql):
        if match.start() != pos:  # an unterminated quote or comment: leave the text to the server as written
            return sql
        pos = match.end()
        kind = match.lastgroup
        if kind in ("space", "comment"):
            pending = True
            continue
        token = match.group()
        if pending and out and _spaced(out[-1][-1], token[0]):
            out.append(" ")
        pending = False
        out.append(token)
    if pos != len(sql):
        return sql
    return "".join(out)


def _spaced(before: str, after: str) -> bool:
    """Whether the whitespace between two tokens must stay (one space): not beside a parenthesis, bracket,
    comma or semicolon; not between an operator character and a word's (`a = b` -> `a=b`); yes between two
    words (`AS n`) and between two operator characters (`- -1` must not become a comment)."""
    if before in _TIGHT or after in _TIGHT:
        return False
    return (before in _OPERATOR) == (after in _OPERATOR)
