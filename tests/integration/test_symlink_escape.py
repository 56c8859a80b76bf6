"""Symbolic links out of a source's root are never read (issue 27 §2): listing, reading, the extraction child.

A hostile share (links to /etc/passwd, to the worker's data folder, into another tenant's restricted folder)
is probed through the real MCP search, read and download path: nothing behind a link is returned and each
link is in the run's problems with its reason. The connector's own cases: file and folder links out, a chain
ending outside, a relative `..` link, a link inside (followed only when the source says so), a file swapped
for a link after the listing, and a file flipping between the two while it is opened.
"""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path

import httpx
import pytest
from mcp.shared.exceptions import MCPError
from helpers import Corpus, crawl, db_of, grants_world, mcp_client, running_api, running_fetch
from sqlalchemy import text

from kdbl_control import admin
from kdbl_core.settings import Settings
from kdbl_worker import sandbox
from kdbl_worker.connectors import OutsideSource, SourceUnavailable, connector_for, refuse_paths
from kdbl_worker.connectors.fs import FsConnector

OUTSIDE = "okapi outside the root: must never be indexed"
INSIDE = "okapi inside the root"
FETCH_TOKEN = "fetch-token-" + "h" * 40
SIGNING = "g" * 48
PUBLIC = "http://public.example:8443"


@pytest.fixture
def tree(tmp_path) -> Path:
    """root/ (the source) beside outside/ (a folder the source must not reach)."""
    (tmp_path / "outside" / "folder").mkdir(parents=True)
    (tmp_path / "outside" / "secret.txt").write_text(OUTSIDE)
    (tmp_path / "outside" / "folder" / "inner.txt").write_text(OUTSIDE)
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text(INSIDE)
    (root / "sub" / "b.txt").write_text(INSIDE)
    return root


def _walk(root: Path, **options) -> tuple[dict[str, int], dict[str, str]]:
    connector = FsConnector(root, **options)
    files = {f.key: f.size for f in connector.walk()}
    return files, dict(connector.problems.items)


def _read(connector: FsConnector, key: str) -> bytes:
    with connector.open(key) as stream:
        return stream.read()


@pytest.mark.parametrize("follow", [False, True])
def test_a_file_symlink_out_of_the_root_is_skipped_with_its_reason(tree, follow):
    (tree / "link-passwd.txt").symlink_to("/etc/passwd")
    (tree / "abs.txt").symlink_to(tree.parent / "outside" / "secret.txt")
    files, problems = _walk(tree, follow_symlinks=follow)
    assert set(files) == {"a.txt", "sub/b.txt"}
    why = "leaves the source root" if follow else "not followed"
    for key in ("link-passwd.txt", "abs.txt"):
        assert why in problems[key] and problems[key].endswith("skipped")
        with pytest.raises(OutsideSource, match=why):
            _read(FsConnector(tree, follow_symlinks=follow), key)


@pytest.mark.parametrize("follow", [False, True])
def test_a_directory_symlink_out_of_the_root_is_not_walked(tree, follow):
    (tree / "elsewhere").symlink_to(tree.parent / "outside", target_is_directory=True)
    files, problems = _walk(tree, follow_symlinks=follow)
    assert not any(k.startswith("elsewhere") for k in files)
    assert "elsewhere" in problems
    with pytest.raises(OutsideSource):
        _read(FsConnector(tree, follow_symlinks=follow), "elsewhere/secret.txt")


def test_a_symlink_chain_that_ends_outside_the_root_is_skipped(tree):
    (tree / "one.txt").symlink_to("two.txt")
    (tree / "two.txt").symlink_to("sub/three.txt")
    (tree / "sub" / "three.txt").symlink_to(tree.parent / "outside" / "secret.txt")
    files, problems = _walk(tree, follow_symlinks=True)
    assert set(files) == {"a.txt", "sub/b.txt"}
    assert {k for k, why in problems.items() if "leaves the source root" in why} == {
        "one.txt", "two.txt", "sub/three.txt"}
    with pytest.raises(OutsideSource, match="leaves the source root"):
        _read(FsConnector(tree, follow_symlinks=True), "one.txt")


def test_a_relative_dotdot_link_that_climbs_out_is_skipped_and_one_that_stays_in_is_followed(tree):
    (tree / "sub" / "up.txt").symlink_to("../../outside/secret.txt")
    (tree / "sub" / "detour.txt").symlink_to("../sub/../a.txt")  # climbs, but never above the root
    (tree / "sub" / "updir").symlink_to("../..", target_is_directory=True)
    files, problems = _walk(tree, follow_symlinks=True)
    assert set(files) == {"a.txt", "sub/b.txt", "sub/detour.txt"}
    assert "leaves the source root" in problems["sub/up.txt"]
    assert "leaves the source root" in problems["sub/updir"]
    connector = FsConnector(tree, follow_symlinks=True)
    assert _read(connector, "sub/detour.txt") == INSIDE.encode()
    for key in ("sub/up.txt", "sub/updir/outside/secret.txt"):
        with pytest.raises(OutsideSource):
            _read(connector, key)


def test_a_symlink_inside_the_root_is_followed_only_when_the_source_allows_it(tree):
    (tree / "alias.txt").symlink_to("a.txt")
    (tree / "absolute.txt").symlink_to(tree / "sub" / "b.txt")
    (tree / "shortcut").symlink_to("sub", target_is_directory=True)
    (tree / "loop").symlink_to(".", target_is_directory=True)
    files, problems = _walk(tree)  # the default: follow nothing
    assert set(files) == {"a.txt", "sub/b.txt"}
    assert all("not followed" in problems[k] for k in ("alias.txt", "absolute.txt", "shortcut", "loop"))
    assert connector_for("fs", {"root": str(tree)}).follow_symlinks is False
    followed, problems = _walk(tree, follow_symlinks=True)
    assert set(followed) == {"a.txt", "sub/b.txt", "alias.txt", "absolute.txt"}
    # a folder link inside the root names a folder listed under its own path: not listed twice
    assert "listed already" in problems["shortcut"] and "loop" in problems["loop"]
    connector = connector_for("fs", {"root": str(tree), "follow_symlinks": True})
    assert _read(connector, "shortcut/b.txt") == _read(connector, "alias.txt") == INSIDE.encode()


def test_a_file_swapped_for_a_symlink_after_the_listing_is_refused_at_the_open(tree):
    connector = FsConnector(tree, follow_symlinks=True)
    assert set(f.key for f in connector.walk()) == {"a.txt", "sub/b.txt"}
    (tree / "a.txt").unlink()
    (tree / "a.txt").symlink_to(tree.parent / "outside" / "secret.txt")
    (tree / "sub").rename(tree / "sub-was")  # a folder on the way swapped for a link out
    (tree / "sub").symlink_to(tree.parent / "outside" / "folder", target_is_directory=True)
    (tree.parent / "outside" / "folder" / "b.txt").write_text(OUTSIDE)
    for key in ("a.txt", "sub/b.txt"):
        with pytest.raises(OutsideSource, match="leaves the source root"):
            _read(connector, key)


def test_the_extraction_child_refuses_a_file_that_became_a_link_after_its_task_was_made(tree):
    connector = FsConnector(tree)
    task = sandbox.Task("a", "a.txt", len(INSIDE), opener=connector.opener("a.txt"))
    (tree / "a.txt").unlink()
    (tree / "a.txt").symlink_to(tree.parent / "outside" / "secret.txt")
    box = sandbox.Sandbox(processes=1)
    try:
        [(_, outcome)] = list(box.run([task]))
    finally:
        box.close()
    assert outcome.status == "failed" and "symbolic link" in outcome.reason
    assert not any(OUTSIDE in chunk[1] for chunk in outcome.chunks)


def test_a_file_flipping_between_a_file_and_a_symlink_never_yields_the_outside_bytes(tree):
    """The race the open must win: another process renames a link and a file over one name, again and
    again, while the connector opens it. Every open gives the inside bytes or a refusal."""
    link, plain, name = tree / ".link", tree / ".plain", tree / "flip.txt"
    name.write_text(INSIDE)
    done = threading.Event()

    def flip() -> None:
        while not done.is_set():
            link.symlink_to(tree.parent / "outside" / "secret.txt")
            os.replace(link, name)
            plain.write_text(INSIDE)
            os.replace(plain, name)

    flipper = threading.Thread(target=flip)
    flipper.start()
    outcomes = {"inside": 0, "refused": 0}
    connector = FsConnector(tree, follow_symlinks=True)
    try:
        for _ in range(3000):
            try:
                data = _read(connector, "flip.txt")
            except (OutsideSource, FileNotFoundError):
                outcomes["refused"] += 1
                continue
            assert data == INSIDE.encode()
            outcomes["inside"] += 1
    finally:
        done.set()
        flipper.join(timeout=30)
    assert outcomes["inside"] and outcomes["refused"]  # both sides of the race were met


def test_the_workers_private_folder_is_never_read_through_a_link_a_hard_link_or_a_root_around_it(tmp_path):
    share = tmp_path / "share"
    share.mkdir()
    (share / "ok.txt").write_text(INSIDE)
    data = share / ".kdbl"  # `kdbl-control up .` with the default data folder inside the crawled one
    data.mkdir()
    (data / "pg-password").write_text("pg-superuser-password-" + uuid.uuid4().hex)
    os.link(data / "pg-password", share / "hard.txt")
    (share / "soft.txt").symlink_to(".kdbl/pg-password")
    refuse_paths(data)
    files, problems = _walk(share, follow_symlinks=True)
    assert set(files) == {"ok.txt"}
    assert "private data" in problems[".kdbl"] and "private data" in problems["hard.txt"]
    assert "private data" in problems["soft.txt"]
    with pytest.raises(OutsideSource, match="private data"):
        _read(FsConnector(share), "hard.txt")
    with pytest.raises(SourceUnavailable, match="private data"):
        FsConnector(data).check()


# -- the hostile share, through MCP search, read and download ---------------------------------------------


@pytest.fixture
def hostile(owner_engine, worker_engine, owner_url, tmp_path):
    """Tenant alpha (grants_world: an open source, a restricted one) and tenant hostile, whose share holds
    a file of its own and links to /etc/passwd, to a data folder's secrets and into alpha's restricted
    folder; the hostile source follows links (inside its root), the most it can be allowed."""
    world = grants_world(owner_engine, worker_engine, tmp_path / "alpha", prefix="alpha",
                         open_files={"open.txt": "okapi alpha open notes"},
                         restricted={"plan.txt": "okapi alpha restricted merger plan zanzibar"},
                         granted="plan.txt", other={"x.txt": "okapi other tenant"})
    data = tmp_path / "data-dir"
    data.mkdir()
    password = "pgpass" + uuid.uuid4().hex
    (data / "pg-password").write_text(password + "\n")
    (data / "secrets.json").write_text('{"download_signing_secret": "signsecret%s"}' % uuid.uuid4().hex)
    refuse_paths(data)
    share = tmp_path / "hostile-share"
    share.mkdir()
    (share / "mine.txt").write_text("okapi hostile own notes")
    (share / "link-passwd.txt").symlink_to("/etc/passwd")
    (share / "link-pgpass.txt").symlink_to(data / "pg-password")
    (share / "link-secrets.json").symlink_to(data / "secrets.json")
    (share / "alpha-restricted").symlink_to(tmp_path / "alpha" / "r", target_is_directory=True)
    (share / "chain.txt").symlink_to("link-passwd.txt")
    name = f"hostile-{uuid.uuid4().hex[:8]}"
    tenant = admin.create_tenant(db_of(owner_engine), name)
    source = admin.add_source(db_of(owner_engine), name, protocol="fs", name="share", hybrid=False,
                              config={"root": str(share), "follow_symlinks": True})
    stats = crawl(worker_engine, Corpus(name, tenant.id, source.id, share))
    token = admin.create_token(db_of(owner_engine), tenant_name=name, name="agent")[0]
    with running_fetch(worker_engine, FETCH_TOKEN) as fetch_url:
        settings = Settings(mcp_enabled=True, download_signing_secret=SIGNING, internal_fetch_token=FETCH_TOKEN,
                            worker_fetch_url=fetch_url, api_public_url=PUBLIC)
        with running_api(owner_url, settings) as url:
            yield {"url": url, "token": token, "stats": stats, "source_id": source.id, "share": share,
                   "password": password, "fetch": fetch_url, "alpha": world}


LINKS = ("link-passwd.txt", "link-pgpass.txt", "link-secrets.json", "alpha-restricted", "chain.txt")


async def test_a_hostile_share_reaches_nothing_behind_its_links_through_search_read_or_download(
        hostile, owner_engine):
    problems = dict(hostile["stats"].problems)
    for link in LINKS:
        assert problems[link] == "symbolic link leaves the source root; skipped", link
    with owner_engine.connect() as conn:
        keys = set(conn.execute(text("SELECT key FROM files WHERE source_id = :s"),
                                {"s": hostile["source_id"]}).scalars())
    assert keys == {"mine.txt"}
    async with mcp_client(hostile["url"], hostile["token"]) as client:
        for query in ("root bin bash nologin daemon", hostile["password"], "signsecret download_signing_secret",
                      "zanzibar merger plan", "okapi"):
            result = await client.call_tool("search_content", {"query": query, "mode": "lexical"})
            hits = result.structured_content["hits"]
            assert {h["key"] for h in hits} <= {"mine.txt"}, query
            text_of_hits = " ".join(h.get("snippet") or "" for h in hits)
            assert "root:" not in text_of_hits and "zanzibar" not in text_of_hits
        mine = (await client.call_tool("search_content", {"query": "hostile own notes"})).structured_content["hits"]
        for key in ("link-passwd.txt", "link-pgpass.txt", "alpha-restricted/plan.txt"):
            with pytest.raises(MCPError, match="no file") as refused:
                await client.call_tool("get_file_text", {"source_id": str(hostile["source_id"]), "key": key})
            assert "zanzibar" not in str(refused.value) and "root:" not in str(refused.value)
    assert mine and mine[0]["url"]
    async with httpx.AsyncClient() as http:
        ok = await http.get(mine[0]["url"].replace(PUBLIC, hostile["url"]))
        # the fetch endpoint serves only indexed keys, and opens those beneath the root: a link key is 404
        direct = await http.get(f"{hostile['fetch']}/internal/files",
                                params={"source_id": str(hostile["source_id"]), "key": "link-passwd.txt"},
                                headers={"Authorization": f"Bearer {FETCH_TOKEN}"})
    assert ok.status_code == 200 and ok.content == b"okapi hostile own notes"
    assert direct.status_code == 404 and b"root:" not in direct.content


async def test_a_hostile_file_swapped_for_a_link_after_indexing_is_refused_by_the_download(hostile):
    async with mcp_client(hostile["url"], hostile["token"]) as client:
        [hit] = (await client.call_tool("search_content", {"query": "hostile own notes"})).structured_content["hits"]
    mine = hostile["share"] / "mine.txt"
    mine.unlink()
    mine.symlink_to("/etc/passwd")  # the stored key now names a link out of the root
    async with httpx.AsyncClient() as http:
        resp = await http.get(hit["url"].replace(PUBLIC, hostile["url"]))
    assert resp.status_code == 404 and b"root:" not in resp.content


# -- the option, as each writer stores it -----------------------------------------------------------------


def test_follow_symlinks_is_an_fs_option_the_cli_and_the_operator_store_only_when_on(tmp_path):
    from kdbl_control.cli import build_parser
    from kdbl_control.cli_source import source_config
    from kdbl_core.errors import InvalidArgument
    from kdbl_core.sources import build, parse
    from kdbl_operator.desired import source as desired_source

    assert build("fs", root="/srv/a").stored == {"root": "/srv/a"}
    assert build("fs", root="/srv/a", follow_symlinks=False).stored == {"root": "/srv/a"}
    assert parse("fs", build("fs", root="/srv/a", follow_symlinks=True).stored).follow_symlinks is True
    with pytest.raises(InvalidArgument) as err:
        build("webdav", url="http://dav.example/x/", follow_symlinks=True)
    assert err.value.field == "follow_symlinks"
    with pytest.raises(InvalidArgument):
        parse("fs", {"root": "/srv/a", "follow_symlinks": "yes"})
    args = ["source", "add", "--tenant", "t", "--protocol", "fs", "--path", str(tmp_path)]
    assert source_config(build_parser().parse_args(args)) == {"root": str(tmp_path)}
    assert source_config(build_parser().parse_args([*args, "--follow-symlinks"])) == {
        "root": str(tmp_path), "follow_symlinks": True}
    body = {"metadata": {"name": "docs", "namespace": "ns"},
            "spec": {"tenantRef": {"name": "t"}, "protocol": "fs", "connection": {"path": "/mnt/docs"}}}
    assert "follow_symlinks" not in desired_source(body).config
    body["spec"]["followSymlinks"] = True
    assert desired_source(body).config["follow_symlinks"] is True
