"""The s3 connector against a real S3 HTTP API on loopback (moto's server mode), as against MinIO or Ceph RGW.

boto3 is never patched: objects are uploaded with boto3 as any client would, and the connector talks HTTP to
the server. A small fault-injecting proxy of our own sits in front of the server where a test needs throttling
(503 SlowDown), a body that breaks off mid-stream, or a look at the requests the connector sent.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import boto3
import pytest
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from helpers import db_of, free_port
from kdbl_control import admin
from kdbl_core.errors import InvalidArgument, PermanentError
from kdbl_core.settings import Settings
from kdbl_worker.connectors import connector_for
from kdbl_worker.connectors.fs import SourceUnavailable
from kdbl_worker.connectors.s3 import S3Connector
from kdbl_worker.pipeline import Indexer, load_sources
from sqlalchemy import text

pytestmark = [
    # moto's server (flask/werkzeug, jsonschema, aws-xray) and botocore raise DeprecationWarnings of their own
    # on import or per request; none comes from K-Lake's code.
    pytest.mark.filterwarnings("ignore::DeprecationWarning:moto.*"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning:botocore.*"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning:werkzeug.*"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning:flask.*"),
]

ACCESS_KEY, SECRET_KEY = "AKIAKDBLTEST00000001", "kdblTestSecret0001kdblTestSecret0001abcd"
TOKEN = "kdbl-test-session-token"
ENV = {"access_key_id": "KDBL_TEST_S3_ACCESS", "secret_access_key": "KDBL_TEST_S3_SECRET"}
BIG = bytes(range(256)) * (5 * 1024 * 1024 // 256) + b"tail"  # a little over 5 MiB
MULTI = hashlib.sha256(b"multipart").digest() * (6 * 1024 * 1024 // 32)  # 6 MiB in two parts
OBJECTS: dict[str, bytes] = {
    "readme.txt": b"top level readme",
    "dir/sub/deep.md": b"# Deep\n\nnested two levels",
    "dir/\u00fcn\u00efc\u00f6d\u00e9 \u6587\u6863.txt": "unicode name \u6587\u6863".encode(),
    "dir/sp ace/file name.txt": b"spaces in folder and file",
    "dir/hash#tag.txt": b"hash",
    "dir/per%cent%20.txt": b"percent signs stay literal",
    "dir/what?.txt": b"question mark",
    "dir/plus+and&amp;=.txt": b"plus and ampersand",
    "dirty.txt": b"shares the prefix 'dir' but is not in the folder",
    "empty.txt": b"",
    "big.bin": BIG,
}
MARKERS = ["dir/", "dir/empty-folder/"]  # zero-byte "directory marker" objects the console tools create
SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
            b"<Message>Please reduce your request rate.</Message><RequestId>kdbl-proxy</RequestId></Error>")
HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "upgrade", "content-length",
       "server", "date"}


@pytest.fixture(scope="module", autouse=True)
def aws_env() -> Iterator[None]:
    """Credentials by env-var name; no host ~/.aws files or instance metadata lookups leak into the tests."""
    with pytest.MonkeyPatch.context() as mp:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            mp.delenv(name, raising=False)
        mp.setenv("AWS_CONFIG_FILE", os.devnull)
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        mp.setenv(ENV["access_key_id"], ACCESS_KEY)
        mp.setenv(ENV["secret_access_key"], SECRET_KEY)
        yield


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(scope="module")
def client(endpoint):
    """The uploading side: a plain boto3 client, as any S3 client would use the store."""
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="uploader",
                        aws_secret_access_key="uploader", config=Config(s3={"addressing_style": "path"}))


@pytest.fixture(scope="module")
def bucket(client) -> str:
    name = f"kdbl-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name)
    for key, body in OBJECTS.items():
        extra = {"StorageClass": "STANDARD_IA"} if key == "dir/hash#tag.txt" else {}
        client.put_object(Bucket=name, Key=key, Body=body, **extra)
    for key in MARKERS:
        client.put_object(Bucket=name, Key=key, Body=b"")
    client.upload_fileobj(_BytesReader(MULTI), name, "multi/part.bin",
                          Config=TransferConfig(multipart_threshold=5 * 1024 * 1024,
                                                multipart_chunksize=5 * 1024 * 1024, use_threads=False))
    return name


def _docx(body: str) -> bytes:
    import io

    import docx

    document = docx.Document()
    document.add_paragraph(body)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


class _BytesReader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n is None or n < 0 else self.pos + n
        chunk, self.pos = self.data[self.pos:end], min(end, len(self.data))
        return chunk


ALL = {**OBJECTS, "multi/part.bin": MULTI}


def config(endpoint: str, bucket: str, **extra) -> dict:
    return {"bucket": bucket, "endpoint_url": endpoint, "region": "us-east-1", "credentials": {"env": ENV},
            "max_attempts": 3, "base_delay": 0.01, **extra}


def connect(endpoint: str, bucket: str, **extra) -> S3Connector:
    connector = connector_for("s3", config(endpoint, bucket, **extra))
    assert isinstance(connector, S3Connector)
    return connector


# -- a fault-injecting proxy ---------------------------------------------------------------------------------


class FaultProxy:
    """Forwards every request to the S3 server; can answer 503 SlowDown or cut an object's body in half."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream).port
        self.lock = threading.Lock()
        self.throttle = 0  # requests left to answer with 503 SlowDown; -1: all of them
        self.throttle_only: Callable[[str, str], bool] = lambda method, path: True
        self.cut = 0  # object GETs left to break off halfway
        self.on_cut: Callable[[], None] | None = None
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self.throttled = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _any(self) -> None:
                proxy.handle(self)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @staticmethod
    def is_object_get(method: str, path: str) -> bool:
        parts = urlsplit(path)
        is_listing = "list-type" in parse_qs(parts.query)
        return method == "GET" and not is_listing and parts.path.strip("/").count("/") >= 1

    def handle(self, req: BaseHTTPRequestHandler) -> None:
        length = int(req.headers.get("Content-Length") or 0)
        body = req.rfile.read(length) if length else None
        with self.lock:
            self.seen.append((req.command, req.path, dict(req.headers)))
            throttle = self.throttle != 0 and self.throttle_only(req.command, req.path)
            if throttle:
                self.throttle -= self.throttle > 0
                self.throttled += 1
            cut = self.cut > 0 and self.is_object_get(req.command, req.path)
            self.cut -= cut
        if throttle:
            req.send_response(503)
            req.send_header("Content-Type", "application/xml")
            req.send_header("Content-Length", "0" if req.command == "HEAD" else str(len(SLOWDOWN)))
            req.end_headers()
            if req.command != "HEAD":
                req.wfile.write(SLOWDOWN)
            return
        upstream = http.client.HTTPConnection("127.0.0.1", self.upstream, timeout=30)
        try:
            headers = {k: v for k, v in req.headers.items() if k.lower() not in HOP}
            upstream.request(req.command, req.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
        finally:
            upstream.close()
        req.send_response(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in HOP:
                req.send_header(name, value)
        declared = response.getheader("Content-Length") if req.command == "HEAD" else str(len(data))
        req.send_header("Content-Length", declared or "0")
        req.end_headers()
        if req.command == "HEAD":
            return
        if cut:
            req.wfile.write(data[: len(data) // 2])
            if self.on_cut is not None:
                self.on_cut()
            req.close_connection = True
            req.connection.shutdown(socket.SHUT_RDWR)
            return
        req.wfile.write(data)

    def requests(self, method: str | None = None) -> list[tuple[str, str, dict[str, str]]]:
        with self.lock:
            return [r for r in self.seen if method is None or r[0] == method]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy(endpoint) -> Iterator[FaultProxy]:
    p = FaultProxy(endpoint)
    yield p
    p.close()


# -- listing -------------------------------------------------------------------------------------------------


def test_walk_lists_every_object_with_its_metadata(endpoint, bucket, client):
    with connect(endpoint, bucket) as connector:
        files = {f.key: f for f in connector.walk()}
    assert set(files) == set(ALL)  # directory markers ("dir/", "dir/empty-folder/") are not files
    for key, body in ALL.items():
        head = client.head_object(Bucket=bucket, Key=key)
        remote = files[key]
        assert remote.size == len(body)
        assert remote.etag == head["ETag"].strip('"') and '"' not in remote.etag
        assert remote.mtime == head["LastModified"] and remote.mtime.tzinfo is not None
        assert remote.mtime.utcoffset() == UTC.utcoffset(None)
    assert files["readme.txt"].etag == hashlib.md5(OBJECTS["readme.txt"]).hexdigest()
    assert files["multi/part.bin"].etag.endswith("-2")  # a multipart upload's ETag is not an MD5
    assert files["dir/hash#tag.txt"].storage_class == "STANDARD_IA"
    assert files["readme.txt"].storage_class == "STANDARD"


def test_a_prefix_is_a_folder_and_keys_are_relative_to_it(endpoint, bucket):
    for prefix in ("dir", "dir/", "/dir/"):
        with connect(endpoint, bucket, prefix=prefix) as connector:
            keys = sorted(f.key for f in connector.walk())
            assert keys == sorted(k[len("dir/"):] for k in ALL if k.startswith("dir/")), prefix
            assert "dirty.txt" not in keys and "ty.txt" not in keys
            with connector.open("sub/deep.md") as stream:
                assert stream.read() == OBJECTS["dir/sub/deep.md"]


def test_listing_pages_through_the_bucket(endpoint, bucket, proxy):
    with connect(proxy.url, bucket, page_size=2) as connector:
        walker = connector.walk()
        first = next(walker)
        lists = [r for r in proxy.requests("GET") if "list-type=2" in r[1]]
        assert len(lists) == 1 and "max-keys=2" in lists[0][1]  # a generator: one page fetched so far
        keys = [first.key, *(f.key for f in walker)]
    assert sorted(keys) == sorted(ALL)
    total = len(ALL) + len(MARKERS)
    lists = [r for r in proxy.requests("GET") if "list-type=2" in r[1]]
    assert len(lists) == -(-total // 2)
    assert all("continuation-token" in r[1] for r in lists[1:])


# -- reading -------------------------------------------------------------------------------------------------


def test_open_round_trips_every_key_and_is_seekable(endpoint, bucket):
    with connect(endpoint, bucket) as connector:
        for key, body in ALL.items():
            with connector.open(key) as stream:
                assert stream.read() == body, key
                assert stream.seekable()
                stream.seek(0)
                assert stream.read(4) == body[:4]
        with pytest.raises(FileNotFoundError):
            connector.open("no/such key.txt")


def test_large_objects_spill_to_disk(endpoint, bucket):
    with (connect(endpoint, bucket, spool_max_bytes=1024 * 1024) as connector,
          connector.open("big.bin") as stream):
        assert stream._rolled  # past spool_max_bytes the spool is a real temporary file
        assert stream.read() == BIG
        stream.seek(len(BIG) - 4)
        assert stream.read() == b"tail"


def test_a_download_that_breaks_resumes_from_where_it_stopped(endpoint, bucket, proxy):
    proxy.cut = 1
    with connect(proxy.url, bucket) as connector, connector.open("big.bin") as stream:
        assert stream.read() == BIG
    gets = [h for m, p, h in proxy.requests("GET") if p.endswith("/big.bin")]
    assert len(gets) == 2 and "Range" not in gets[0]
    assert gets[1]["Range"] == f"bytes={len(BIG) // 2}-"  # resumed, not started over
    assert gets[1]["If-Match"].strip('"') == hashlib.md5(BIG).hexdigest()  # pinned to the same version


def test_an_object_replaced_while_read_fails_that_file_only(endpoint, bucket, client, proxy):
    client.put_object(Bucket=bucket, Key="volatile.txt", Body=b"first version " * 1000)
    proxy.cut = 1
    proxy.on_cut = lambda: client.put_object(Bucket=bucket, Key="volatile.txt", Body=b"second version")
    try:
        with (connect(proxy.url, bucket) as connector,
              pytest.raises(OSError, match="changed while it was read")):
            connector.open("volatile.txt")
    finally:
        client.delete_object(Bucket=bucket, Key="volatile.txt")


# -- failures of the whole source ----------------------------------------------------------------------------


def test_a_missing_bucket_is_source_unavailable(endpoint):
    with connect(endpoint, "kdbl-no-such-bucket") as connector:
        with pytest.raises(SourceUnavailable, match="kdbl-no-such-bucket.*does not exist"):
            connector.check()
        with pytest.raises(SourceUnavailable, match="does not exist"):
            next(connector.walk())


def test_an_unreachable_endpoint_is_source_unavailable():
    with (connect(f"http://127.0.0.1:{free_port()}", "any-bucket", max_attempts=2) as connector,
          pytest.raises(SourceUnavailable, match="cannot reach the endpoint")):
        connector.check()


def test_throttling_is_retried_with_backoff(endpoint, bucket, proxy):
    proxy.throttle = 2
    with connect(proxy.url, bucket, max_attempts=4) as connector:
        assert len(list(connector.walk())) == len(ALL)
        assert proxy.throttled == 2
        proxy.throttle = 2
        proxy.throttle_only = FaultProxy.is_object_get
        with connector.open("readme.txt") as stream:
            assert stream.read() == OBJECTS["readme.txt"]
    assert proxy.throttled == 4


def test_throttling_that_never_stops_gives_up_with_a_clear_error(endpoint, bucket, proxy):
    proxy.throttle = -1
    proxy.throttle_only = lambda method, path: method == "GET"
    started = time.monotonic()
    with connect(proxy.url, bucket, max_attempts=5) as connector:
        walker = connector.walk()
        with pytest.raises(SourceUnavailable, match=r"throttled \(SlowDown\) after 5 attempts while listing"):
            next(walker)
        assert proxy.throttled == 5  # max_attempts bounds it
        with pytest.raises(SourceUnavailable, match=r"throttled \(SlowDown\) after 5 attempts while reading"):
            connector.open("readme.txt")
        assert proxy.throttled == 10
    # base_delay=0.01 replaced botocore's 1 s throttling scale (8 sleeps averaging 7.5 s otherwise: ~60 s)
    assert time.monotonic() - started < 30


# -- credentials ---------------------------------------------------------------------------------------------


def _signed_with(proxy: FaultProxy) -> set[str]:
    keys = set()
    for _, _, headers in proxy.requests():
        auth = headers.get("Authorization", "")
        assert auth.startswith("AWS4-HMAC-SHA256 Credential=")
        keys.add(auth.split("Credential=", 1)[1].split("/", 1)[0])
    return keys


def test_credentials_come_from_env_var_names(endpoint, bucket, proxy, monkeypatch):
    monkeypatch.setenv("KDBL_TEST_S3_TOKEN", TOKEN)
    env = {**ENV, "session_token": "KDBL_TEST_S3_TOKEN"}
    with connect(proxy.url, bucket, credentials={"env": env}) as connector:
        assert len(list(connector.walk())) == len(ALL)
    assert _signed_with(proxy) == {ACCESS_KEY}
    assert {h.get("X-Amz-Security-Token") for _, _, h in proxy.requests()} == {TOKEN}


def test_credentials_come_from_a_mounted_secret_dir(endpoint, bucket, proxy, tmp_path):
    secret = tmp_path / "kdbl-source"
    secret.mkdir()
    (secret / "access_key_id").write_text("AKIDFROMADIR0001\n")  # a trailing newline, as `echo` leaves it
    (secret / "secret_access_key").write_text("from-a-dir-secret")
    with connect(proxy.url, bucket, credentials={"dir": str(secret)}) as connector:
        connector.check()
    assert _signed_with(proxy) == {"AKIDFROMADIR0001"}
    assert all("X-Amz-Security-Token" not in h for _, _, h in proxy.requests())


def test_credential_errors_name_the_reference_never_the_value(endpoint, bucket, tmp_path, monkeypatch):
    monkeypatch.delenv("KDBL_TEST_S3_UNSET", raising=False)
    with pytest.raises(PermanentError, match="KDBL_TEST_S3_UNSET") as err:
        unset = {**ENV, "secret_access_key": "KDBL_TEST_S3_UNSET"}
        connect(endpoint, bucket, credentials={"env": unset}).check()
    assert ACCESS_KEY not in str(err.value)
    with pytest.raises(PermanentError, match="missing secret_access_key"):
        (tmp_path / "access_key_id").write_text("x")
        connect(endpoint, bucket, credentials={"dir": str(tmp_path)}).check()
    literal = {"access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY}
    with pytest.raises(InvalidArgument) as err:
        connect(endpoint, bucket, credentials=literal)  # values where a reference belongs
    assert SECRET_KEY not in str(err.value) and ACCESS_KEY not in str(err.value)
    with pytest.raises(PermanentError) as err:  # values pasted where variable names belong
        connect(endpoint, bucket, credentials={"env": literal}).check()
    assert SECRET_KEY not in str(err.value) and ACCESS_KEY not in str(err.value)
    assert "credentials.env.access_key_id" in str(err.value)
    with pytest.raises(SourceUnavailable) as err:
        connect(endpoint, "kdbl-no-such-bucket").check()
    assert SECRET_KEY not in str(err.value) and ACCESS_KEY not in str(err.value)


def test_config_is_validated():
    with pytest.raises(InvalidArgument, match="bucket"):
        connector_for("s3", {"prefix": "x"})
    with pytest.raises(InvalidArgument, match="endpoint_url"):
        connector_for("s3", {"bucket": "b", "endpoint_url": "http://user:pw@minio:9000"})
    with pytest.raises(InvalidArgument, match="max_attempts"):
        connector_for("s3", {"bucket": "b", "max_attempts": 0})


# -- end to end: the real pipeline and the real database -----------------------------------------------------


def test_crawl_an_s3_source_end_to_end(owner_engine, worker_engine, unique, endpoint, client):
    name = f"kdbl-e2e-{unique}"
    client.create_bucket(Bucket=name)
    docs = {"docs/guide.md": b"# Guide\n\nInstall the widget.", "docs/notes/plan.txt": b"quarterly plan",
            "docs/na%me #1?.txt": b"odd name survives", "docs/report.docx": _docx("seekable zip from S3"),
            "other/skip.txt": b"outside the prefix"}
    for key, body in docs.items():
        client.put_object(Bucket=name, Key=key, Body=body)
    tenant = admin.create_tenant(db_of(owner_engine), f"s3-{unique}")
    cfg = {"bucket": name, "prefix": "docs/", "endpoint_url": endpoint, "region": "us-east-1",
           "credentials": {"env": ENV}}
    source = admin.add_source(db_of(owner_engine), tenant.name, protocol="s3", config=cfg,
                              name=f"bucket-{unique}")
    indexer = Indexer(db_of(worker_engine), Settings())

    def crawl():
        [row] = load_sources(db_of(worker_engine), source_id=source.id)
        return indexer.crawl(row)

    def rows():
        with owner_engine.connect() as conn:
            return {r.key: r for r in conn.execute(text(
                "SELECT f.key, f.status, f.etag, f.size, f.storage_class, f.chunk_count, "
                "(SELECT string_agg(c.text, ' ') FROM chunks c WHERE c.file_id = f.id) AS body "
                "FROM files f WHERE f.source_id = :s"), {"s": source.id})}

    stats = crawl()
    assert (stats.listed, stats.indexed, stats.failed) == (4, 4, 0)
    files = rows()
    assert set(files) == {"guide.md", "notes/plan.txt", "na%me #1?.txt", "report.docx"}
    assert all(f.status == "ok" and f.chunk_count == 1 and f.storage_class == "STANDARD"
               for f in files.values())
    assert files["guide.md"].etag == hashlib.md5(docs["docs/guide.md"]).hexdigest()
    assert "odd name survives" in files["na%me #1?.txt"].body
    assert "seekable zip from S3" in files["report.docx"].body  # extractors seek in the spooled copy

    assert crawl().indexed == 0  # unchanged: etag and size match
    client.put_object(Bucket=name, Key="docs/notes/plan.txt", Body=b"revised quarterly plan")
    stats = crawl()
    assert (stats.indexed, stats.unchanged) == (1, 3)
    assert "revised" in rows()["notes/plan.txt"].body
    client.delete_object(Bucket=name, Key="docs/guide.md")
    stats = crawl()
    assert (stats.indexed, stats.deleted) == (0, 1)
    remaining = {"notes/plan.txt", "na%me #1?.txt", "report.docx"}
    assert set(rows()) == remaining

    for key in client.list_objects_v2(Bucket=name)["Contents"]:
        client.delete_object(Bucket=name, Key=key["Key"])
    client.delete_bucket(Bucket=name)
    with pytest.raises(SourceUnavailable):
        crawl()
    assert set(rows()) == remaining  # a vanished bucket deletes nothing


def test_object_tags_become_labels_with_one_tagging_request_per_changed_object_only_when_asked(
        owner_engine, worker_engine, unique, endpoint, client, proxy):
    name = f"kdbl-tags-{unique}"
    client.create_bucket(Bucket=name)
    client.put_object(Bucket=name, Key="tagged.md", Body=b"# Tagged\n\nfinance memo", Tagging="dept=finance&draft=")
    client.put_object(Bucket=name, Key="plain.md", Body=b"# Plain\n\nno tags here")
    tenant = admin.create_tenant(db_of(owner_engine), f"s3tags-{unique}")
    cfg = {"bucket": name, "endpoint_url": proxy.url, "region": "us-east-1", "credentials": {"env": ENV},
           "labels": ["s3"]}
    tagged_source = admin.add_source(db_of(owner_engine), tenant.name, protocol="s3",
                                     config={**cfg, "object_tags": True}, name=f"tags-{unique}")
    plain_source = admin.add_source(db_of(owner_engine), tenant.name, protocol="s3", config=cfg,
                                    name=f"notags-{unique}")
    indexer = Indexer(db_of(worker_engine), Settings())

    def crawl(source) -> dict[str, list[str]]:
        [row] = load_sources(db_of(worker_engine), source_id=source.id)
        indexer.crawl(row)
        with owner_engine.connect() as conn:
            return {r.key: list(r.labels) for r in conn.execute(
                text("SELECT key, labels FROM files WHERE source_id = :s"), {"s": source.id})}

    def tagging_requests() -> int:
        return len([p for _, p, _ in proxy.requests("GET") if "tagging" in p])

    assert crawl(plain_source) == {"tagged.md": ["s3"], "plain.md": ["s3"]}
    assert tagging_requests() == 0  # off by default: no request at all
    assert crawl(tagged_source) == {"tagged.md": ["s3", "dept=finance", "draft"], "plain.md": ["s3"]}
    assert tagging_requests() == 2  # one per changed object
    crawl(tagged_source)
    assert tagging_requests() == 2  # unchanged objects: none
    # the tags are kept apart (files.own_labels): a label config change keeps them without reading the bucket
    admin.update_source_labels(db_of(owner_engine), tagged_source.id, labels=["bucket"])
    with owner_engine.connect() as conn:
        relabelled = {r.key: (list(r.labels), list(r.own_labels)) for r in conn.execute(
            text("SELECT key, labels, own_labels FROM files WHERE source_id = :s"), {"s": tagged_source.id})}
    assert relabelled == {"tagged.md": (["bucket", "dept=finance", "draft"], ["dept=finance", "draft"]),
                          "plain.md": (["bucket"], [])}
    assert tagging_requests() == 2
