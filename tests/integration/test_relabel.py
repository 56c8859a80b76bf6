"""A change of a source's label config relabels its files at once (issue 16): `kdbl-control source update`
(admin.update_source_labels) recomputes files.labels from the new config and each file's own tags
(files.own_labels, written by the crawl) with the worker's own rule, and the search cache never serves
the answer filtered by the old labels (through the official MCP client). The files are generated here
and crawled by the real worker."""

from __future__ import annotations

import json
import uuid

import jsonschema
import pytest
from helpers import Corpus, crawl, db_of, mcp_client, running_api
from psycopg.types.json import Jsonb
from sqlalchemy import text

from kdbl_control import admin
from kdbl_control.cli import main as cli_main
from kdbl_core.errors import InvalidArgument
from kdbl_core.settings import Settings
from kdbl_core.sources import relabel
from kdbl_core.sources.labels import Labeler
from kdbl_worker.pipeline import Indexer, load_sources

FILES = {
    "guides/install.md": "---\ntags: [howto, setup]\n---\n# Install\nThe kestrel installer runs offline.\n",
    "guides/upgrade.md": "# Upgrade\nThe kestrel upgrade keeps the index.\n",
    "notes/kestrel.md": "---\ntags: [birds]\n---\nA kestrel hovered over the field.\n",
    "readme.txt": "Kestrel: a small falcon, and the name of this project.\n",
}


def _source(owner_engine, worker_engine, root, tenant, config) -> Corpus:
    for name, body in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    t = admin.create_tenant(db_of(owner_engine), tenant, exist_ok=True)
    s = admin.add_source(db_of(owner_engine), tenant, protocol="fs", config={"root": str(root), **config},
                         name=root.name)
    corpus = Corpus(tenant, t.id, s.id, root)
    crawl(worker_engine, corpus)
    return corpus


def _labels(owner_engine, source_id) -> dict[str, tuple[list[str], list[str]]]:
    with owner_engine.connect() as conn:
        rows = conn.execute(text("SELECT key, labels, own_labels FROM files WHERE source_id = :s"),
                            {"s": source_id}).fetchall()
    return {r.key: (list(r.labels), list(r.own_labels)) for r in rows}


@pytest.fixture(scope="module")
def world(owner_engine, worker_engine, owner_url, tmp_path_factory):
    name = f"relabel-{uuid.uuid4().hex[:10]}"
    base = tmp_path_factory.mktemp("relabel")
    corpus = _source(owner_engine, worker_engine, base / "kb", name, {"labels": ["docs"]})
    token = admin.create_token(db_of(owner_engine), tenant_name=name, name="agent")[0]
    with running_api(owner_url, Settings(mcp_enabled=True)) as url:
        yield {"url": url, "token": token, "corpus": corpus, "base": base, "tenant": name}


mcp = mcp_client


async def search(world, **args) -> dict:
    async with mcp(world["url"], world["token"]) as client:
        schema = {t.name: t for t in (await client.list_tools()).tools}["search_content"].output_schema
        structured = (await client.call_tool("search_content", {"query": "kestrel", "mode": "lexical",
                                                                "limit": 20, **args})).structured_content
    jsonschema.validate(structured, schema)
    return structured


def test_the_crawl_stores_each_files_own_tags_apart_from_its_labels(world, owner_engine):
    stored = _labels(owner_engine, world["corpus"].source_id)
    assert stored["guides/install.md"] == (["docs", "howto", "setup"], ["howto", "setup"])
    assert stored["guides/upgrade.md"] == (["docs"], [])
    assert stored["notes/kestrel.md"] == (["docs", "birds"], ["birds"])


async def test_a_label_config_change_relabels_every_file_and_the_cache_serves_the_new_answer(world, owner_engine):
    owner = db_of(owner_engine)
    source_id = world["corpus"].source_id
    before = await search(world, labels=["guide"])
    assert before["hits"] == [] and before["meta"]["cache_hit"] is False
    assert (await search(world, labels=["guide"]))["meta"]["cache_hit"] is True

    result = admin.update_source_labels(owner, source_id, labels=["kb"],
                                        label_globs={"guides/": ["guide"], "*.txt": ["plain", "kb"]})
    assert (result["files"], result["relabelled"]) == (4, 4)
    assert _labels(owner_engine, source_id) == {
        "guides/install.md": (["kb", "guide", "howto", "setup"], ["howto", "setup"]),
        "guides/upgrade.md": (["kb", "guide"], []),
        "notes/kestrel.md": (["kb", "birds"], ["birds"]),
        "readme.txt": (["kb", "plain"], []),
    }
    after = await search(world, labels=["guide"])
    assert after["meta"]["cache_hit"] is False
    assert {h["key"] for h in after["hits"]} == {"guides/install.md", "guides/upgrade.md"}
    assert (await search(world, labels=["docs"]))["hits"] == []

    cleared = admin.update_source_labels(owner, source_id, labels=[], label_globs={})
    assert cleared["relabelled"] == 4 and (cleared["labels"], cleared["label_globs"]) == ([], {})
    assert (await search(world, labels=["guide"]))["hits"] == []
    assert {h["key"] for h in (await search(world, labels=["birds"]))["hits"]} == {"notes/kestrel.md"}
    admin.update_source_labels(owner, source_id, labels=["docs"])  # back as the module's other tests expect


def test_relabelled_files_carry_what_a_fresh_crawl_with_the_new_config_gives_them(world, owner_engine,
                                                                                   worker_engine):
    config = {"labels": ["team"], "label_globs": {"**/*.md": ["markdown"], "notes/": ["team", "field"]}}
    fresh = _source(owner_engine, worker_engine, world["base"] / "fresh", world["tenant"], config)
    relabelled = _source(owner_engine, worker_engine, world["base"] / "moved", world["tenant"], {})
    admin.update_source_labels(db_of(owner_engine), relabelled.source_id, **config)
    assert _labels(owner_engine, relabelled.source_id) == _labels(owner_engine, fresh.source_id)


def test_kdbl_control_source_update_sets_labels_and_globs_and_no_labels_clears_them(world, owner_engine, owner_url,
                                                                                    monkeypatch, capsys):
    source_id = str(world["corpus"].source_id)

    def cli(*argv: str) -> dict:
        monkeypatch.setenv("KDBL_DATABASE_URL", owner_url)
        with pytest.raises(SystemExit) as done:
            cli_main(["--json", "source", "update", "--source", source_id, *argv])
        out = capsys.readouterr()
        assert done.value.code == 0, out.err
        return json.loads(out.out)

    set_ = cli("--label", "kb", "--label-glob", "guides/=guide,howto", "--label-glob", "*.txt=plain")
    assert (set_["labels"], set_["label_globs"]) == (["kb"], {"guides/": ["guide", "howto"], "*.txt": ["plain"]})
    assert set_["relabelled"] == 4
    assert _labels(owner_engine, world["corpus"].source_id)["guides/install.md"][0] == ["kb", "guide", "howto", "setup"]
    cleared = cli("--no-labels")
    assert (cleared["labels"], cleared["label_globs"], cleared["relabelled"]) == ([], {}, 4)
    assert _labels(owner_engine, world["corpus"].source_id)["readme.txt"] == ([], [])
    cli("--label", "docs")  # back as the module's other tests expect


def test_an_unchanged_label_config_writes_no_file_and_other_fields_never_relabel(world, owner_engine):
    owner = db_of(owner_engine)
    source_id = world["corpus"].source_id
    assert admin.update_source_labels(owner, source_id, labels=["docs"])["relabelled"] == 0
    assert relabel.apply_config_change(None, source_id, {"labels": ["a"], "ocr": True},
                                       {"labels": ["a"], "ocr": False}) is None


def test_a_bad_label_glob_is_refused_naming_the_field_and_nothing_changes(world, owner_engine):
    owner = db_of(owner_engine)
    source_id = world["corpus"].source_id
    before = _labels(owner_engine, source_id)
    with pytest.raises(InvalidArgument) as bad:
        admin.update_source_labels(owner, source_id, label_globs={"[z-a].md": ["x"]})
    assert bad.value.field == "label_globs"
    with pytest.raises(InvalidArgument) as tags:
        admin.update_source_labels(owner, source_id, object_tags=True)
    assert tags.value.field == "object-tags"
    assert _labels(owner_engine, source_id) == before


def test_files_indexed_before_own_labels_existed_keep_their_own_tags_through_a_relabel(world, owner_engine,
                                                                                          worker_engine):
    corpus = _source(owner_engine, worker_engine, world["base"] / "legacy", world["tenant"],
                     {"labels": ["old"], "label_globs": {"guides/": ["guide"]}})
    with owner_engine.begin() as conn:  # as migration 0015 left them: own tags only inside labels
        conn.execute(text("UPDATE files SET own_labels = '{}' WHERE source_id = :s"), {"s": corpus.source_id})
    admin.update_source_labels(db_of(owner_engine), corpus.source_id, labels=["new"])
    stored = _labels(owner_engine, corpus.source_id)
    assert stored["guides/install.md"] == (["new", "guide", "howto", "setup"], ["howto", "setup"])
    assert stored["notes/kestrel.md"] == (["new", "birds"], ["birds"])
    assert stored["readme.txt"] == (["new"], [])


def test_files_a_running_crawl_writes_after_a_label_change_end_with_the_new_labels(world, owner_engine,
                                                                                  worker_engine):
    root = world["base"] / "race"
    root.mkdir()
    for i in range(40):
        (root / f"note-{i:02d}.md").write_text(f"Note {i} about a kestrel.\n")
    owner = db_of(owner_engine)
    source = admin.add_source(owner, world["tenant"], protocol="fs", config={"root": str(root), "labels": ["before"]},
                              name="race")
    changed: list[dict] = []

    def progress(stats, key) -> None:  # the first file written: the label config changes mid-crawl
        if stats.indexed >= 1 and not changed:
            changed.append(admin.update_source_labels(owner, source.id, labels=["after"]))

    [row] = load_sources(db_of(worker_engine), source_id=source.id)
    assert Indexer(db_of(worker_engine), Settings()).crawl(row, progress).indexed == 40
    assert changed and 1 <= changed[0]["files"] < 40  # the change came while files were still to be written
    assert {key: labels for key, (labels, _) in _labels(owner_engine, source.id).items()} == {
        f"note-{i:02d}.md": ["after"] for i in range(40)}


def test_a_source_of_ten_thousand_files_is_relabelled_in_batches_with_progress(world, owner_engine):
    source = admin.add_source(db_of(owner_engine), world["tenant"], protocol="fs",
                              config={"root": str(world["base"])}, name=f"big-{uuid.uuid4().hex[:6]}")
    with owner_engine.begin() as conn:  # rows only: relabelling reads no file
        conn.execute(text("""
            INSERT INTO files (tenant_id, source_id, key, size, status, own_labels)
            SELECT :t, :s, 'dir' || (i % 5) || '/f' || lpad(i::text, 5, '0') || '.md', 1, 'ok',
                   CASE WHEN i % 2 = 0 THEN ARRAY['tag' || (i % 3)] ELSE '{}' END
              FROM generate_series(1, 10000) i"""), {"t": source.tenant_id, "s": source.id})
    config = {"labels": ["all"], "label_globs": {"dir0/": ["zero"], "f0*.md": ["low"], "dir9/": ["none"]}}
    seen: list[tuple[int, int]] = []
    with db_of(owner_engine).connection() as conn:
        conn.execute("UPDATE sources SET config = config || %s WHERE id = %s", (Jsonb(config), source.id))
        done = relabel.relabel(conn, source.id, progress=lambda f, c: seen.append((f, c)))
    assert (done.files, done.changed) == (10_000, 10_000)
    assert [f for f, _ in seen] == [2000, 4000, 6000, 8000, 10_000]
    labeler = Labeler.from_config(config)
    stored = _labels(owner_engine, source.id)
    assert len(stored) == 10_000
    assert all(labels == labeler(key, own) for key, (labels, own) in stored.items())
    assert stored["dir0/f00005.md"][0] == ["all", "zero", "low"]
    with db_of(owner_engine).connection() as conn:
        assert relabel.relabel(conn, source.id).changed == 0
