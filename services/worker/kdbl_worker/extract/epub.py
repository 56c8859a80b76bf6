"""EPUB 2/3 via zipfile + defusedxml + the HTML extractor: spine documents in reading order.

page_no is the 1-based position of the document in the spine (a chapter locator); each block carries the
heading path of its chapter's h1-h6 (the HTML extractor's, extract/headings.py).
DRM-encrypted content (META-INF/encryption.xml naming a spine document) is refused;
font obfuscation, which the same file also records, is not a reason to fail.
"""

from __future__ import annotations

import io
import posixpath
from urllib.parse import unquote

import defusedxml
import defusedxml.ElementTree as safe_et

from kdbl_worker.extract import authors
from kdbl_worker.extract.archive import ENCRYPTED, PackageError, check_zip, read_member
from kdbl_worker.extract.base import Block, Extraction, Source
from kdbl_worker.extract.html import extract_html

_CONTAINER = "{urn:oasis:names:tc:opendocument:xmlns:container}"
_OPF = "{http://www.idpf.org/2007/opf}"
_DC = "{http://purl.org/dc/elements/1.1/}"
_ENC = "{http://www.w3.org/2001/04/xmlenc#}"
_XHTML_TYPES = {"application/xhtml+xml", "text/html", "application/x-dtbook+xml"}
MAX_DOCUMENT = 64 << 20


def _xml(package, name: str):
    return safe_et.fromstring(read_member(package, name, limit=MAX_DOCUMENT))


def _encrypted_names(package) -> set[str]:
    try:
        root = _xml(package, "META-INF/encryption.xml")
    except KeyError:
        return set()
    return {unquote(ref.get("URI", "")) for ref in root.iter(f"{_ENC}CipherReference")}


def _spine(package) -> tuple[list[str], str | None, list[str]]:
    """Zip paths of the spine's XHTML documents in reading order, the book title and its dc:creators."""
    container = _xml(package, "META-INF/container.xml")
    rootfile = container.find(f".//{_CONTAINER}rootfile")
    if rootfile is None or not rootfile.get("full-path"):
        raise PackageError("no rootfile in META-INF/container.xml")
    opf_path = rootfile.get("full-path")
    opf = _xml(package, opf_path)
    base = posixpath.dirname(opf_path)
    manifest = {
        item.get("id"): (
            posixpath.normpath(posixpath.join(base, unquote(item.get("href", "")))),
            item.get("media-type"),
        )
        for item in opf.iter(f"{_OPF}item")
    }
    paths = []
    for ref in opf.iter(f"{_OPF}itemref"):
        path, media_type = manifest.get(ref.get("idref"), (None, None))
        if path and media_type in _XHTML_TYPES:
            paths.append(path)
    title_element = opf.find(f".//{_DC}title")
    title = " ".join((title_element.text or "").split()) if title_element is not None else ""
    return paths, title or None, authors.names(*(c.text for c in opf.iter(f"{_DC}creator")))


def extract_epub(source: Source) -> Extraction:
    try:
        with check_zip(source.stream) as package:
            paths, title, by = _spine(package)
            if set(paths) & _encrypted_names(package):
                return Extraction.failed(ENCRYPTED)
            blocks: list[Block] = []
            missing: list[str] = []
            for number, path in enumerate(paths, start=1):
                try:
                    data = read_member(package, path, limit=MAX_DOCUMENT)
                except KeyError:
                    missing.append(path)
                    continue
                chapter = extract_html(Source(io.BytesIO(data), path, len(data), "application/xhtml+xml"))
                blocks.extend(Block(b.text, page_no=number, heading=b.heading) for b in chapter.blocks)
    except KeyError as exc:
        return Extraction.failed(f"not an EPUB package (missing {exc})")
    except PackageError as exc:
        return Extraction.failed(str(exc))
    except (safe_et.ParseError, defusedxml.DefusedXmlException) as exc:
        return Extraction.failed(f"invalid EPUB metadata: {type(exc).__name__}: {exc}")
    if missing:
        reason = f"{len(missing)} of {len(paths)} spine documents missing (first: {missing[0]})"
        return Extraction(blocks=blocks, status="partial", reason=reason, title=title, authors=by)
    return Extraction(blocks=blocks, title=title, authors=by)
