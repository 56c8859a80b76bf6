"""Which keys of a source are indexed: `include` / `exclude` glob lists from `sources.config`; the same
rules select the keys a `label_globs` glob labels (kdbl_core.sources.labels). In the core since the
relabel (run by kdbl-control and the operator when a source's label config changes) matches them too.

Patterns match the whole key (the path relative to the source root, `/`-separated), as in .gitignore:

- `*` matches any run of characters except `/`, `?` one character except `/`, `[abc]`/`[!abc]` a class;
- `**` matches anything, `/` included; `**/` also matches no directory at all (`**/*.md` matches `a.md`);
- a pattern without `/` matches the file name at any depth (`*.pdf` is `**/*.pdf`);
- a pattern ending in `/` matches everything under that directory (`drafts/` is `drafts/**`).

A key is indexed when `include` is empty or one include pattern matches, and no exclude pattern
matches (exclude wins). Matching is case-sensitive. A file that stops being selected is removed from
the index by the next crawl, as if it had been deleted.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from kdbl_core.errors import InvalidArgument


def _translate(pattern: str) -> str:
    if pattern.endswith("/"):
        pattern += "**"
    if "/" not in pattern:
        pattern = "**/" + pattern
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i):
                i += 2
                if pattern.startswith("/", i):  # "**/": zero or more directories
                    out.append("(?:.*/)?")
                    i += 1
                else:
                    out.append(".*")
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 2 if pattern.startswith(("[!", "[^"), i) else i + 1)
            if end < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1:end]
                if body.startswith(("!", "^")):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _compile(patterns: object, field: str) -> re.Pattern[str] | None:
    if patterns is None:
        return None
    if isinstance(patterns, str):
        patterns = [patterns]
    if not isinstance(patterns, list) or not all(isinstance(p, str) and p for p in patterns):
        raise InvalidArgument(field, "must be a list of non-empty glob patterns")
    if not patterns:
        return None
    try:
        return re.compile("|".join(f"(?:{_translate(p.lstrip('/'))})" for p in patterns), re.DOTALL)
    except re.error as exc:
        raise InvalidArgument(field, f"bad glob pattern: {exc}") from None


@dataclass(frozen=True, slots=True)
class Selection:
    include: re.Pattern[str] | None = None
    exclude: re.Pattern[str] | None = None

    @classmethod
    def from_config(cls, config: dict) -> Selection:
        return cls(_compile(config.get("include"), "include"), _compile(config.get("exclude"), "exclude"))

    @classmethod
    def of(cls, include: Sequence[str] = (), exclude: Sequence[str] = ()) -> Selection:
        return cls(_compile(list(include), "include"), _compile(list(exclude), "exclude"))

    def __call__(self, key: str) -> bool:
        if self.include is not None and self.include.fullmatch(key) is None:
            return False
        return self.exclude is None or self.exclude.fullmatch(key) is None
