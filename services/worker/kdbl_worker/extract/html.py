"""HTML: the main content (main/article when present), without scripts, navigation or boilerplate.

Bytes are decoded by extract/encoding.py with the charset a `<meta>` in the first 4 KiB declares
(`<meta charset=...>` or `http-equiv` Content-Type): used when the page is not valid UTF-8, else detected.

Each block carries its heading path (extract/headings.py) from the h1-h6 whose text is kept (a heading
inside a skipped header/nav does not count); the heading's own block carries the path with it.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

from kdbl_worker.extract import authors
from kdbl_worker.extract.base import Block, Extraction, Source
from kdbl_worker.extract.encoding import decode
from kdbl_worker.extract.headings import HeadingPath

_SKIP = {"script", "style", "noscript", "template", "svg", "nav", "header", "footer", "aside", "form", "button"}
_BLOCK = {
    "p", "div", "section", "article", "main", "li", "ul", "ol", "table", "tr", "h1", "h2", "h3", "h4",
    "h5", "h6", "pre", "blockquote", "br", "hr", "dd", "dt", "figcaption", "td", "th", "body",
}
_META_CHARSET = re.compile(rb"""<meta[^>]*?charset\s*=\s*["']?\s*([A-Za-z0-9._:-]+)""", re.IGNORECASE)
_VOID = {"br", "hr", "img", "meta", "link", "input", "area", "base", "col", "embed", "source", "wbr"}
_HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.skip_depth = 0
        self.stack: list[str] = []
        self.title: list[str] = []
        self.in_title = False
        self.authors: list[str] = []  # <meta name="author" content="...">
        # Two streams: everything, and only what sits inside <main>/<article>.
        self.all_blocks: list[str] = [""]
        self.main_blocks: list[str] = [""]
        self.main_depth = 0
        # each block's heading path (parallel to the two streams) and the heading being read
        self.headings = HeadingPath()
        self.all_paths: list[tuple[str, ...]] = [()]
        self.main_paths: list[tuple[str, ...]] = [()]
        self.open_heading: tuple[int, list[str]] | None = None

    def _break(self) -> None:
        path = self.headings.path
        for blocks, paths in ((self.all_blocks, self.all_paths), (self.main_blocks, self.main_paths)):
            if blocks[-1].strip():
                blocks.append("")
                paths.append(path)
            else:  # nothing written yet: the block starts here, under the current headings
                paths[-1] = path

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self.in_title = True
        if tag == "meta" and any(k == "name" and (v or "").strip().lower() == "author" for k, v in attrs):
            self.authors.extend(v for k, v in attrs if k == "content" and v)
        if tag in _VOID:
            if tag in _BLOCK:
                self._break()
            return
        self.stack.append(tag)
        if tag in _SKIP or any(v == "navigation" for k, v in attrs if k == "role"):
            self.skip_depth += 1
            self.stack[-1] = tag + "!skip"
        if tag in ("main", "article"):
            self.main_depth += 1
        if tag in _BLOCK:
            self._break()
        if tag in _HEADINGS and not self.skip_depth:
            self.open_heading = (_HEADINGS[tag], [])

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self.in_title = False
        if tag in _VOID:
            return
        if tag in _HEADINGS and self.open_heading is not None:
            level, parts = self.open_heading
            self.open_heading = None
            path = self.headings.enter(level, "".join(parts))
            for blocks, paths in ((self.all_blocks, self.all_paths), (self.main_blocks, self.main_paths)):
                if blocks[-1].strip():  # the heading's own block
                    paths[-1] = path
        # pop to the matching tag (tolerates unclosed children)
        for i in range(len(self.stack) - 1, -1, -1):
            name = self.stack[i].removesuffix("!skip")
            if name == tag:
                for popped in self.stack[i:]:
                    if popped.endswith("!skip"):
                        self.skip_depth -= 1
                    if popped.removesuffix("!skip") in ("main", "article"):
                        self.main_depth -= 1
                del self.stack[i:]
                break
        if tag in _BLOCK:
            self._break()

    def handle_data(self, data: str) -> None:
        if self.in_title:
            self.title.append(data)
            return
        if self.skip_depth or "head" in self.stack:
            return
        self.all_blocks[-1] += data
        if self.open_heading is not None:
            self.open_heading[1].append(data)
        if self.main_depth:
            self.main_blocks[-1] += data


def _clean(blocks: list[str], paths: list[tuple[str, ...]]) -> list[Block]:
    out = []
    for raw, path in zip(blocks, paths, strict=True):
        text = " ".join(raw.split())
        if text:
            out.append(Block(text, heading=path))
    return out


def extract_html(source: Source) -> Extraction:
    data = source.stream.read()
    meta = _META_CHARSET.search(data, 0, 4096)
    decoded = decode(data, meta.group(1).decode("ascii") if meta else None)
    if decoded.text is None:
        return Extraction.failed(decoded.note or "not text")
    parser = _Collector()
    parser.feed(decoded.text)
    parser.close()
    main = _clean(parser.main_blocks, parser.main_paths)
    blocks = main if main else _clean(parser.all_blocks, parser.all_paths)
    title = " ".join("".join(parser.title).split()) or None
    return Extraction(blocks=blocks, status="partial" if decoded.lossy else "ok", reason=decoded.note,
                      title=title, authors=authors.names(*parser.authors))
