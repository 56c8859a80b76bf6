"""`kdbl-control eval FOLDER --questions FILE --unanswerable FILE`: is `answer` right to answer, and to decline?

The extractive answer (kdbl_core.search.answer.ground, what the `answer` tool runs, in an RLS transaction as
the kdbl_api role) is asked every question of the eval, which the documents answer, and every question of
`--unanswerable` (JSON lines of {id, question, kind}), which they do not ("What is the capital of
Mongolia?" over annual reports). Measures:
  found_answerable     the share of answerable questions answered (not "Not found in the sources.");
  found_unanswerable   the share of unanswerable ones answered anyway (lower is better);
  precision_found      of all answers given, the share to answerable questions;
  cites_right_file, cites_right_page   an answerable question's answer cites the expected file / one of
                       the expected pages (any of its citations);
  first_cites_right_page               its first citation does;
  sentences, chars     per answer given (mean); p50_ms per call;
  answered_unanswerable                the ids of the unanswerable questions answered anyway.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kdbl_control import evaluate
from kdbl_core.errors import ConfigError, KdblError
from kdbl_core.settings import Settings


def load_unanswerable(path: Path) -> list[tuple[str, str]]:
    """(id, question) of each line; a line without them is an error naming it."""
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            out.append((str(row["id"]), str(row["question"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path}:{n}: not a JSON object with id and question ({exc})") from None
    if not out:
        raise ConfigError(f"{path} holds no questions")
    return out


async def _answer_all(owner_url: str, tenant_id: Any, tenant: str, asked: Sequence[tuple[str, str]],
                      embedder: Any, settings: Settings, log: evaluate.Log) -> dict[str, dict[str, Any]]:
    from kdbl_core.access.principal import ALL_SCOPES, Principal, rls_transaction
    from kdbl_core.db.connect import async_pool
    from kdbl_core.db.urls import for_role
    from kdbl_core.search import answer as grounded

    pool = await async_pool(for_role(owner_url, "kdbl_api"), size=2, name="kdbl-eval-answers")
    principal = Principal(tenant_id=tenant_id, tenant_name=tenant, subject="user:eval",
                          scopes=frozenset(ALL_SCOPES))
    out: dict[str, dict[str, Any]] = {}
    try:
        for i, (qid, question) in enumerate(asked, 1):
            start = time.perf_counter()
            try:
                async with rls_transaction(pool, principal) as conn:
                    _, sentences = await grounded.ground(conn, question, settings=settings, embedder=embedder)
            except KdblError as exc:
                out[qid] = {"error": str(exc), "found": False, "cites": [], "chars": 0, "ms": 0.0}
                continue
            chosen, _ = grounded.extractive(sentences, max_tokens=grounded.DEFAULT_MAX_TOKENS) \
                if grounded.relevant(sentences) else ([], False)
            out[qid] = {"found": bool(chosen), "cites": [(s.passage.key, s.passage.page_no) for s in chosen],
                        "chars": sum(len(s.text) for s in chosen), "ms": (time.perf_counter() - start) * 1000}
            if i % 50 == 0:
                log(f"eval: answers: {i}/{len(asked)} questions")
    finally:
        await pool.close()
    return out


def judge(answerable: Sequence[Any], unanswerable: Sequence[tuple[str, str]],
          answers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The measures of the module docstring; `answerable` are eval_docs.Question."""
    given = [a for a in answers.values() if a["found"]]
    found_a = [q for q in answerable if answers[q.id]["found"]]
    found_n = [qid for qid, _ in unanswerable if answers[qid]["found"]]

    def share(n: int, of: int) -> float:
        return round(n / of, 4) if of else 0.0

    def cites(q: Any, *, page: bool, first: bool = False) -> bool:
        got = answers[q.id]["cites"][:1] if first else answers[q.id]["cites"]
        return any(key == q.file and (not page or p in q.pages) for key, p in got)

    latencies = [a["ms"] for a in answers.values() if "error" not in a]
    return {"answerable": len(answerable), "unanswerable": len(unanswerable),
            "found_answerable": share(len(found_a), len(answerable)),
            "found_unanswerable": share(len(found_n), len(unanswerable)),
            "precision_found": share(len(found_a), len(found_a) + len(found_n)),
            "cites_right_file": share(sum(cites(q, page=False) for q in answerable), len(answerable)),
            "cites_right_page": share(sum(cites(q, page=True) for q in answerable), len(answerable)),
            "first_cites_right_page": share(sum(cites(q, page=True, first=True) for q in answerable),
                                            len(answerable)),
            "sentences": round(sum(len(a["cites"]) for a in given) / len(given), 2) if given else 0.0,
            "chars": round(sum(a["chars"] for a in given) / len(given), 1) if given else 0.0,
            "p50_ms": round(evaluate.ir_metrics.percentile(latencies, 50), 2) if latencies else None,
            "answered_unanswerable": found_n,
            "errors": [f"{qid}: {a['error']}" for qid, a in answers.items() if "error" in a][:20]}


def run_answers(owner_url: str, tenant_id: Any, tenant: str, answerable: Sequence[Any],
                unanswerable: Sequence[tuple[str, str]], embedder: Any, settings: Settings,
                log: evaluate.Log) -> dict[str, Any]:
    asked = [(q.id, q.question) for q in answerable] + list(unanswerable)
    clash = {qid for qid, _ in unanswerable} & {q.id for q in answerable}
    if clash:
        raise ConfigError(f"unanswerable question ids also in the questions: {', '.join(sorted(clash)[:5])}")
    answers = asyncio.run(_answer_all(owner_url, tenant_id, tenant, asked, embedder, settings, log))
    return {**judge(answerable, unanswerable, answers), "search": "hybrid" if embedder is not None else "lexical"}


__all__ = ["judge", "load_unanswerable", "run_answers"]
