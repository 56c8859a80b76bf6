"""The webdav and http connectors against real servers on loopback.

WebDAV: wsgidav serving a temporary folder under cheroot, with basic auth on. HTTP: Python's own
ThreadingHTTPServer + SimpleHTTPRequestHandler, whose folder pages are an autoindex like nginx's or Apache's.
"""

from __future__ import annotations

import functools
import io
import os
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from helpers import db_of, free_port
from kdbl_control import admin
from kdbl_core.errors import InvalidArgument, PermanentError
from kdbl_core.settings import Settings
from kdbl_worker.connectors import OutsideSource, connector_for
from kdbl_worker.connectors.fs import SourceUnavailable
from kdbl_worker.connectors.webdav import HttpIndexConnector, WebDavConnector
from kdbl_worker.pipeline import Indexer, load_sources
from sqlalchemy import text

USER, PASSWORD = "alice", "correct horse battery staple"
ENV = {"username": "KDBL_TEST_DAV_USER", "password": "KDBL_TEST_DAV_PASSWORD"}
FILES: dict[str, bytes] = {
    "readme.txt": b"top level readme",
    "docs/guide.md": b"# Guide\n\nInstall the widget.",
    "docs/deep/er/nested.txt": b"three levels down",
    "sp ace/na%me #1?.txt": b"odd name survives",
    "\u00fcn\u00ef/\u6587\u6863.md": "unicode \u6587\u6863".encode(),
    "plus+&=;,'.txt": b"reserved characters",
    "per%2Fcent%25.txt": b"percent escapes stay literal",
    "empty.txt": b"",
    "big.bin": os.urandom(2 * 1024 * 1024 + 7),
}
EMPTY_DIRS = ["hollow", "docs/hollow too"]


@pytest.fixture(scope="module", autouse=True)
def dav_env() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV["username"], USER)
        mp.setenv(ENV["password"], PASSWORD)
        yield


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("dav")
    for key, body in FILES.items():
        path = base / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
    for folder in EMPTY_DIRS:
        (base / folder).mkdir(parents=True)
    return base


class Recorder:
    """WSGI middleware: records each request; can answer the next few with 503, or break a GET's body off."""

    def __init__(self, app) -> None:
        self.app = app
        self.calls: list[tuple[str, str, str | None]] = []
        self.unavailable = 0
        self.cut = 0

    def __call__(self, environ, start_response):
        self.calls.append((environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""),
                           environ.get("HTTP_DEPTH")))
        if self.unavailable:
            self.unavailable -= 1
            start_response("503 Service Unavailable", [("Retry-After", "0"), ("Content-Length", "0")])
            return [b""]
        if self.cut and environ["REQUEST_METHOD"] == "GET":
            self.cut -= 1
            return self._half(self.app(environ, start_response))
        return self.app(environ, start_response)

    @staticmethod
    def _half(body):
        data = b"".join(body)
        getattr(body, "close", lambda: None)()
        yield data[: len(data) // 2]
        raise ConnectionAbortedError("test: the body breaks off here")  # cheroot drops the connection


@pytest.fixture(scope="module")
def dav(root) -> Iterator[tuple[str, Recorder]]:
    from cheroot import wsgi
    from wsgidav.wsgidav_app import WsgiDAVApp

    app = WsgiDAVApp({
        "provider_mapping": {"/dav": str(root)},
        "simple_dc": {"user_mapping": {"*": {USER: {"password": PASSWORD}}}},
        "http_authenticator": {"accept_basic": True, "accept_digest": False, "default_to_digest": False},
        "verbose": 0, "logging": {"enable": False}, "dir_browser": {"enable": False},
    })
    recorder = Recorder(app)
    server = wsgi.Server(("127.0.0.1", 0), recorder, numthreads=4)
    server.prepare()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.bind_addr[1]}/dav/", recorder
    server.stop()
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def web(root) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Autoindex, directory=str(root)))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    server.server_close()


class _Autoindex(SimpleHTTPRequestHandler):
    """Python's autoindex page, with the links an Apache or nginx page also carries that are not children."""

    JUNK = ('<a href="?C=N;O=D">Name</a> <a href="?C=M;O=A">Last modified</a> <a href="../">../</a> '
            '<a href="/">Parent Directory</a> <a href="#top">top</a> <a href="mailto:x@example.org">m</a> '
            '<a href="http://other.example/readme.txt">elsewhere</a> <a href="docs/guide.md">deep link</a> '
            '<a href="./">.</a> <a href="&#63;C=D">escaped sort link</a>')

    def log_message(self, *args) -> None:
        pass

    def send_header(self, keyword, value):
        if keyword == "Content-Length" and getattr(self, "_listing", False):
            value = str(int(value) + len(self.JUNK.encode()))
        super().send_header(keyword, value)

    def list_directory(self, path):
        self._listing = True
        page = super().list_directory(path)
        self._listing = False
        if page is None:
            return None
        body = page.read().replace(b"<ul>", b"<ul>" + self.JUNK.encode(), 1)
        return io.BytesIO(body)


def dav_connector(url: str, **extra) -> WebDavConnector:
    config = {"url": url, "credentials": {"env": ENV}, "base_delay": 0.01, **extra}
    connector = connector_for("webdav", config)
    assert isinstance(connector, WebDavConnector)
    return connector


def _expected(root: Path, prefix: str = "") -> dict[str, tuple[int, datetime]]:
    out = {}
    for key in FILES:
        if key.startswith(prefix):
            st = (root / key).stat()
            out[key[len(prefix):]] = (st.st_size, datetime.fromtimestamp(int(st.st_mtime), UTC))
    return out


# -- webdav --------------------------------------------------------------------------------------------------


def test_webdav_walk_lists_nested_files_with_metadata(dav, root):
    url, recorder = dav
    recorder.calls.clear()
    with dav_connector(url) as connector:
        files = {f.key: f for f in connector.walk()}
    assert {k: (f.size, f.mtime) for k, f in files.items()} == _expected(root)
    assert all(f.etag and '"' not in f.etag for f in files.values())
    assert not connector.problems.items
    propfinds = [c for c in recorder.calls if c[0] == "PROPFIND"]
    assert {depth for _, _, depth in propfinds} == {"1"}  # collection by collection, never Depth: infinity
    collections = {"", "docs", "docs/deep", "docs/deep/er", "sp ace", "\u00fcn\u00ef", *EMPTY_DIRS}
    assert len(propfinds) == len(collections)


def test_webdav_a_sub_collection_is_a_base_too(dav, root):
    url, _ = dav
    with dav_connector(url + "docs") as connector:  # no trailing slash: still the collection
        assert {f.key: (f.size, f.mtime) for f in connector.walk()} == _expected(root, "docs/")
    with dav_connector(url + "sp%20ace/") as connector:
        assert [f.key for f in connector.walk()] == ["na%me #1?.txt"]
        with connector.open("na%me #1?.txt") as stream:
            assert stream.read() == b"odd name survives"


def test_webdav_open_round_trips_every_name(dav):
    url, _ = dav
    with dav_connector(url) as connector:
        for key, body in FILES.items():
            with connector.open(key) as stream:
                assert stream.read() == body, key
                stream.seek(0)
                assert stream.read(3) == body[:3]
        with pytest.raises(FileNotFoundError):
            connector.open("docs/missing.txt")
        with pytest.raises(FileNotFoundError):
            connector.open("../escape.txt")


def test_webdav_a_download_that_breaks_is_fetched_again(dav):
    url, recorder = dav
    recorder.calls.clear()
    recorder.cut = 1
    with dav_connector(url) as connector, connector.open("big.bin") as stream:
        assert stream.read() == FILES["big.bin"]
    assert [c[0] for c in recorder.calls] == ["GET", "GET"]


def test_webdav_retries_a_server_that_is_briefly_unavailable(dav):
    url, recorder = dav
    recorder.unavailable = 2
    with dav_connector(url) as connector:
        assert len(list(connector.walk())) == len(FILES)
        recorder.unavailable = 1
        with connector.open("readme.txt") as stream:
            assert stream.read() == FILES["readme.txt"]
    recorder.unavailable = 10
    try:
        with dav_connector(url, max_attempts=3) as connector, pytest.raises(SourceUnavailable, match="503"):
            connector.check()
    finally:
        recorder.unavailable = 0


def test_webdav_wrong_password_is_source_unavailable(dav, monkeypatch):
    url, _ = dav
    monkeypatch.setenv("KDBL_TEST_DAV_WRONG", "not the password")
    with (dav_connector(url, credentials={"env": {**ENV, "password": "KDBL_TEST_DAV_WRONG"}}) as connector,
          pytest.raises(SourceUnavailable, match=r"authentication failed \(401\)") as err):
        list(connector.walk())
    assert "not the password" not in str(err.value) and PASSWORD not in str(err.value)
    with connector_for("webdav", {"url": url}) as anonymous, pytest.raises(SourceUnavailable, match="401"):
        anonymous.check()


def test_webdav_credentials_from_a_mounted_secret_dir(dav, tmp_path):
    url, _ = dav
    (tmp_path / "username").write_text(USER + "\n")
    (tmp_path / "password").write_text(PASSWORD)
    with dav_connector(url, credentials={"dir": str(tmp_path)}) as connector:
        connector.check()
    with pytest.raises(PermanentError, match="missing password"):
        (tmp_path / "password").unlink()
        dav_connector(url, credentials={"dir": str(tmp_path)}).check()


def test_webdav_missing_or_wrong_collection_is_source_unavailable(dav, web):
    url, _ = dav
    with dav_connector(url + "no-such-folder/") as connector:
        with pytest.raises(SourceUnavailable, match=r"does not exist \(404\)"):
            connector.check()
        with pytest.raises(SourceUnavailable, match=r"does not exist \(404\)"):
            list(connector.walk())
    with dav_connector(url + "readme.txt") as connector, pytest.raises(SourceUnavailable):
        list(connector.walk())
    with dav_connector(web) as connector, pytest.raises(SourceUnavailable, match="does not speak WebDAV"):
        list(connector.walk())
    with (dav_connector(f"http://127.0.0.1:{free_port()}/dav/", max_attempts=2) as connector,
          pytest.raises(SourceUnavailable, match="cannot reach the server")):
        connector.check()


def test_webdav_config_is_validated():
    with pytest.raises(InvalidArgument, match="url"):
        connector_for("webdav", {"url": "ftp://example.org/"})
    with pytest.raises(InvalidArgument, match="url"):
        connector_for("webdav", {"url": "https://bob:hunter2@example.org/dav/"})
    with pytest.raises(InvalidArgument, match="credentials") as err:
        connector_for("webdav", {"url": "https://example.org/", "credentials": {"password": "hunter2"}})
    assert "hunter2" not in str(err.value)


# -- http autoindex ------------------------------------------------------------------------------------------


def test_http_index_walk_follows_folder_links_only(web, root):
    with connector_for("http", {"url": web, "base_delay": 0.01}) as connector:
        assert isinstance(connector, HttpIndexConnector)
        files = {f.key: f for f in connector.walk()}
        assert {k: (f.size, f.mtime) for k, f in files.items()} == _expected(root)
        assert not connector.problems.items
        for key, body in FILES.items():
            with connector.open(key) as stream:
                assert stream.read() == body, key
    with connector_for("http", {"url": web + "docs"}) as connector:
        assert sorted(f.key for f in connector.walk()) == ["deep/er/nested.txt", "guide.md"]


def test_http_index_missing_folder_is_source_unavailable(web):
    with (connector_for("http", {"url": web + "nothing-here/"}) as connector,
          pytest.raises(SourceUnavailable, match="404")):
        list(connector.walk())
    with connector_for("http", {"url": web + "readme.txt"}) as connector, pytest.raises(SourceUnavailable):
        connector.check()


# -- end to end: the real pipeline and the real database -----------------------------------------------------


def test_crawl_a_webdav_source_end_to_end(owner_engine, worker_engine, unique, dav, root):
    url, _ = dav
    folder = root / f"e2e-{unique}"
    (folder / "notes").mkdir(parents=True)
    (folder / "guide.md").write_text("# Guide\n\nInstall the widget.")
    (folder / "notes" / "plan #1.txt").write_text("quarterly plan")
    tenant = f"dav-{unique}"
    admin.create_tenant(db_of(owner_engine), tenant)
    source = admin.add_source(db_of(owner_engine), tenant, protocol="webdav", name=f"dav-{unique}",
                              config={"url": f"{url}e2e-{unique}/", "credentials": {"env": ENV}})
    indexer = Indexer(db_of(worker_engine), Settings())

    def crawl():
        [row] = load_sources(db_of(worker_engine), source_id=source.id)
        return indexer.crawl(row)

    def rows():
        with owner_engine.connect() as conn:
            return {r.key: r for r in conn.execute(text(
                "SELECT f.key, f.status, f.etag, (SELECT string_agg(c.text, ' ') FROM chunks c "
                "WHERE c.file_id = f.id) AS body FROM files f WHERE f.source_id = :s"), {"s": source.id})}

    stats = crawl()
    assert (stats.listed, stats.indexed, stats.failed) == (2, 2, 0)
    files = rows()
    assert set(files) == {"guide.md", "notes/plan #1.txt"} and all(f.status == "ok" and f.etag for f in
                                                                     files.values())
    assert crawl().indexed == 0
    (folder / "notes" / "plan #1.txt").write_text("revised quarterly plan")
    stats = crawl()
    assert (stats.indexed, stats.unchanged) == (1, 1)
    assert "revised" in rows()["notes/plan #1.txt"].body
    (folder / "guide.md").unlink()
    assert crawl().deleted == 1
    assert set(rows()) == {"notes/plan #1.txt"}


# -- redirects that leave the source (issue 27) --------------------------------------------------------------

METADATA = b"metadata-service credentials: never indexed"
OUTSIDE = b"a file outside the base collection: never indexed"


class _Redirects:
    """WSGI middleware: answers chosen (method, path) pairs with a redirect to a chosen Location."""

    def __init__(self, app, moves: dict[tuple[str, str], tuple[str, str]]) -> None:
        self.app, self.moves = app, moves

    def __call__(self, environ, start_response):
        move = self.moves.get((environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")))
        if move is None:
            return self.app(environ, start_response)
        status, location = move
        start_response(status, [("Location", location), ("Content-Length", "0")])
        return [b""]


@pytest.fixture(scope="module")
def elsewhere() -> Iterator[str]:
    """Another host (a loopback port of its own): what a cloud metadata address or an internal service is."""

    class Metadata(SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(METADATA)))
            self.end_headers()
            self.wfile.write(METADATA)

        do_HEAD = do_GET

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metadata)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def redirecting(tmp_path_factory, elsewhere) -> Iterator[tuple[str, Path]]:
    """wsgidav with /dav (the source) and /outside (not the source) and redirects: away.txt to another host,
    sideways.txt to /outside, moved.txt to /dav/real.txt (inside: followed), gone/ to /outside/."""
    from cheroot import wsgi
    from wsgidav.wsgidav_app import WsgiDAVApp

    base, outside = tmp_path_factory.mktemp("dav-redirects"), tmp_path_factory.mktemp("dav-outside")
    for name in ("away.txt", "sideways.txt", "moved.txt", "gone/listed.txt"):
        (base / name).parent.mkdir(parents=True, exist_ok=True)
        (base / name).write_bytes(b"placeholder the server never serves")
    (base / "real.txt").write_bytes(b"the real file, inside the base")
    (outside / "secret.txt").write_bytes(OUTSIDE)
    app = WsgiDAVApp({
        "provider_mapping": {"/dav": str(base), "/outside": str(outside)},
        "simple_dc": {"user_mapping": {"*": {USER: {"password": PASSWORD}}}},
        "http_authenticator": {"accept_basic": True, "accept_digest": False, "default_to_digest": False},
        "verbose": 0, "logging": {"enable": False}, "dir_browser": {"enable": False},
    })
    server = wsgi.Server(("127.0.0.1", 0), app, numthreads=4)
    server.prepare()  # binds: the port is known from here on
    origin = f"http://127.0.0.1:{server.bind_addr[1]}"
    moves = {}
    for method in ("GET", "HEAD"):
        moves[(method, "/dav/away.txt")] = ("302 Found", f"{elsewhere}/latest/meta-data")
        moves[(method, "/dav/sideways.txt")] = ("302 Found", f"{origin}/outside/secret.txt")
        moves[(method, "/dav/moved.txt")] = ("307 Temporary Redirect", "/dav/real.txt")
        moves[(method, "/dav/climb.txt")] = ("302 Found", "/dav/%2E%2E/outside/secret.txt")
    moves[("PROPFIND", "/dav/gone/")] = ("301 Moved Permanently", f"{origin}/outside/")
    server.wsgi_app = _Redirects(app, moves)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    yield f"{origin}/dav/", base
    server.stop()
    thread.join(timeout=10)


def test_webdav_follows_a_redirect_inside_the_base_and_refuses_one_that_leaves_it(redirecting):
    url, _ = redirecting
    with dav_connector(url) as connector:
        keys = {f.key for f in connector.walk()}
        problems = dict(connector.problems.items)
        assert keys == {"away.txt", "sideways.txt", "moved.txt", "real.txt"}
        assert problems["gone"].startswith("cannot list collection: the server redirects it outside")
        assert "/outside/" in problems["gone"]
        with connector.open("moved.txt") as stream:
            assert stream.read() == b"the real file, inside the base"
        for key, target in (("away.txt", "/latest/meta-data"), ("sideways.txt", "/outside/secret.txt"),
                            ("climb.txt", "")):
            with pytest.raises(OutsideSource, match="outside the source's base URL") as refused:
                connector.open(key)
            assert target in refused.value.strerror


def test_webdav_a_base_url_that_redirects_outside_itself_is_source_unavailable(redirecting):
    url, _ = redirecting
    with dav_connector(url + "gone/") as connector, pytest.raises(SourceUnavailable, match="outside it"):
        connector.check()


def test_a_crawl_indexes_nothing_a_redirect_off_the_base_leads_to(owner_engine, worker_engine, unique,
                                                                  redirecting):
    url, _ = redirecting
    tenant = f"dav-redirect-{unique}"
    admin.create_tenant(db_of(owner_engine), tenant)
    source = admin.add_source(db_of(owner_engine), tenant, protocol="webdav", name="dav",
                              config={"url": url, "credentials": {"env": ENV}, "base_delay": 0.01})
    [row] = load_sources(db_of(worker_engine), source_id=source.id)
    Indexer(db_of(worker_engine), Settings()).crawl(row)
    with owner_engine.connect() as conn:
        files = {r.key: r for r in conn.execute(text(
            "SELECT f.key, f.status, f.status_reason, (SELECT string_agg(c.text, ' ') FROM chunks c "
            "WHERE c.file_id = f.id) AS body FROM files f WHERE f.source_id = :s"), {"s": source.id})}
    assert files["moved.txt"].status == "ok" and "real file" in files["moved.txt"].body
    for key in ("away.txt", "sideways.txt"):
        assert files[key].status == "failed" and "outside the source's base URL" in files[key].status_reason
        assert files[key].body is None
    assert not any(b and ("metadata-service" in b or "outside the base collection" in b)
                   for b in (f.body for f in files.values()))


class _AwayIndex(BaseHTTPRequestHandler):
    """An autoindex page listing plain.txt and away.txt; away.txt redirects to another host."""

    elsewhere = ""

    def log_message(self, *args) -> None:
        pass

    def _answer(self, body: bool) -> None:
        if self.path == "/away.txt":
            self.send_response(302)
            self.send_header("Location", f"{self.elsewhere}/latest/meta-data")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        page = {"/": (b'<a href="plain.txt">plain.txt</a> <a href="away.txt">away.txt</a>', "text/html"),
                "/plain.txt": (b"plain", "text/plain")}.get(self.path)
        if page is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", page[1])
        self.send_header("Content-Length", str(len(page[0])))
        self.end_headers()
        if body:
            self.wfile.write(page[0])

    def do_GET(self) -> None:
        self._answer(True)

    def do_HEAD(self) -> None:
        self._answer(False)


def test_http_index_records_a_file_whose_head_redirects_off_the_base_as_skipped(web, elsewhere):
    with connector_for("http", {"url": web + "docs/", "base_delay": 0.01}) as connector:
        assert connector._inside(httpx.URL(web + "docs/guide.md"))
        assert not connector._inside(httpx.URL(web + "readme.txt"))
        assert not connector._inside(httpx.URL(elsewhere + "/docs/guide.md"))
        assert not connector._inside(httpx.URL(web + "docs/%2E%2E/%2E%2E/etc/passwd"))
    handler = type("Away", (_AwayIndex,), {"elsewhere": elsewhere})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        with connector_for("http", {"url": f"http://127.0.0.1:{server.server_port}/", "base_delay": 0.01}) as c:
            keys = {f.key for f in c.walk()}
            problems = dict(c.problems.items)
            with pytest.raises(OutsideSource, match="/latest/meta-data"):
                c.open("away.txt")
    finally:
        server.shutdown()
        server.server_close()
    assert keys == {"plain.txt"}
    assert problems["away.txt"].startswith("the server redirects it outside the source's base URL")
