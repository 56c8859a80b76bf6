"""The worker's side of tenant policy (tenants.settings): a disabled tenant is not crawled until it is
enabled again, and quotas stop a crawl from adding files, say so, and lose nothing already indexed."""

from __future__ import annotations

import json
import threading

import pytest
from helpers import Corpus, crawl, db_of, make_corpus
from sqlalchemy import text
from test_queue import corpus_files, job_state

from kdbl_control import admin
from kdbl_core.settings import Settings
from kdbl_worker import jobs
from kdbl_worker.pipeline import Indexer, QuotaExceeded, load_sources
from kdbl_worker.queue import QueueOptions, QueueRunner


def _settings(owner_engine, tenant: str, **values) -> None:
    with owner_engine.begin() as conn:
        conn.execute(text("UPDATE tenants SET settings = settings || CAST(:v AS jsonb) WHERE name = :n"),
                     {"v": json.dumps(values), "n": tenant})


def _files(owner_engine, source_id) -> set[str]:
    with owner_engine.connect() as conn:
        return set(conn.execute(text("SELECT key FROM files WHERE source_id = :s"), {"s": source_id}).scalars())


def _empty_corpus(owner_engine, tmp_path, tenant: str, files: dict[str, str]) -> Corpus:
    root = tmp_path / tenant
    root.mkdir()
    for name, body in files.items():
        (root / name).write_text(body)
    t = admin.create_tenant(db_of(owner_engine), tenant)
    s = admin.add_source(db_of(owner_engine), tenant, protocol="fs", config={"root": str(root)}, name="p",
                         schedule="@every 1m")
    return Corpus(tenant, t.id, s.id, root)


def test_a_disabled_tenant_is_not_crawled_and_enabling_it_again_resumes(owner_engine, worker_engine, tmp_path,
                                                                        unique):
    corpus = _empty_corpus(owner_engine, tmp_path, f"off-{unique}", corpus_files(5))
    with db_of(worker_engine).connection() as conn:
        job_id = jobs.enqueue(conn, corpus.source_id)  # queued while enabled
    admin.update_tenant(db_of(owner_engine), corpus.tenant, enabled=False)

    with pytest.raises(jobs.TenantDisabled, match="is disabled"):  # an on-demand crawl says why
        crawl(worker_engine, corpus)
    runner = QueueRunner(db_of(worker_engine), Indexer(db_of(worker_engine), Settings()),
                         options=QueueOptions(tenants=(corpus.tenant,)))
    try:
        assert runner.schedule_due() == []  # the schedule is due, but not for a disabled tenant
        assert runner.step(threading.Event()) is False  # its queued run is not claimed
        assert job_state(owner_engine, job_id) == "queued" and _files(owner_engine, corpus.source_id) == set()
        idle = threading.Thread(target=runner.run, args=(threading.Event(),), kwargs={"exit_when_idle": True})
        idle.start()  # a worker told to exit when idle does not wait for a disabled tenant's runs
        idle.join(30)
        assert not idle.is_alive() and job_state(owner_engine, job_id) == "queued"

        admin.update_tenant(db_of(owner_engine), corpus.tenant, enabled=True)
        runner.run(threading.Event(), exit_when_idle=True)
    finally:
        runner.work.close()
    assert job_state(owner_engine, job_id) == "done"
    assert len(_files(owner_engine, corpus.source_id)) == 5


def test_a_crawl_over_the_file_quota_stops_adding_files_says_so_and_loses_nothing(owner_engine, worker_engine,
                                                                                tmp_path, unique):
    tenant = f"quota-{unique}"
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / tenant, corpus_files(3), tenant=tenant)
    before = _files(owner_engine, corpus.source_id)
    _settings(owner_engine, tenant, quotas={"max_files": 4})
    for name, body in corpus_files(4, prefix="new").items():
        (corpus.root / name).write_text(body)

    stats = crawl(worker_engine, corpus)
    assert (stats.listed, stats.unchanged, stats.indexed) == (7, 3, 1)  # room for one more file
    assert ("quota", "max_files 4 reached: 3 new files not indexed") in stats.problems
    files = _files(owner_engine, corpus.source_id)
    assert before < files and len(files) == 4
    [row] = [r for r in admin.list_sources(db_of(owner_engine), tenant)]
    assert row["last_run"] == "done: max_files 4 reached: 3 new files not indexed"

    _settings(owner_engine, tenant, quotas={"max_files": 2})  # lowered below what is indexed
    stats = crawl(worker_engine, corpus)
    assert (stats.unchanged, stats.indexed, stats.deleted) == (4, 0, 0)
    assert _files(owner_engine, corpus.source_id) == files  # nothing already indexed is lost


def test_the_byte_quota_keeps_the_indexed_version_of_a_file_that_grew_past_it(owner_engine, worker_engine,
                                                                             tmp_path, unique):
    tenant = f"bytes-{unique}"
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / tenant, {"a.md": "alpha " * 100,
                                                                          "b.md": "beta " * 100}, tenant=tenant)
    with owner_engine.connect() as conn:
        used = conn.execute(text("SELECT sum(size) FROM files WHERE source_id = :s"), {"s": corpus.source_id}).scalar()
    _settings(owner_engine, tenant, quotas={"max_bytes": int(used) + 100})
    (corpus.root / "a.md").write_text("alpha " * 100 + "gamma " * 100)  # grows by 600 bytes
    (corpus.root / "c.md").write_text("delta " * 10)  # 60 bytes fit
    stats = crawl(worker_engine, corpus)
    assert (stats.indexed, stats.unchanged) == (1, 1)
    assert any(where == "quota" and "max_bytes" in why for where, why in stats.problems)
    with owner_engine.connect() as conn:
        text_a = conn.execute(text("SELECT string_agg(c.text, '') FROM chunks c JOIN files f ON f.id = c.file_id "
                                   "WHERE f.source_id = :s AND f.key = 'a.md'"), {"s": corpus.source_id}).scalar()
    assert "alpha" in text_a and "gamma" not in text_a  # the indexed version stays
    assert _files(owner_engine, corpus.source_id) == {"a.md", "b.md", "c.md"}


def test_a_source_past_the_source_quota_is_not_crawled_and_keeps_its_files(owner_engine, worker_engine, tmp_path,
                                                                          unique):
    tenant = f"srcq-{unique}"
    first = make_corpus(owner_engine, worker_engine, tmp_path / f"{tenant}-a", corpus_files(2), tenant=tenant)
    second = make_corpus(owner_engine, worker_engine, tmp_path / f"{tenant}-b", corpus_files(2), tenant=tenant)
    _settings(owner_engine, tenant, quotas={"max_sources": 1})
    assert crawl(worker_engine, first).unchanged == 2
    with pytest.raises(QuotaExceeded, match="max_sources is 1"):
        crawl(worker_engine, second)
    assert len(_files(owner_engine, second.source_id)) == 2
    rows = {r["id"]: r for r in admin.list_sources(db_of(owner_engine), tenant)}
    assert rows[second.source_id]["last_run"].startswith("failed: quota: the tenant has 2 sources")
    [source] = load_sources(db_of(worker_engine), source_id=first.source_id)
    assert source.enabled
