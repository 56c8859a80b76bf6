"""A Source resource's labels end to end (issue 16): the real kopf operator (kmock API emulator) maps
spec.labels / spec.labelGlobs / spec.objectTags into the source's config, the real worker crawls the
folder and its files carry the labels, and changing them on the resource relabels the indexed files
without a crawl."""

from __future__ import annotations

from typing import Any

from helpers import Corpus, crawl
from operator_helpers import source, tenant
from sqlalchemy import text

FILES = {
    "guides/install.md": "---\ntags: [setup]\n---\n# Install\nRun the installer.\n",
    "notes/today.md": "A short note.\n",
    "readme.txt": "Read me first.\n",
}


def _row(engine: Any, tenant_name: str, name: str) -> dict[str, Any] | None:
    with engine.connect() as conn:
        row = conn.execute(text("SELECT s.id, s.tenant_id, s.config FROM sources s JOIN tenants t ON t.id = s.tenant_id "
                                "WHERE t.name = :t AND s.name = :n"), {"t": tenant_name, "n": name}).mappings().first()
        return dict(row) if row else None


def _labels(engine: Any, source_id: Any) -> dict[str, list[str]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT key, labels FROM files WHERE source_id = :s"), {"s": source_id})
        return {r.key: list(r.labels) for r in rows}


async def test_a_source_resources_labels_reach_its_crawled_files_and_a_change_relabels_them(
        operator, owner_engine, worker_engine, names, tmp_path):
    t = names("lab")
    root = tmp_path / "handbook"
    for key, body in FILES.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_text(body)
    await operator.create(tenant(t))
    await operator.ready("Tenant", t)
    await operator.create(source("handbook", t, connection={"path": str(root)}, labels=["handbook"],
                                 labelGlobs={"guides/": ["guide"]}))
    await operator.ready("Source", "handbook", "kdbl")
    row = _row(owner_engine, t, "handbook")
    assert (row["config"]["labels"], row["config"]["label_globs"]) == (["handbook"], {"guides/": ["guide"]})

    crawl(worker_engine, Corpus(t, row["tenant_id"], row["id"], root))
    assert _labels(owner_engine, row["id"]) == {"guides/install.md": ["handbook", "guide", "setup"],
                                                "notes/today.md": ["handbook"], "readme.txt": ["handbook"]}

    await operator.patch("Source", "handbook", {"spec": {"labels": ["manual"],
                                                         "labelGlobs": {"notes/": ["note"]}}}, "kdbl")
    relabelled = {"guides/install.md": ["manual", "guide", "setup"], "notes/today.md": ["manual", "note"],
                  "readme.txt": ["manual"]}
    await operator.eventually(lambda: _labels(owner_engine, row["id"]) == relabelled, what="files relabelled")
    config = _row(owner_engine, t, "handbook")["config"]
    assert (config["labels"], config["label_globs"]) == (["manual"], {"guides/": ["guide"], "notes/": ["note"]})
