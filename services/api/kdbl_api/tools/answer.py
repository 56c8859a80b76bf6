"""answer: a grounded answer to a question, with citations, from what the caller's search returns.

One search (kdbl_core.search.plan, hybrid degrading to lexical as search_content does, the tool's
filters, ANSWER_HITS hits) in the caller's RLS transaction, then kdbl_core.search.answer:

- extractive (the default: it needs no model, so it works on every server and for lexical-only
  tenants, answers in milliseconds and quotes the sources verbatim): the best-scoring sentences of the
  top hits, each cited with its file, chunk and exact char range;
- abstractive: the local chat model (kdbl_core.chat, KDBL_CHAT_MODEL_PATH) writes the answer from the
  numbered passages only, citing them as [n]. Without a configured model abstractive is hidden: the
  tool stays listed for its extractive answers (an agent only calls what tools/list shows), with
  answer_type offering extractive alone (registry: ToolSpec.offered), and a call asking for abstractive
  is refused as -32602 on `answer_type`, saying so.

When nothing relevant is found the answer is "Not found in the sources." with `found` false and no
citation (for abstractive without calling the model): the relevance floor (kdbl_core.search.answer) weighs
the question's terms by their idf over what the caller sees and asks the quoted passage to be about the
question (its cosine, which the search's `explain` gives, or its own coverage); measured with questions the
corpus answers and questions it cannot (docs/benchmarks.md). With a progress token the answer's text goes out
as it is made, as progress notifications whose `message` is the new piece (a delta: concatenated in
order they are the answer; `progress` counts tokens, `total` is max_tokens), then the result.
"""

from __future__ import annotations

from typing import Any

from kdbl_api.audit import AuditFacts
from kdbl_api.tools.context import ToolContext
from kdbl_api.tools.models import AnswerArgs
from kdbl_core.content.uris import chunk_id, chunk_uri, file_uri
from kdbl_core.errors import InvalidArgument
from kdbl_core.search import answer as grounded
from kdbl_core.search import pipeline

# Kept free for the chat template and a margin (tokens): prompt + answer must fit the model's context.
_TEMPLATE_MARGIN = 64


def _validate(ctx: ToolContext, args: AnswerArgs) -> None:
    try:
        pipeline.check_query(args.question, ctx.settings)
    except InvalidArgument as exc:
        raise InvalidArgument("question", exc.reason) from None
    if args.answer_type == "abstractive" and ctx.services.chat is None:
        raise InvalidArgument("answer_type", "abstractive needs a chat model and this server has none "
                                             "(KDBL_CHAT_MODEL_PATH is unset); use extractive")


def _citation(ctx: ToolContext, n: int, passage: grounded.Passage, start: int, end: int, text: str) -> dict[str, Any]:
    sid, key, seq = passage.source_id, passage.key, passage.seq
    return {"n": n, "source_id": sid, "key": key, "uri": file_uri(sid, key), "chunk_id": chunk_id(sid, key, seq),
            "chunk_uri": chunk_uri(sid, key, seq), "seq": seq, "char_start": start, "char_end": end,
            "page_no": passage.page_no, "ts_start_ms": passage.ts_start_ms, "ts_end_ms": passage.ts_end_ms,
            "text": text, "url": ctx.download_url(sid, key)}


async def _extractive(ctx: ToolContext, args: AnswerArgs, sentences: list[grounded.Sentence]
                      ) -> tuple[str, list[dict[str, Any]], str, int]:
    chosen, cut = grounded.extractive(sentences, max_tokens=args.max_tokens)
    parts, citations = [], []
    for n, sentence in enumerate(chosen, 1):
        parts.append(f"{sentence.text} [{n}]" if args.citations else sentence.text)
        citations.append(_citation(ctx, n, sentence.passage, sentence.start, sentence.end, sentence.text))
        if ctx.progress is not None:
            await ctx.progress(("" if n == 1 else " ") + parts[-1], n, len(chosen))
    text = " ".join(parts)
    return text, citations if args.citations else [], "length" if cut else "stop", grounded.estimate_tokens(text)


async def _abstractive(ctx: ToolContext, args: AnswerArgs, sentences: list[grounded.Sentence]
                       ) -> tuple[str, list[dict[str, Any]], str, int]:
    chat = ctx.services.chat
    assert chat is not None  # _validate
    budget = chat.n_ctx - args.max_tokens - _TEMPLATE_MARGIN
    messages, numbered = grounded.messages(args.question, grounded.passages_with_answers(sentences),
                                           budget_tokens=budget, count_tokens=chat.count_tokens)
    if not numbered:
        return grounded.NOT_FOUND, [], "stop", 0
    sent = 0

    async def on_text(piece: str) -> None:
        nonlocal sent
        sent += 1
        if ctx.progress is not None:
            await ctx.progress(piece, sent, args.max_tokens)

    generation = await chat.stream(messages, max_tokens=args.max_tokens, timeout_s=ctx.settings.chat_timeout_s,
                                   on_text=on_text)
    ctx.meta.took_ms["generate"] = round(generation.seconds * 1000, 3)  # the model's, the prompt included
    if generation.first_token_seconds is not None:
        ctx.meta.took_ms["first_token"] = round(generation.first_token_seconds * 1000, 3)
    text = generation.text.strip()
    citations = []
    if args.citations and not grounded.says_not_found(text):
        for n in grounded.cited(text, len(numbered)):
            p = numbered[n - 1]
            citations.append(_citation(ctx, n, p, p.char_start, p.char_end, p.text))
    return text, citations, generation.finish_reason, generation.tokens


async def answer(ctx: ToolContext, args: AnswerArgs) -> tuple[dict[str, Any], AuditFacts]:
    _validate(ctx, args)
    result, sentences = await grounded.ground(ctx.conn, args.question, settings=ctx.settings,
                                              embedder=ctx.services.embedder, filters=args.filters(),
                                              allowed_modes=ctx.policy.modes, timings=ctx.meta.took_ms)
    if not grounded.relevant(sentences):
        text, citations, reason, tokens = grounded.NOT_FOUND, [], "stop", 0
    elif args.answer_type == "extractive":
        text, citations, reason, tokens = await _extractive(ctx, args, sentences)
    else:
        text, citations, reason, tokens = await _abstractive(ctx, args, sentences)
    is_found = text != grounded.NOT_FOUND and not (args.answer_type == "abstractive" and grounded.says_not_found(text))
    facts = AuditFacts(source_ids=[c["source_id"] for c in citations], keys=[c["key"] for c in citations],
                       row_count=len(citations), mode=f"answer_{args.answer_type}")
    return {"answer": text, "answer_type": args.answer_type, "found": is_found, "citations": citations,
            "finish_reason": reason, "tokens": tokens,
            "model": ctx.services.chat.model_id if args.answer_type == "abstractive" and ctx.services.chat else None,
            "mode": result.mode, "degraded": result.degraded, "degraded_reason": result.degraded_reason}, facts
