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
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import db_of, free_port
from kdbl_control import admin
from kdbl_core.errors import InvalidArgument, PermanentError
from kdbl_core.settings import Settings
from kdbl_worker.connectors import connector_for
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
