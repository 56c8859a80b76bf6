"""`kdbl-control bench permissions` end to end on 60 generated files: both modes crawled by the worker's
pipeline, the sync after a permission change, the keyword arm under row-level security."""

from __future__ import annotations

from kdbl_control import bench_permissions


def test_bench_permissions_measures_both_modes_and_the_sync(owner_url, tmp_path) -> None:
    lines: list[str] = []
    result = bench_permissions.run_permissions_bench(owner_url, tmp_path, files=60, n_queries=5, log=lines.append)
    tenant, share = result["tenant"], result["from-source"]
    for row in (tenant, share):
        assert row["first_files_per_s"] > 0 and row["recrawl_files_per_s"] > 0
        assert row["search"]["queries"] == 5 and row["search"]["p50_ms"] <= row["search"]["p95_ms"]
        # a full build packs the lists again: the same searches find the same number of hits
        assert row["lists_built"]["kind"] == "full" and row["search_built"]["mean_hits"] == row["search"]["mean_hits"]
    # the share's permissions hide part of the folder from alice; open to the tenant she reads all of it
    assert tenant["search"]["files_readable"] == 60 > share["search"]["files_readable"] > 0
    assert share["permission_sets"] > 1
    sync = share["sync"]
    assert sync["visible_after"] and sync["reindexed"] == 0  # one crawl, nothing read again
    assert sync["files_changed"] >= 1  # at least the file made readable moved to its new permission set
    text = bench_permissions.summarise(result)
    assert "from-source" in text and "sync:" in text and "visible: True" in text
