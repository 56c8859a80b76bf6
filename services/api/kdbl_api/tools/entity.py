"""find_entity: one named entity as the caller may see it (issue 31; kdbl_core.search.entity_graph) — its
statistics, the entities named beside it with the chunks as evidence, and the chunks to read on — in the
four response modes of the BMCIS reference (ids_only, metadata, preview, full) with their caps. An unknown
name, and a name found only in files the caller cannot read, answer the same -32602 on `name`, with
suggestions from what it can read."""

from __future__ import annotations

from typing import Any

from kdbl_api.audit import AuditFacts
from kdbl_api.tools.context import ToolContext
from kdbl_api.tools.models import FindEntityArgs
from kdbl_core.content.uris import chunk_id, chunk_uri, file_uri
from kdbl_core.search import entity_graph
from kdbl_core.search.snippets import preview



def evidence_out(source_id: Any, key: str, seq: int) -> dict[str, str]:
    return {"chunk_id": chunk_id(source_id, key, seq), "chunk_uri": chunk_uri(source_id, key, seq),
            "uri": file_uri(source_id, key)}


def entity_out(entity: entity_graph.Entity, shared: int | None = None) -> dict[str, Any]:
    return {"entity_id": str(entity.id), "name": entity.name, "entity_type": entity.type, "shared_chunks": shared}


def relationship_out(subject: int, obj: int, kind: str, weight: int, evidence: list) -> dict[str, Any]:
    """A relationship as the tools answer it: typed ones named subject-TYPE-object, co-occurrences a-b."""
    ident = f"{subject}-{obj}" if kind == entity_graph.CO_OCCURS else f"{subject}-{kind}-{obj}"
    return {"relationship_id": ident, "source_id": str(subject), "target_id": str(obj), "relationship_type": kind,
            "weight": weight, "evidence": [evidence_out(*e) for e in evidence]}


def around_out(found: entity_graph.Around) -> dict[str, Any]:
    """get_contents' expand.graph for one item."""
    return {"entities": [entity_out(e, n) for e, n in found.entities.values()],
            "relationships": [relationship_out(*r) for r in found.relationships]}


async def find_entity(ctx: ToolContext, args: FindEntityArgs) -> tuple[dict[str, Any], AuditFacts]:
    entity = await entity_graph.resolve(ctx.conn, args.name, args.type)
    related, edges, per_edge, chunks = entity_graph.CAPS[args.response_mode]
    graph = await entity_graph.neighbourhood(ctx.conn, entity, related=related,
                                             edges=edges if args.include_relationships else 0,
                                             evidence=per_edge if args.include_relationships else 0, top_chunks=chunks)
    relationships = [relationship_out(*r) for r in graph.typed] + [
        relationship_out(a, b, entity_graph.CO_OCCURS, shared, graph.evidence.get((a, b), []))
        for a, b, shared in graph.edges]
    relationships = relationships[:edges]
    mode = args.response_mode
    result: dict[str, Any] = {
        "name": args.name, "response_mode": mode, "entity": entity_out(entity), "entity_ids": None,
        "relationship_ids": None, "statistics": None, "entities": None, "relationships": None, "top_chunks": None}
    if mode == "ids_only":
        result["entity_ids"] = [str(entity.id), *(str(e.id) for e, _ in graph.related)]
        result["relationship_ids"] = [r["relationship_id"] for r in relationships] if args.include_relationships else None
    else:
        result["statistics"] = {
            "mentions": graph.mentions, "chunks": graph.chunks, "files": graph.files,
            "related_from_chunks": graph.sampled,
            "entity_count": graph.related_total,
            "relationship_count": graph.related_total + sum(graph.typed_types.values()),
            "entity_type_distribution": graph.related_types,
            "relationship_type_distribution": {**graph.typed_types, **(
                {entity_graph.CO_OCCURS: graph.related_total} if graph.related_total else {})}}
        result["top_chunks"] = [
            {"chunk_id": chunk_id(c["source_id"], c["key"], c["seq"]), "chunk_uri": chunk_uri(c["source_id"], c["key"], c["seq"]),
             "uri": file_uri(c["source_id"], c["key"]), "source_id": str(c["source_id"]), "key": c["key"], "seq": c["seq"],
             "page_no": c["page_no"], "mentions": c["n"], "preview": preview(c["head"])} for c in graph.top_chunks]
    if mode in ("preview", "full"):
        result["entities"] = [entity_out(e, shared) for e, shared in graph.related]
        result["relationships"] = relationships if args.include_relationships else None
    cited = [c["source_id"] for c in result["top_chunks"] or []]
    audit = AuditFacts(source_ids=sorted(set(cited)), keys=[c["key"] for c in result["top_chunks"] or []],
                       row_count=1 + len(graph.related), mode=f"find_entity_{mode}")
    return result, audit
