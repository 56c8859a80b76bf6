"""Permissions from the share (issue 30) on a real folder: owners, groups, bits, a POSIX ACL, a folder without
`x`, a file its owner may not read. Row-level security must give each principal exactly the files the share
lets it read — through files, search, scores' statistics and the MCP tools — and follow the share's changes at
the next crawl without reading unchanged files again."""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from helpers import POSTINGS, Corpus, bm25_reference, crawl, db_of, mcp_client, running_api
from sqlalchemy import text

from mcp.shared.exceptions import MCPError

from kdbl_control import admin, grant_explain
from kdbl_core.access.principal import Principal, rls_transaction
from kdbl_core.search import bm25_topk, lexical

ALICE, BOB, CAROL, DAVE = 5201, 5202, 5203, 5204
ENG, OPS = 6201, 6202
MAP = {"uid:5201": "user:alice", "uid:5202": "user:bob", "uid:5203": "user:carol", "uid:5204": "user:dave",
       "gid:6201": "group:eng", "gid:6202": "group:ops"}
GROUPS = {"alice": ["eng"], "bob": ["eng", "ops"], "carol": [], "dave": ["ops"], "zed": []}

# key -> (owner, group, mode, text); folders below
FILES = {
    "alice/notes.txt": (ALICE, ENG, 0o600, "quarterly notes alpha private to alice"),
    "eng/design.txt": (BOB, ENG, 0o640, "quarterly design bravo for engineering"),
    "public/readme.txt": (BOB, OPS, 0o644, "quarterly readme charlie for everyone"),
    "locked/open.txt": (CAROL, OPS, 0o644, "quarterly file delta behind a folder without x"),
    "acl/shared.txt": (CAROL, OPS, 0o640, "quarterly shared echo with an acl for dave"),
    "deny/owner.txt": (ALICE, ENG, 0o044, "quarterly note foxtrot its owner may not read"),
}
FOLDERS = {"alice": (ALICE, ENG, 0o700), "eng": (BOB, ENG, 0o750), "public": (BOB, OPS, 0o755),
           "locked": (0, 0, 0o700), "acl": (CAROL, OPS, 0o755), "deny": (ALICE, ENG, 0o755)}
EXPECTED = {
    "alice": {"alice/notes.txt", "eng/design.txt", "public/readme.txt"},
    "bob": {"eng/design.txt", "public/readme.txt", "acl/shared.txt", "deny/owner.txt"},
    "carol": {"public/readme.txt", "acl/shared.txt", "deny/owner.txt"},
    "dave": {"public/readme.txt", "acl/shared.txt", "deny/owner.txt"},
    "zed": {"public/readme.txt", "deny/owner.txt"},
}


def _acl(entries: list[tuple[int, int, int | None]]) -> bytes:
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, 0xFFFFFFFF if i is None else i)
                                           for tag, perm, i in entries)


@pytest.fixture(scope="module")
def share(owner_engine, worker_engine):
    root = Path(tempfile.mkdtemp(prefix="kdbl-share-"))
    for folder, (uid, gid, mode) in FOLDERS.items():
        (root / folder).mkdir()
    for key, (uid, gid, mode, body) in FILES.items():
        path = root / key
        path.write_text(body)
        os.chown(path, uid, gid)
        path.chmod(mode)
    for folder, (uid, gid, mode) in FOLDERS.items():
        os.chown(root / folder, uid, gid)
        (root / folder).chmod(mode)
    # acl/shared.txt: owner rw, dave r (a named user), owning group r, mask r, other nothing
    os.setxattr(root / "acl/shared.txt", "system.posix_acl_access",
                _acl([(0x01, 6, None), (0x02, 4, DAVE), (0x04, 4, None), (0x10, 4, None), (0x20, 0, None)]))
    tenant = f"share-{uuid.uuid4().hex[:10]}"
    db = db_of(owner_engine)
    t = admin.create_tenant(db, tenant)
    s = admin.add_source(db, tenant, protocol="fs", config={"root": str(root)}, name="share",
                         permissions="from-source", permission_map=MAP)
    corpus = Corpus(tenant, t.id, s.id, root)
    crawl(worker_engine, corpus)
    yield corpus
    shutil.rmtree(root)


def _partitions_exact(engine, source_id) -> int:
    """The keyword index of the source is cut by permission set exactly as its files are (migration 0024):
    statistics and packed postings (less the dead, plus postings rows) of each partition are those of the
    chunks of the files with that set. The number of partitions."""
    set_of = "coalesce(f.permission_set, 0)"
    with engine.begin() as conn:
        def rows(sql: str) -> set:
            return {tuple(r) for r in conn.execute(text(sql), {"s": source_id})}
        truth = rows(f"SELECT {set_of}, p.term, p.chunk_id FROM {POSTINGS} p JOIN files f ON f.id = p.file_id "
                     "WHERE p.source_id = :s")
        indexed = rows("SELECT l.permission_set, l.term, u.chunk_id FROM bm25_lists l "
                       "CROSS JOIN LATERAL kdbl_bm25_unpack(l.list) AS u WHERE l.source_id = :s "
                       "AND u.chunk_id NOT IN (SELECT d.chunk_id FROM bm25_dead d WHERE d.source_id = :s) "
                       f"UNION ALL SELECT {set_of}, p.term, p.chunk_id FROM postings p JOIN files f ON f.id = p.file_id "
                       "WHERE p.source_id = :s")
        assert indexed == truth
        dfs = rows("SELECT permission_set, term, sum(df) FROM term_stats WHERE source_id = :s "
                   "GROUP BY 1, 2 HAVING sum(df) <> 0")
        assert dfs == rows(f"SELECT {set_of}, p.term, count(*) FROM {POSTINGS} p JOIN files f ON f.id = p.file_id "
                           "WHERE p.source_id = :s GROUP BY 1, 2")
        corpus = rows("SELECT permission_set, sum(n_chunks), sum(total_len) FROM corpus_stats WHERE source_id = :s "
                      "GROUP BY 1 HAVING sum(n_chunks) <> 0")
        assert corpus == rows(f"SELECT {set_of}, count(*), sum(c.token_count) FROM chunks c "
                              "JOIN files f ON f.id = c.file_id WHERE c.source_id = :s GROUP BY 1")
    return len(corpus)


async def _seen(api_pool, corpus: Corpus, user: str, query: str = "quarterly") -> tuple[set, dict, dict]:
    """Files, search hits (key -> score) and the visible postings, as `user` under row-level security."""
    principal = Principal(tenant_id=corpus.tenant_id, tenant_name=corpus.tenant, subject=f"user:{user}",
                          groups=tuple(GROUPS[user]))
    async with rls_transaction(api_pool, principal) as conn:
        files = {r.key for r in await (await conn.execute("SELECT key FROM files")).fetchall()}
        hits = await bm25_topk.search(conn, query, lexical.Filters(), limit=50, ts_config="english")
        postings: dict[str, dict[str, tuple[int, int]]] = {}
        for row in await (await conn.execute(
                f"SELECT f.key, p.term, p.tf, p.dl FROM {POSTINGS} p JOIN files f ON f.id = p.file_id")).fetchall():
            postings.setdefault(row.key, {})[row.term] = (row.tf, row.dl)
        qterms = await lexical.query_terms(conn, query, "english")
    return files, {h.key: h.score for h in hits}, bm25_reference(postings, qterms) if postings else {}


@pytest.mark.parametrize("user", sorted(EXPECTED))
async def test_each_principal_reads_exactly_what_the_share_lets_it(share, api_pool, owner_engine, user) -> None:
    files, hits, reference = await _seen(api_pool, share, user)
    assert _partitions_exact(owner_engine, share.source_id) >= 5  # one partition per distinct permission
    assert files == EXPECTED[user]
    assert set(hits) == EXPECTED[user]
    # the statistics are those of what the caller reads: scores equal BM25 over its files alone
    assert hits == pytest.approx(reference, rel=1e-9)


async def test_the_index_partitions_a_principal_reads_hold_only_its_files(share, api_pool, owner_engine,
                                                                         owner_url) -> None:
    """The keyword index is read in partitions (migration 0024): each principal's visible lists, statistics and
    chunk counts are those of exactly its files, before and after a full build of the lists."""
    from kdbl_core.content import bm25_lists
    from kdbl_core.db.connect import sync_pool

    for built in (False, True):
        if built:
            with sync_pool(owner_url, size=1) as pool, pool.connection() as conn:
                assert bm25_lists.build(conn, share.tenant_id)["kind"] == "full"
            _partitions_exact(owner_engine, share.source_id)
        for user, allowed in EXPECTED.items():
            principal = Principal(tenant_id=share.tenant_id, tenant_name=share.tenant, subject=f"user:{user}",
                                  groups=tuple(GROUPS[user]))
            async with rls_transaction(api_pool, principal) as conn:
                listed = {r.key for r in await (await conn.execute(
                    "SELECT DISTINCT f.key FROM bm25_lists l CROSS JOIN LATERAL kdbl_bm25_unpack(l.list) AS u "
                    "JOIN chunks c ON c.id = u.chunk_id JOIN files f ON f.id = c.file_id")).fetchall()}
                [[hidden]] = await (await conn.execute(
                    "SELECT count(*) FROM bm25_lists l CROSS JOIN LATERAL kdbl_bm25_unpack(l.list) AS u "
                    "WHERE u.chunk_id NOT IN (SELECT id FROM chunks) "
                    "AND u.chunk_id NOT IN (SELECT chunk_id FROM bm25_dead)")).fetchall()
                [[n, length]] = await (await conn.execute(
                    "SELECT sum(n_chunks), sum(total_len) FROM corpus_stats")).fetchall()
                [[n_true, length_true]] = await (await conn.execute(
                    "SELECT count(*), sum(token_count) FROM chunks")).fetchall()
            assert listed == allowed and hidden == 0, (user, built)
            assert (n, length) == (n_true, length_true), (user, built)


async def test_every_word_of_a_hidden_file_stays_hidden(share, api_pool) -> None:
    """The leak probe: each file's distinctive word, searched by every principal, finds it only for those
    the share lets read it (6 files x 5 principals)."""
    checks = 0
    for key, (*_, body) in FILES.items():
        word = body.split()[2]
        for user, allowed in EXPECTED.items():
            files, hits, _ = await _seen(api_pool, share, user, word)
            assert (key in hits) == (key in allowed), (user, key, word)
            assert set(hits) <= allowed and files == allowed
            checks += 1
    assert checks == 30


def test_the_source_rows_say_where_permissions_come_from(share, owner_engine) -> None:
    with owner_engine.begin() as conn:
        rows = conn.execute(text(
            "SELECT count(*) AS files, count(DISTINCT permission_set) AS sets, count(permission_set) AS with_set "
            "FROM files WHERE source_id = :s"), {"s": share.source_id}).one()
    assert rows.files == 6 and rows.with_set == 6 and rows.sets == 6
    [listed] = [s for s in admin.list_sources(db_of(owner_engine), share.tenant) if s["id"] == share.source_id]
    assert listed["acl_mode"] == "source"


def test_grant_explain_names_what_decides(share, owner_engine) -> None:
    db = db_of(owner_engine)
    yes = grant_explain.explain(db, share.source_id, "acl/shared.txt", "dave", ["ops"])
    assert yes["readable"] and yes["permissions"] == "from-source"
    assert any(c["decided_by"] == "allow user:dave" for c in yes["share"]["checks"])
    no = grant_explain.explain(db, share.source_id, "deny/owner.txt", "user:alice", ["eng"])
    assert not no["readable"] and any(c["decided_by"] == "deny user:alice" for c in no["share"]["checks"])
    text_out = grant_explain.render(no)
    assert "NOT readable" in text_out and "deny user:alice" in text_out
    # a grant adds to the share's permissions, and explain says so
    grant = admin.add_grant(db, source_id=share.source_id, subject="user:alice", file_key="deny/owner.txt")
    try:
        granted = grant_explain.explain(db, share.source_id, "deny/owner.txt", "alice", [])
        assert granted["readable"] and any(f"grant {grant.id}" in r for r in granted["because"])
    finally:
        admin.revoke_grant(db, grant.id)


async def test_a_permission_change_reaches_results_at_the_next_crawl_without_reading_the_file(
        share, api_pool, worker_engine, owner_engine) -> None:
    path = share.root / "eng/design.txt"
    with owner_engine.begin() as conn:
        before = conn.execute(text("SELECT index_runs, permission_set FROM files WHERE source_id = :s AND key = :k"),
                              {"s": share.source_id, "k": "eng/design.txt"}).one()
    path.chmod(0o644)
    (share.root / "eng").chmod(0o755)
    try:
        started = time.monotonic()
        stats = crawl(worker_engine, share)
        files, hits, _ = await _seen(api_pool, share, "carol")
        print(f"permission change to effect: {time.monotonic() - started:.2f} s (one crawl of 6 files)")
        assert "eng/design.txt" in files and "eng/design.txt" in hits
        assert stats.indexed == 0 and stats.unchanged == 6  # nothing extracted again
        with owner_engine.begin() as conn:
            after = conn.execute(text("SELECT index_runs, permission_set FROM files "
                                      "WHERE source_id = :s AND key = :k"),
                                 {"s": share.source_id, "k": "eng/design.txt"}).one()
            [change] = conn.execute(text("SELECT file_key, before_set, after_set, job_id FROM permission_changes "
                                         "WHERE source_id = :s AND file_key = 'eng/design.txt' "
                                         "ORDER BY id DESC LIMIT 1"), {"s": share.source_id}).all()
        assert after.index_runs == before.index_runs and after.permission_set != before.permission_set
        _partitions_exact(owner_engine, share.source_id)  # its chunks moved to the new set's partition
        assert (change.before_set, change.after_set) == (before.permission_set, after.permission_set)
    finally:
        path.chmod(0o640)
        (share.root / "eng").chmod(0o750)
        crawl(worker_engine, share)
    files, _, _ = await _seen(api_pool, share, "carol")
    assert files == EXPECTED["carol"]
    _partitions_exact(owner_engine, share.source_id)


async def test_a_removed_file_is_gone_for_everyone_after_one_crawl(share, api_pool, worker_engine) -> None:
    path = share.root / "public/readme.txt"
    saved = path.read_bytes(), path.stat()
    path.unlink()
    try:
        crawl(worker_engine, share)
        for user in EXPECTED:
            files, hits, _ = await _seen(api_pool, share, user)
            assert "public/readme.txt" not in files | set(hits)
    finally:
        path.write_bytes(saved[0])
        os.chown(path, saved[1].st_uid, saved[1].st_gid)
        path.chmod(0o644)
        crawl(worker_engine, share)


async def test_the_mcp_tools_answer_each_token_with_its_own_files(share, owner_engine, owner_url) -> None:
    db = db_of(owner_engine)
    tokens = {user: admin.create_token(db, tenant_name=share.tenant, name=f"t-{user}", subject=f"user:{user}",
                                       groups=GROUPS[user])[0] for user in ("alice", "dave")}
    with running_api(owner_url) as url:
        for user, token in tokens.items():
            async with mcp_client(url, token) as client:
                found = (await client.call_tool("search_content", {"query": "quarterly", "mode": "lexical",
                                                                   "limit": 20})).structured_content
                keys = {h["key"] for h in found["hits"]}
                assert keys == EXPECTED[user]
                listed = (await client.call_tool("list_sources", {})).structured_content
                [mine] = [x for x in listed["sources"] if x["source_id"] == str(share.source_id)]
                assert mine["file_count"] == len(EXPECTED[user])  # the files it reads, no more
                hidden = sorted(set(FILES) - EXPECTED[user])[0]
                errors = []
                for key in (hidden, "no/such-file.txt"):  # a hidden file answers as one that does not exist
                    with pytest.raises(MCPError) as err:
                        await client.call_tool("get_file_text", {"source_id": str(share.source_id), "key": key})
                    errors.append((err.value.code, err.value.message.replace(key, "KEY")))
                assert errors[0] == errors[1] and errors[0][0] == -32602


def test_leaving_from_source_closes_the_files_to_all_but_grants(owner_engine, worker_engine, tmp_path) -> None:
    root = tmp_path / "s"
    root.mkdir()
    (root / "a.txt").write_text("quarterly golf")
    db = db_of(owner_engine)
    tenant = f"share-sw-{uuid.uuid4().hex[:8]}"
    t = admin.create_tenant(db, tenant)
    s = admin.add_source(db, tenant, protocol="fs", config={"root": str(root)}, name="s",
                         permissions="from-source")
    crawl(worker_engine, Corpus(tenant, t.id, s.id, root))
    done = admin.set_source_permissions(db, s.id, "grants")
    assert done["files_cleared"] == 1 and done["acl_mode"] == "restricted"
    assert _partitions_exact(owner_engine, s.id) == 1  # back in partition 0 with the source's other files
    with owner_engine.begin() as conn:
        assert conn.execute(text("SELECT count(permission_set) FROM files WHERE source_id = :s"),
                            {"s": s.id}).scalar() == 0
    again = admin.set_source_permissions(db, s.id, "from-source")
    assert again["note"] and "next crawl" in again["note"]
    with owner_engine.begin() as conn:
        assert conn.execute(text("SELECT count(permission_set) FROM files WHERE source_id = :s"),
                            {"s": s.id}).scalar() == 0


async def test_a_cached_result_never_outlives_a_permission_revoked_on_the_share(share, owner_engine, owner_url,
                                                                               worker_engine) -> None:
    """The result cache is keyed by the index state: a permission taken away at a crawl moves it, so the
    same call by the same principal is searched again and no longer finds the file."""
    token = admin.create_token(db_of(owner_engine), tenant_name=share.tenant, name="t-cache", subject="user:alice",
                               groups=["eng"])[0]
    path = share.root / "eng/design.txt"
    call = {"query": "bravo design", "mode": "lexical"}
    with running_api(owner_url) as url:
        async with mcp_client(url, token) as client:
            for _ in range(2):  # the second is a cache hit
                hits = (await client.call_tool("search_content", call)).structured_content["hits"]
                assert [h["key"] for h in hits] == ["eng/design.txt"]
            path.chmod(0o600)  # bob alone
            try:
                crawl(worker_engine, share)
                hits = (await client.call_tool("search_content", call)).structured_content["hits"]
                assert hits == []
            finally:
                path.chmod(0o640)
                crawl(worker_engine, share)
            hits = (await client.call_tool("search_content", call)).structured_content["hits"]
            assert [h["key"] for h in hits] == ["eng/design.txt"]


async def test_a_source_whose_files_a_principal_cannot_read_does_not_exist_for_it(
        owner_engine, worker_engine, api_pool) -> None:
    root = Path(tempfile.mkdtemp(prefix="kdbl-share-hidden-"))
    try:
        (root / "mine.txt").write_text("quarterly hotel")
        os.chown(root / "mine.txt", ALICE, ENG)
        (root / "mine.txt").chmod(0o600)
        db = db_of(owner_engine)
        tenant = f"share-hid-{uuid.uuid4().hex[:8]}"
        t = admin.create_tenant(db, tenant)
        s = admin.add_source(db, tenant, protocol="fs", config={"root": str(root)}, name="hidden",
                             permissions="from-source", permission_map=MAP)
        crawl(worker_engine, Corpus(tenant, t.id, s.id, root))
        for user, sees in (("alice", True), ("zed", False)):
            principal = Principal(tenant_id=t.id, tenant_name=tenant, subject=f"user:{user}")
            async with rls_transaction(api_pool, principal) as conn:
                ids = {r.id for r in await (await conn.execute("SELECT id FROM sources")).fetchall()}
            assert (s.id in ids) == sees, user
    finally:
        shutil.rmtree(root)
