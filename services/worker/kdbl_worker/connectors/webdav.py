"""WebDAV collections (protocol `webdav`) and web-server directory listings (protocol `http`), via httpx.

`webdav` lists with PROPFIND, Depth: 1, one collection at a time (never Depth: infinity, which servers refuse
or answer with the whole tree in one reply): size from getcontentlength, mtime from getlastmodified, etag
from getetag. `http` reads nginx / Apache / `python -m http.server` style autoindex pages (`<a href>` links,
folders end in "/") and asks HEAD for size, Last-Modified and ETag.

Config (schema, defaults and validation: kdbl_core.sources.config):
  url           the base collection / folder URL (no user:password in it)
  credentials   optional reference: {"env": {"username": VAR, "password": VAR}} or {"dir": PATH} (files
                `username` and `password`); HTTP basic auth
  verify_tls    default true; ca_file: a CA bundle for a private certificate authority
  max_attempts  default 4: tries per request on connection errors, 429, 502, 503, 504 (Retry-After honoured,
                capped), and per download that breaks mid-stream
  base_delay    default 0.5 s: scale of the exponential backoff between tries
  max_depth     default 64 folder levels (a guard against server-side symlink loops)
  connect_timeout / read_timeout  seconds, default 10 / 60

Redirects are followed only while they stay inside the source: the same scheme, host and port and a path
under the base path (at most 20 in a row). One that leaves it (another host: a cloud metadata address, an
internal service; or another path of the same server) is refused: a listing records the folder or file as
skipped with the target (scheme, host and path: no query, which may carry a signature), a download fails
with OutsideSource, and the base URL itself redirecting elsewhere is SourceUnavailable. Before this
(issue 27) httpx followed every redirect and the bytes of wherever it led were indexed.

Keys are the decoded paths relative to the base URL ("sub dir/na%me #1?.txt"); requests encode them again.
The server as a whole failing (unreachable, 401, base missing, 5xx that do not stop) raises SourceUnavailable;
a sub-folder answering 403/404 is recorded in `problems` and skipped, like an unreadable folder on a mount.
"""

from __future__ import annotations

import errno
import logging
import random
import ssl
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from html.parser import HTMLParser
from typing import Any, BinaryIO
from urllib.parse import quote, unquote, urljoin, urlsplit

import httpx
from kdbl_core.sources import HttpConfig, parse

from kdbl_core.content.records import FileMeta
from kdbl_worker.connectors import (
    ClosingConnector,
    ListingProblems,
    OutsideSource,
    SourceUnavailable,
    read_credentials,
    valid_key,
)

log = logging.getLogger(__name__)

READ_CHUNK = 1024 * 1024
MAX_DELAY = 30.0
RETRY_STATUS = {429, 502, 503, 504}
MAX_REDIRECTS = 20  # httpx's own default
DAV = "{DAV:}"
PROPFIND_BODY = (b'<?xml version="1.0" encoding="utf-8"?>\n<D:propfind xmlns:D="DAV:"><D:prop>'
                 b"<D:resourcetype/><D:getcontentlength/><D:getlastmodified/><D:getetag/></D:prop></D:propfind>")


def _mtime(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError):
        return None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def _etag(value: str | None) -> str | None:
    if not value:
        return None
    value = value.strip()
    weak = value.startswith("W/")
    inner = (value[2:] if weak else value).strip('"')
    return (("W/" if weak else "") + inner) if inner else None


def _size(value: str | None) -> int | None:
    try:
        size = int(value) if value is not None else None
    except ValueError:
        return None
    return size if size is not None and size >= 0 else None


class _Skip(Exception):
    """One folder cannot be listed: a problem to record, not a reason to stop."""


def _shown(url: httpx.URL) -> str:
    """A URL for a message: scheme, host, port and path; never a query (a signature) or user info."""
    port = f":{url.port}" if url.port else ""
    return f"{url.scheme}://{url.host}{port}{url.path}"


class OffBase(OutsideSource):
    """The server redirected a request outside the source's base URL; not followed."""

    def __init__(self, url: httpx.URL) -> None:
        super().__init__(f"the server redirects it outside the source's base URL (to {_shown(url)})")
        self.url = url


class _HttpConnector(ClosingConnector):
    kind = "http"

    def __init__(self, config: dict[str, Any]) -> None:
        self.config: HttpConfig = parse(self.kind, config)  # type: ignore[assignment]
        self.problems = ListingProblems()
        self._http: httpx.Client | None = None

    # -- plumbing -----------------------------------------------------------------------------------------

    def _client(self) -> httpx.Client:
        if self._http is None:
            cfg = self.config
            secrets = read_credentials(cfg.credentials, required=("username", "password"))
            verify: bool | ssl.SSLContext = cfg.verify if isinstance(cfg.verify, bool) else \
                ssl.create_default_context(cafile=cfg.verify)
            self._http = httpx.Client(
                auth=httpx.BasicAuth(secrets["username"], secrets["password"]) if secrets else None,
                verify=verify, follow_redirects=False, headers={"User-Agent": "kdbl-worker"},
                timeout=httpx.Timeout(cfg.read_timeout, connect=cfg.connect_timeout),
            )
        return self._http

    def close(self) -> None:
        if getattr(self, "_http", None) is not None:
            self._http.close()
            self._http = None

    @property
    def _where(self) -> str:
        return f"{self.kind} source {self.config.url}"

    def _url_for(self, path: str) -> str:
        return self.config.origin + quote(path, safe="/")

    def _same_base(self, response: httpx.Response, path: str) -> None:
        """A base URL that redirects elsewhere would list nothing under the configured path: refuse it."""
        try:
            final = unquote(response.url.path, errors="strict")
        except UnicodeDecodeError:
            final = response.url.path
        if final.rstrip("/") != path.rstrip("/"):
            raise SourceUnavailable(f"{self._where}: the server redirects it to {response.url}; "
                                    "configure that URL")

    def _sleep(self, attempt: int, retry_after: str | None = None) -> None:
        delay = random.random() * min(self.config.base_delay * 2 ** (attempt - 1), MAX_DELAY)
        if retry_after and retry_after.strip().isdigit():
            delay = max(delay, min(float(retry_after), MAX_DELAY))
        time.sleep(delay)

    def _inside(self, url: httpx.URL) -> bool:
        """Whether a URL is within the source: its origin, and a path under the base path (decoded, with no
        "." or ".." segment left that a server could resolve elsewhere)."""
        origin = httpx.URL(self.config.origin)
        if (url.scheme, url.host, url.port) != (origin.scheme, origin.host, origin.port):
            return False
        path = url.path  # decoded
        base = self.config.base_path
        if any(segment in (".", "..") for segment in path.split("/")):
            return False
        return path.startswith(base) or path == base.rstrip("/")

    def _send(self, method: str, url: str, *, doing: str, headers: dict[str, str] | None = None,
              content: bytes | None = None) -> httpx.Response:
        """One request with bounded retries, following redirects that stay inside the source (OffBase for
        one that does not); the response is streamed and the caller closes it."""
        client = self._client()
        request = client.build_request(method, url, headers=headers, content=content)
        for _ in range(MAX_REDIRECTS + 1):
            response = self._send_once(request, doing=doing)
            following = response.next_request  # set by httpx for a redirect it did not follow
            if following is None:
                return response
            response.close()
            if not self._inside(following.url):
                raise OffBase(following.url)
            request = following
        raise SourceUnavailable(f"{self._where}: more than {MAX_REDIRECTS} redirects while {doing}")

    def _send_once(self, request: httpx.Request, *, doing: str) -> httpx.Response:
        client = self._client()
        cfg = self.config
        for attempt in range(1, cfg.max_attempts + 1):
            try:
                response = client.send(request, stream=True)
            except httpx.TransportError as exc:
                if attempt == cfg.max_attempts:
                    raise SourceUnavailable(f"{self._where}: cannot reach the server while {doing} "
                                            f"({type(exc).__name__}, {attempt} attempts)") from exc
                self._sleep(attempt)
                continue
            except httpx.HTTPError as exc:  # too many redirects, a malformed reply, ...
                raise SourceUnavailable(f"{self._where}: {type(exc).__name__} while {doing}") from exc
            if response.status_code in RETRY_STATUS:
                response.close()
                if attempt == cfg.max_attempts:
                    raise SourceUnavailable(f"{self._where}: the server answered {response.status_code} "
                                            f"while {doing}, {attempt} attempts")
                self._sleep(attempt, response.headers.get("retry-after"))
                continue
            if response.status_code == 401:
                response.close()
                raise SourceUnavailable(f"{self._where}: authentication failed (401) while {doing}; "
                                        "check the credentials reference")
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    # -- reading ------------------------------------------------------------------------------------------

    def check(self) -> None:
        raise NotImplementedError

    def open(self, key: str) -> BinaryIO:
        if not valid_key(key):
            raise FileNotFoundError(errno.ENOENT, "not a valid key", key)
        url = self._url_for(self.config.base_path + key)
        spool = tempfile.SpooledTemporaryFile(max_size=self.config.spool_max_bytes)  # noqa: SIM115
        try:
            self._download(url, key, spool)
        except BaseException:
            spool.close()
            raise
        spool.seek(0)
        return spool  # type: ignore[return-value]

    def _download(self, url: str, key: str, spool: BinaryIO) -> None:
        """GET into `spool`; a body that breaks off is fetched again from the start (max_attempts times)."""
        cfg = self.config
        for attempt in range(1, cfg.max_attempts + 1):
            spool.seek(0)
            spool.truncate()
            response = self._send("GET", url, doing="reading a file", headers={"Accept-Encoding": "identity"})
            try:
                status = response.status_code
                if status in (404, 410):
                    raise FileNotFoundError(errno.ENOENT, "no such file on the server", key)
                if status == 403:
                    raise PermissionError(errno.EACCES, "the server refused access (403)", key)
                if status >= 500:
                    raise SourceUnavailable(f"{self._where}: the server answered {status} while reading "
                                            "a file")
                if status != 200:
                    raise OSError(errno.EIO, f"the server answered {status}", key)
                encoded = response.headers.get("content-encoding", "identity").lower() not in ("", "identity")
                expected = None if encoded else _size(response.headers.get("content-length"))
                written = 0
                try:
                    for chunk in response.iter_bytes(READ_CHUNK):
                        spool.write(chunk)
                        written += len(chunk)
                except httpx.HTTPError as exc:  # the connection broke, a bad chunk or gzip stream
                    error: str | None = type(exc).__name__
                else:
                    error = None if expected is None or written == expected else \
                        f"body ended at {written} of {expected} bytes"
            finally:
                response.close()
            if error is None:
                return
            if attempt == cfg.max_attempts:
                raise OSError(errno.EIO, f"download broke {attempt} times (last: {error})", key)
            log.warning("download broke; starting over", extra={"url": url, "error": error})
            self._sleep(attempt)

    def _head(self, path: str) -> FileMeta | None:
        """Size, mtime and etag of one file from HEAD (GET headers where HEAD is refused); None: a problem."""
        key = path[len(self.config.base_path):]
        url = self._url_for(path)
        try:
            response = self._send("HEAD", url, doing="asking for a file's size",
                                  headers={"Accept-Encoding": "identity"})
            response.close()
            if response.status_code in (405, 501):
                response = self._send("GET", url, doing="asking for a file's size",
                                      headers={"Accept-Encoding": "identity"})
                response.close()
        except OffBase as exc:
            self.problems.add(key, f"{exc.strerror}; skipped")
            return None
        status = response.status_code
        if status >= 500:
            raise SourceUnavailable(f"{self._where}: the server answered {status} while asking for a "
                                    "file's size")
        if status != 200:
            self.problems.add(key, f"the server answered {status}; skipped")
            return None
        size = _size(response.headers.get("content-length"))
        if size is None:
            self.problems.add(key, "the server sent no Content-Length; skipped")
            return None
        return FileMeta(key=key, size=size, mtime=_mtime(response.headers.get("last-modified")),
                          etag=_etag(response.headers.get("etag")))


@dataclass(slots=True)
class _Entry:
    path: str  # decoded absolute path
    is_dir: bool
    size: int | None
    mtime: datetime | None
    etag: str | None


class WebDavConnector(_HttpConnector):
    kind = "webdav"

    def _propfind(self, path: str, depth: str, *, base: bool) -> list[_Entry]:
        """One collection's entries (itself included); raises SourceUnavailable, or _Skip for a sub-folder."""
        try:
            response = self._send("PROPFIND", self._url_for(path), doing="listing a collection",
                                  content=PROPFIND_BODY,
                                  headers={"Depth": depth, "Content-Type": 'application/xml; charset="utf-8"'})
        except OffBase as exc:
            if base:
                raise SourceUnavailable(f"{self._where}: the server redirects it to {_shown(exc.url)}, "
                                        "outside it; configure that URL") from None
            raise _Skip(exc.strerror) from None
        try:
            status = response.status_code
            if base:
                self._same_base(response, path)
            if status != 207:
                reasons = {403: "access is forbidden (403)", 404: "the collection does not exist (404)",
                           405: "the server does not allow PROPFIND here (405): not a WebDAV collection",
                           501: "the server does not speak WebDAV (501)"}
                reason = reasons.get(status, f"PROPFIND answered {status}")
                if base or status >= 500:
                    raise SourceUnavailable(f"{self._where}: {reason}")
                raise _Skip(reason)
            entries: list[_Entry] = []
            parser = ET.XMLPullParser(events=("end",))
            try:
                for data in response.iter_bytes():
                    parser.feed(data)
                    self._take(parser, entries)
                parser.close()
                self._take(parser, entries)
            except ET.ParseError as exc:
                if base:
                    raise SourceUnavailable(f"{self._where}: the PROPFIND reply is not valid XML") from exc
                raise _Skip("the PROPFIND reply is not valid XML") from exc
            except httpx.HTTPError as exc:
                raise SourceUnavailable(f"{self._where}: the PROPFIND reply broke off "
                                        f"({type(exc).__name__})") from exc
            return entries
        finally:
            response.close()

    def _take(self, parser: ET.XMLPullParser, entries: list[_Entry]) -> None:
        for _, elem in parser.read_events():
            if elem.tag != DAV + "response":
                continue
            entry = self._entry(elem)
            elem.clear()
            if entry is not None:
                entries.append(entry)

    def _entry(self, elem: ET.Element) -> _Entry | None:
        href = (elem.findtext(DAV + "href") or "").strip()
        try:
            path = unquote(urlsplit(href).path, errors="strict")
        except UnicodeDecodeError:
            self.problems.add(href, "the server's href is not percent-encoded UTF-8; skipped")
            return None
        if not path:
            return None
        prop: ET.Element | None = None
        for propstat in elem.findall(DAV + "propstat"):
            words = (propstat.findtext(DAV + "status") or "").split()
            if len(words) >= 2 and words[1] == "200":
                prop = propstat.find(DAV + "prop")
                break
        if prop is None:
            return None
        rtype = prop.find(DAV + "resourcetype")
        return _Entry(
            path=path, is_dir=rtype is not None and rtype.find(DAV + "collection") is not None,
            size=_size(prop.findtext(DAV + "getcontentlength")),
            mtime=_mtime(prop.findtext(DAV + "getlastmodified")),
            etag=_etag(prop.findtext(DAV + "getetag")),
        )

    def check(self) -> None:
        base = self.config.base_path
        entries = self._propfind(base, "0", base=True)
        if not any(e.is_dir for e in entries if e.path.rstrip("/") == base.rstrip("/")):
            raise SourceUnavailable(f"{self._where}: the URL is not a WebDAV collection")

    def walk(self) -> Iterator[FileMeta]:
        cfg = self.config
        base = cfg.base_path
        seen = {base}
        stack = [(base, 0)]
        while stack:
            path, depth = stack.pop()
            try:
                entries = self._propfind(path, "1", base=path == base)
            except _Skip as exc:
                self.problems.add(path[len(base):].rstrip("/"), f"cannot list collection: {exc}")
                continue
            files: list[_Entry] = []
            subdirs: list[str] = []
            for entry in entries:
                if entry.path.rstrip("/") == path.rstrip("/"):
                    if path == base and not entry.is_dir:
                        raise SourceUnavailable(f"{self._where}: the URL is not a WebDAV collection")
                    continue
                if not entry.path.startswith(base):
                    self.problems.add(entry.path, "the server listed a path outside the base collection; "
                                                  "skipped")
                    continue
                key = entry.path[len(base):].rstrip("/")
                if not valid_key(key):
                    self.problems.add(key, "not a usable path; skipped")
                    continue
                if entry.is_dir:
                    sub = base + key + "/"
                    if sub in seen:
                        continue
                    if depth + 1 > cfg.max_depth:
                        self.problems.add(key, f"deeper than max_depth {cfg.max_depth}; skipped")
                        continue
                    seen.add(sub)
                    subdirs.append(sub)
                else:
                    files.append(entry)
            for entry in sorted(files, key=lambda e: e.path):
                key = entry.path[len(base):]
                if entry.size is None:  # some servers leave getcontentlength out
                    remote = self._head(entry.path)
                    if remote is not None:
                        yield FileMeta(key=key, size=remote.size, mtime=entry.mtime or remote.mtime,
                                         etag=entry.etag or remote.etag)
                    continue
                yield FileMeta(key=key, size=entry.size, mtime=entry.mtime, etag=entry.etag)
            stack.extend((sub, depth + 1) for sub in sorted(subdirs, reverse=True))


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            for name, value in attrs:
                if name == "href" and value:
                    self.hrefs.append(value)


class HttpIndexConnector(_HttpConnector):
    """A web server's autoindex pages: each `<a href>` to a direct child; one ending in "/" is a folder."""

    kind = "http"

    def _index(self, path: str, *, base: bool) -> list[str]:
        try:
            response = self._send("GET", self._url_for(path), doing="reading a folder listing",
                                  headers={"Accept": "text/html"})
        except OffBase as exc:
            if base:
                raise SourceUnavailable(f"{self._where}: the server redirects it to {_shown(exc.url)}, "
                                        "outside it; configure that URL") from None
            raise _Skip(exc.strerror) from None
        try:
            status = response.status_code
            if base:
                self._same_base(response, path)
            if status != 200:
                reason = {403: "access is forbidden (403)", 404: "the folder does not exist (404)"}.get(
                    status, f"the listing answered {status}")
                if base or status >= 500:
                    raise SourceUnavailable(f"{self._where}: {reason}")
                raise _Skip(reason)
            if "html" not in response.headers.get("content-type", "").lower():
                if base:
                    raise SourceUnavailable(f"{self._where}: the URL is not an HTML folder listing")
                raise _Skip("not an HTML folder listing")
            links = _Links()
            try:
                for text in response.iter_text():
                    links.feed(text)
            except httpx.HTTPError as exc:
                raise SourceUnavailable(f"{self._where}: a folder listing broke off "
                                        f"({type(exc).__name__})") from exc
            links.close()
            return links.hrefs
        finally:
            response.close()

    def check(self) -> None:
        self._index(self.config.base_path, base=True)

    def walk(self) -> Iterator[FileMeta]:
        cfg = self.config
        base = cfg.base_path
        seen = {base}
        stack = [(base, 0)]
        while stack:
            path, depth = stack.pop()
            try:
                hrefs = self._index(path, base=path == base)
            except _Skip as exc:
                self.problems.add(path[len(base):].rstrip("/"), f"cannot read folder listing: {exc}")
                continue
            here = self._url_for(path)
            files: set[str] = set()
            subdirs: set[str] = set()
            for href in hrefs:
                target = urlsplit(urljoin(here, href.strip()))
                if target.query or target.fragment or f"{target.scheme}://{target.netloc}" != cfg.origin:
                    continue  # sort links (?C=N;O=D), anchors, other sites
                try:
                    child = unquote(target.path, errors="strict")
                except UnicodeDecodeError:
                    self.problems.add(target.path, "link is not percent-encoded UTF-8; skipped")
                    continue
                if not child.startswith(path):
                    continue  # parent folder, site root, elsewhere
                name = child[len(path):]
                is_dir = name.endswith("/")
                name = name.rstrip("/") if is_dir else name
                if not name or "/" in name or name in (".", ".."):
                    continue  # only direct children
                (subdirs if is_dir else files).add(path + name + ("/" if is_dir else ""))
            for file_path in sorted(files):
                remote = self._head(file_path)
                if remote is not None:
                    yield remote
            for sub in sorted(subdirs, reverse=True):
                if sub in seen:
                    continue
                if depth + 1 > cfg.max_depth:
                    self.problems.add(sub[len(base):].rstrip("/"),
                                      f"deeper than max_depth {cfg.max_depth}; skipped")
                    continue
                seen.add(sub)
                stack.append((sub, depth + 1))
