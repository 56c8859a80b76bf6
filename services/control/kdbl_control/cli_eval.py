"""`kdbl-control eval`: retrieval quality on a BEIR folder (kdbl_control.evaluate), or on a folder of long
documents with --questions (kdbl_control.eval_docs)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kdbl_core.settings import Settings


def add_commands(sub: Any) -> None:
    ev = sub.add_parser("eval", help="retrieval quality on a BEIR folder (nDCG, recall, MRR, latency), or on a "
                        "folder of long documents with --questions (right file and page: hit@k, MRR)")
    ev.add_argument("dataset", type=Path, help="BEIR folder: corpus.jsonl, queries.jsonl, qrels/<split>.tsv; "
                    "with --questions, the folder of documents they ask about")
    ev.add_argument("--questions", type=Path, help="JSON lines of {id, question, file, pages, kind} (e.g. "
                    "docs/eval/longdocs/questions.jsonl; a manifest.json beside it pins the documents)")
    ev.add_argument("--embedded-share", type=float, action="append", metavar="S",
                    help="with --questions: also run hybrid with only this share (0-1) of the chunks embedded, "
                    "as while the worker is still embedding (repeatable)")
    ev.add_argument("--unanswerable", type=Path, help="with --questions: JSON lines of {id, question} the documents "
                    "do not answer (e.g. docs/eval/longdocs/unanswerable.jsonl); the answer tool is judged on both")
    ev.add_argument("--split", default="train", help="qrels/<split>.tsv to score against (default: train)")
    ev.add_argument("--mode", action="append", choices=["lexical", "semantic", "hybrid"],
                    help="repeatable; default: all three (semantic and hybrid need an embedding model)")
    ev.add_argument("--max-queries", type=int, help="only the first N judged queries")
    ev.add_argument("--model", type=Path, help="GGUF embedding model (default: KDBL_EMBED_MODEL_PATH, else the "
                    "cached default model if present)")
    ev.add_argument("--work-dir", type=Path, help="documents and embedded database (default: /tmp/kdbl-eval)")
    ev.add_argument("--limit", type=int, help="search_content limit, chunks per query (1-100; default 100 for a "
                    "BEIR folder, 10 with --questions)")
    ev.add_argument("--no-references", action="store_true", help="skip the bm25s and exact dense references")
    ev.add_argument("--plot", type=Path, help="also write a PNG bar chart (needs matplotlib installed)")
    ev.set_defaults(func=_eval)


def _eval(args: argparse.Namespace, settings: Settings) -> int:
    if args.questions is not None:
        from kdbl_control.eval_docs import cli_eval_docs

        return cli_eval_docs(args, settings)
    from kdbl_control.evaluate import cli_eval

    return cli_eval(args, settings)
