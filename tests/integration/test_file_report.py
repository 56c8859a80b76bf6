"""`kdbl-control source files`: an admin sees how many files of a share are searchable and why the others are
not, reasons grouped with example keys, and can list the files of one status."""

from __future__ import annotations

import json
import random

from helpers import cli, make_corpus

from kdbl_control.file_report import reason_group


def test_reasons_that_differ_only_in_numbers_or_names_fold_into_one_group():
    assert reason_group("extraction timed out after 120 s") == reason_group("extraction timed out after 3.5 s")
    assert reason_group("member 'a.txt' too large") == reason_group("member 'b.bin' too large")
    assert reason_group(None) == "(no reason)"


def test_the_file_report_counts_statuses_and_groups_the_reasons_of_the_files_that_are_not_ok(
        owner_engine, worker_engine, owner_url, tmp_path, unique, monkeypatch, capsys):
    junk = random.Random(3)
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / "share", {
        "a.md": "# Alpha\n\nfirst note", "b.txt": "second note", "c.txt": "third note",
        "empty-1.txt": "", "empty-2.txt": "",
        "blob.bin": bytes(junk.randrange(256) for _ in range(4096)),
    }, tenant=f"report-{unique}")

    report = json.loads(cli(monkeypatch, capsys, owner_url, "source", "files", "--source",
                             str(corpus.source_id), "--json"))
    assert report["files"] == 6 and report["by_status"]["ok"] == 3 and report["ok_share"] == 0.5
    groups = {(g["status"], g["reason"]): g for g in report["reasons"]}
    empty = groups[("skipped", "empty file (N bytes)")]
    assert empty["files"] == 2 and sorted(empty["examples"]) == ["empty-1.txt", "empty-2.txt"]
    assert sum(g["files"] for g in report["reasons"]) == 3  # every file that is not ok is in one group

    text_out = cli(monkeypatch, capsys, owner_url, "source", "files", "--tenant", corpus.tenant)
    assert text_out.splitlines()[0].startswith("6 files: 3 ok") and "(50.0% ok)" in text_out
    assert "empty file (N bytes)" in text_out and "e.g. empty-1.txt" in text_out

    listed = json.loads(cli(monkeypatch, capsys, owner_url, "source", "files", "--source", str(corpus.source_id),
                             "--status", "skipped", "--json"))
    assert {row["key"] for row in listed} >= {"empty-1.txt", "empty-2.txt"}
    assert all(row["status"] == "skipped" and row["reason"] for row in listed)
