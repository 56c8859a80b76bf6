"""The schema as one SQLAlchemy `MetaData`: every table, column, key, check and index the migrations create.

The single declaration of what the database looks like, kept next to the Alembic migrations
(migrations/sql holds the DDL they run, including what a `MetaData` cannot say: row-level-security
policies, grants, functions, triggers). tests/integration/test_schema_metadata.py migrates a fresh
database and asserts that Alembic's autogenerate comparison against this module is empty, so the two
cannot drift. Nothing at run time imports this module: the services speak SQL through psycopg
(kdbl_core.db.connect); SQLAlchemy is the schema's language, not the driver.

Not declared: the per-dimension HNSW indexes `chunks_embedding_<dim>_hnsw`, created at run time by
`kdbl_ensure_vector_index(dim)` when the first embeddings of a dimension arrive (expression indexes
over `embedding::halfvec(dim)`; `IGNORED_INDEXES` below names the pattern).
"""

from __future__ import annotations

import re

from pgvector.sqlalchemy import HALFVEC
from sqlalchemy import (
    BigInteger, Boolean, CheckConstraint, Column, Double, ForeignKey, Identity, Index, Integer, LargeBinary,
    MetaData, PrimaryKeyConstraint, REAL, SmallInteger, Table, Text, UniqueConstraint, text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TIMESTAMP, UUID

metadata = MetaData()

# Created at run time per embedding dimension (see the module docstring), never by a migration.
IGNORED_INDEXES = re.compile(r"^chunks_embedding_\d+_hnsw$")

_TS = TIMESTAMP(timezone=True)
_MANAGED_BY = "managed_by = ANY (ARRAY['cli'::text, 'operator'::text])"


def _id() -> Column[int]:
    return Column("id", BigInteger, Identity(always=True), primary_key=True)


def _uuid_id() -> Column[object]:
    return Column("id", UUID(as_uuid=True), primary_key=True, server_default=text("gen_random_uuid()"))


def _now(name: str) -> Column[object]:
    return Column(name, _TS, nullable=False, server_default=text("now()"))


def _count(name: str, kind: type = BigInteger) -> Column[int]:
    return Column(name, kind, nullable=False, server_default=text("0"))


def _fk(name: str, target: str, *, nullable: bool = False) -> Column[object]:
    kind = UUID(as_uuid=True) if target.endswith(("tenants.id", "sources.id")) else BigInteger
    return Column(name, kind, ForeignKey(target, ondelete="CASCADE"), nullable=nullable)


tenants = Table(
    "tenants", metadata,
    _uuid_id(),
    Column("name", Text, nullable=False),
    Column("display_name", Text),
    Column("hybrid_enabled", Boolean, nullable=False, server_default=text("true")),
    Column("managed_by", Text, nullable=False, server_default=text("'cli'::text")),
    Column("settings", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    _now("created_at"), _now("updated_at"),
    UniqueConstraint("name", name="tenants_name_key"),
    CheckConstraint(_MANAGED_BY, name="tenants_managed_by_check"),
    CheckConstraint("name ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'::text", name="tenants_name_check"),
)

sources = Table(
    "sources", metadata,
    _uuid_id(),
    _fk("tenant_id", "tenants.id"),
    Column("name", Text, nullable=False),
    Column("protocol", Text, nullable=False),
    Column("config", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("enabled", Boolean, nullable=False, server_default=text("true")),
    Column("hybrid_enabled", Boolean, nullable=False, server_default=text("true")),
    Column("acl_mode", Text, nullable=False, server_default=text("'tenant'::text")),
    Column("schedule", Text),
    Column("managed_by", Text, nullable=False, server_default=text("'cli'::text")),
    Column("last_indexed_at", _TS),
    _now("created_at"), _now("updated_at"),
    Column("permission_map", JSONB, nullable=False, server_default=text("'{}'::jsonb")),  # 0023
    Column("permissions_checked_at", _TS),  # 0024: when an SMB source's descriptors were last all read
    UniqueConstraint("tenant_id", "name", name="sources_tenant_id_name_key"),
    Index("sources_tenant_idx", "tenant_id"),
    CheckConstraint("acl_mode = ANY (ARRAY['tenant'::text, 'restricted'::text, 'source'::text])",
                    name="sources_acl_mode_check"),
    CheckConstraint(_MANAGED_BY, name="sources_managed_by_check"),
    CheckConstraint("protocol = ANY (ARRAY['fs'::text, 's3'::text, 'smb'::text, 'webdav'::text, 'http'::text])",
                    name="sources_protocol_check"),
)

files = Table(
    "files", metadata,
    _id(),
    _fk("tenant_id", "tenants.id"),
    _fk("source_id", "sources.id"),
    Column("key", Text, nullable=False),
    Column("size", BigInteger),
    Column("mtime", _TS),
    Column("etag", Text),
    Column("content_type", Text),
    Column("storage_class", Text),
    Column("owner", Text),
    Column("mode", Integer),
    Column("uid", Integer),
    Column("gid", Integer),
    Column("status", Text, nullable=False, server_default=text("'pending'::text")),
    Column("status_reason", Text),
    Column("title", Text),
    _count("chunk_count", Integer),
    _count("text_chars"),
    Column("indexed_at", _TS),
    Column("seen_at", _TS),
    _count("index_runs", Integer),
    _fk("parent_id", "files.id", nullable=True),
    Column("authors", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    Column("labels", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    Column("own_labels", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),  # 0015
    Column("index_format", SmallInteger, nullable=False, server_default=text("0")),  # 0019: content.analysis
    Column("permission_set", BigInteger, ForeignKey("permission_sets.id")),  # 0023: the share's permissions
    Column("access_stamp", Text),  # 0024: the SMB change time its permissions were last read with
    Column("entities_version", SmallInteger),  # 0025: which entity extractor read it (NULL: not yet)
    UniqueConstraint("source_id", "key", name="files_source_id_key_key"),
    Index("files_permission_set_idx", "permission_set", postgresql_where=text("permission_set IS NOT NULL")),
    Index("files_entities_read_idx", "source_id", postgresql_where=text("entities_version IS NOT NULL")),
    Index("files_entities_pending_idx", "source_id", "id",
          postgresql_where=text("entities_version IS NULL AND chunk_count > 0")),
    Index("files_parent_idx", "parent_id", postgresql_where=text("parent_id IS NOT NULL")),
    Index("files_labels_idx", "labels", postgresql_using="gin", postgresql_where=text("labels <> '{}'::text[]")),
    Index("files_tenant_source_key_idx", "tenant_id", "source_id", "key"),
    CheckConstraint("status = ANY (ARRAY['pending'::text, 'ok'::text, 'partial'::text, 'failed'::text, "
                    "'skipped'::text])", name="files_status_check"),
)

chunks = Table(
    "chunks", metadata,
    _id(),
    Column("tenant_id", UUID(as_uuid=True), nullable=False),
    Column("source_id", UUID(as_uuid=True), nullable=False),
    _fk("file_id", "files.id"),
    Column("seq", Integer, nullable=False),
    Column("text", Text, nullable=False),
    Column("page_no", Integer),
    Column("char_start", Integer, nullable=False),
    Column("char_end", Integer, nullable=False),
    Column("ts_start_ms", BigInteger),
    Column("ts_end_ms", BigInteger),
    _count("token_count", Integer),
    Column("embedding", HALFVEC()),  # any dimension, half precision (0020); one HNSW index per dimension
    Column("embedding_model", Text),
    Column("context_header", Text),  # heading path above the chunk (0015)
    Column("text_tokens", Integer),  # the text's length in the embedding model's tokens (0015)
    Column("terms", Text),  # the chunk's terms, sorted, space-joined (0021): the keyword index's record
    Column("tfs", ARRAY(SmallInteger)),  # their tf, in the same order
    UniqueConstraint("file_id", "seq", name="chunks_file_id_seq_key"),
    Index("chunks_embedding_pending_idx", "tenant_id", "source_id", "id",
          postgresql_where=text("embedding IS NULL")),
)

postings = Table(
    "postings", metadata,
    Column("tenant_id", UUID(as_uuid=True), nullable=False),
    Column("term", Text, nullable=False),
    Column("chunk_id", BigInteger, nullable=False),
    Column("source_id", UUID(as_uuid=True), nullable=False),
    _fk("file_id", "files.id"),
    Column("tf", SmallInteger, nullable=False),
    Column("dl", Integer, nullable=False),
    # INCLUDE: the BM25 scan reads impacts from the index alone (migrations/sql/0001_initial.sql)
    PrimaryKeyConstraint("tenant_id", "term", "chunk_id", name="postings_pkey",
                         postgresql_include=["tf", "dl", "source_id", "file_id"]),
    Index("postings_file_idx", "file_id"),
)

def _partition() -> Column[int]:
    """The keyword index's partition (migration 0024): its files' permission set, 0 for none."""
    return Column("permission_set", BigInteger, nullable=False, server_default=text("0"))


term_stats = Table(
    "term_stats", metadata,
    Column("tenant_id", UUID(as_uuid=True), nullable=False),
    Column("term", Text, nullable=False),
    Column("shard", SmallInteger, nullable=False),
    Column("df", Integer, nullable=False),
    _fk("source_id", "sources.id"),
    Column("tf_max", SmallInteger),  # the term's largest tf written (migration 0016): bounds its BM25 score
    _partition(),
    PrimaryKeyConstraint("tenant_id", "term", "source_id", "permission_set", "shard", name="term_stats_pkey"),
)

corpus_stats = Table(
    "corpus_stats", metadata,
    Column("tenant_id", UUID(as_uuid=True), nullable=False),
    Column("shard", SmallInteger, nullable=False),
    _count("n_chunks"),
    _count("total_len"),
    _fk("source_id", "sources.id"),
    Column("dl_min", Integer),  # the shortest chunk written (migration 0016): bounds a posting's BM25 score
    _partition(),
    PrimaryKeyConstraint("tenant_id", "source_id", "permission_set", "shard", name="corpus_stats_pkey"),
)

# Packed BM25 posting lists (migration 0017, kdbl_core.content.bm25_lists): one per (tenant, term, source,
# permission set, gen),
# complete up to bm25_built.upto; chunks deleted since are in bm25_dead (a trigger on chunks).
bm25_lists = Table(
    "bm25_lists", metadata,
    _fk("tenant_id", "tenants.id"),
    Column("term", Text, nullable=False),
    _fk("source_id", "sources.id"),
    Column("gen", BigInteger, nullable=False),  # < 0: a writer's own generation, -(its first chunk id) (0021)
    Column("n", Integer, nullable=False),
    Column("list", LargeBinary, nullable=False),
    _partition(),
    PrimaryKeyConstraint("tenant_id", "term", "source_id", "permission_set", "gen", name="bm25_lists_pkey"),
)

bm25_built = Table(
    "bm25_built", metadata,
    Column("tenant_id", UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True),
    _count("upto"),
    _count("gens", Integer),
    _count("chunks"),
    _count("dead"),
    _count("lists"),
    _count("postings"),
    _count("bytes"),
    Column("seconds", Double),
    Column("built_at", _TS),
)

bm25_dead = Table(
    "bm25_dead", metadata,
    _fk("tenant_id", "tenants.id"),
    Column("chunk_id", BigInteger, nullable=False),
    _fk("source_id", "sources.id"),
    PrimaryKeyConstraint("tenant_id", "chunk_id", name="bm25_dead_pkey"),
)

source_stats = Table(
    "source_stats", metadata,
    _fk("tenant_id", "tenants.id"),
    _fk("source_id", "sources.id"),
    Column("model", Text, nullable=False, server_default=text("''::text")),
    Column("shard", SmallInteger, nullable=False),
    _count("files"),
    _count("chunks"),
    PrimaryKeyConstraint("source_id", "model", "shard", name="source_stats_pkey"),
)

permission_sets = Table(  # the share's permissions, one row per distinct rule set (migration 0023)
    "permission_sets", metadata,
    _id(),
    _fk("tenant_id", "tenants.id"),
    Column("digest", Text, nullable=False),
    Column("rules", JSONB, nullable=False),
    _now("created_at"),
    UniqueConstraint("tenant_id", "digest", name="permission_sets_tenant_id_digest_key"),
)

permission_changes = Table(  # each permission change the crawl took from the share (migration 0023)
    "permission_changes", metadata,
    _id(),
    _fk("tenant_id", "tenants.id"),
    _fk("source_id", "sources.id"),
    Column("job_id", BigInteger),
    Column("file_key", Text, nullable=False),
    Column("before_set", BigInteger),
    Column("after_set", BigInteger),
    _now("at"),
    Index("permission_changes_source_idx", "source_id", "at"),
)

entities = Table(  # one per (tenant, type, canonical name): kdbl_core.content.entities (migration 0025)
    "entities", metadata,
    _id(),
    _fk("tenant_id", "tenants.id"),
    Column("type", Text, nullable=False),
    Column("key", Text, nullable=False),
    Column("name", Text, nullable=False),
    UniqueConstraint("tenant_id", "type", "key", name="entities_tenant_id_type_key_key"),
    Index("entities_tenant_key_idx", "tenant_id", "key", postgresql_ops={"key": "text_pattern_ops"}),
    CheckConstraint("type = ANY (ARRAY['PERSON'::text, 'ORG'::text, 'PLACE'::text, 'PRODUCT'::text, 'EVENT'::text, "
                    "'DATE'::text, 'MONEY'::text])", name="entities_type_check"),
)

entity_mentions = Table(  # which chunk (file, seq) names which entity, how often (migration 0025)
    "entity_mentions", metadata,
    Column("tenant_id", UUID(as_uuid=True), nullable=False),
    _fk("entity_id", "entities.id"),
    _fk("file_id", "files.id"),
    Column("seq", Integer, nullable=False),
    Column("source_id", UUID(as_uuid=True), nullable=False),
    Column("n", SmallInteger, nullable=False),
    PrimaryKeyConstraint("file_id", "seq", "entity_id", name="entity_mentions_pkey"),
    Index("entity_mentions_entity_idx", "entity_id", "file_id", "seq"),
)

entity_relations = Table(  # typed relations a chunk's sentences state (migration 0025)
    "entity_relations", metadata,
    Column("tenant_id", UUID(as_uuid=True), nullable=False),
    _fk("subject_id", "entities.id"),
    _fk("object_id", "entities.id"),
    Column("type", Text, nullable=False),
    _fk("file_id", "files.id"),
    Column("seq", Integer, nullable=False),
    Column("source_id", UUID(as_uuid=True), nullable=False),
    PrimaryKeyConstraint("file_id", "seq", "subject_id", "object_id", "type", name="entity_relations_pkey"),
    Index("entity_relations_subject_idx", "subject_id"),
    Index("entity_relations_object_idx", "object_id"),
)

entity_rules = Table(  # an administrator's aliases and blocked names (migration 0025)
    "entity_rules", metadata,
    _fk("tenant_id", "tenants.id"),
    Column("kind", Text, nullable=False),
    Column("key", Text, nullable=False),
    Column("target_key", Text),
    Column("target_name", Text),
    PrimaryKeyConstraint("tenant_id", "key", name="entity_rules_pkey"),
    CheckConstraint("kind = ANY (ARRAY['alias'::text, 'block'::text])", name="entity_rules_kind_check"),
    CheckConstraint("(kind = 'alias'::text) = (target_key IS NOT NULL)", name="entity_rules_check"),
)

embedding_rate = Table(  # each embedding process's recent rate per tenant and model (migration 0022)
    "embedding_rate", metadata,
    _fk("tenant_id", "tenants.id"),
    Column("model", Text, nullable=False),
    Column("holder", Text, nullable=False),
    Column("chunks_per_s", Double, nullable=False),
    Column("updated_at", TIMESTAMP(timezone=True), nullable=False, server_default=text("now()")),
    PrimaryKeyConstraint("tenant_id", "model", "holder", name="embedding_rate_pkey"),
)

grants = Table(
    "grants", metadata,
    _id(),
    _fk("tenant_id", "tenants.id"),
    _fk("source_id", "sources.id"),
    Column("file_key", Text),
    Column("subject", Text, nullable=False),
    _now("created_at"),
    UniqueConstraint("source_id", "file_key", "subject", name="grants_source_id_file_key_subject_key",
                     postgresql_nulls_not_distinct=True),
    Index("grants_subject_idx", "tenant_id", "subject"),
    CheckConstraint("subject ~ '^(user|group):.+$'::text", name="grants_subject_check"),
)

tokens = Table(
    "tokens", metadata,
    _uuid_id(),
    Column("lookup_id", Text, nullable=False),
    _fk("tenant_id", "tenants.id", nullable=True),
    Column("kind", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("subject", Text, nullable=False),
    Column("groups", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    Column("scopes", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    Column("hash", Text, nullable=False),
    Column("managed_by", Text, nullable=False, server_default=text("'cli'::text")),
    _now("created_at"),
    Column("expires_at", _TS),
    Column("revoked_at", _TS),
    Column("fingerprint", LargeBinary),
    UniqueConstraint("lookup_id", name="tokens_lookup_id_key"),
    CheckConstraint("(kind = 'admin'::text) = (tenant_id IS NULL)", name="tokens_check"),
    CheckConstraint("kind = ANY (ARRAY['tenant'::text, 'admin'::text])", name="tokens_kind_check"),
    CheckConstraint(_MANAGED_BY, name="tokens_managed_by_check"),
)

audit = Table(
    "audit", metadata,
    _id(),
    _now("ts"),
    Column("tenant_id", UUID(as_uuid=True)),
    Column("principal", Text, nullable=False),
    Column("token_id", UUID(as_uuid=True)),
    Column("tool", Text, nullable=False),
    Column("arguments", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("source_ids", ARRAY(UUID(as_uuid=True)), nullable=False, server_default=text("'{}'::uuid[]")),
    Column("keys", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    _count("row_count", Integer),
    Column("status", Text, nullable=False),
    Column("error", Text),
    Column("client_ip", Text),
    Column("duration_ms", REAL),
    Column("request_id", Text),
    Index("audit_status_ts_idx", "status", text("ts DESC")),
    Index("audit_tenant_ts_idx", "tenant_id", text("ts DESC")),
    Index("audit_tool_ts_idx", "tool", text("ts DESC")),
)

server_keys = Table(
    "server_keys", metadata,
    Column("name", Text, primary_key=True),
    Column("secret", LargeBinary, nullable=False),
    _now("created_at"),
    CheckConstraint("length(secret) >= 32", name="server_keys_secret_check"),
)

rate_buckets = Table(
    "rate_buckets", metadata,
    Column("key", Text, primary_key=True),
    Column("tokens", Double, nullable=False),
    Column("capacity", Double, nullable=False),
    Column("rate", Double, nullable=False),
    Column("stamp", _TS, nullable=False),
)

# The index state searches are cut from (migration 0014: triggers bump it; no foreign keys, see there):
# `generation` for content, grants and policy, `vector_generation` for vectors written (migration 0018),
# `entity_generation` for entity mentions read (migration 0026).
index_generations = Table(
    "index_generations", metadata,
    Column("tenant_id", UUID(as_uuid=True), nullable=False),
    Column("scope", UUID(as_uuid=True), nullable=False),  # a source id, or the tenant id
    Column("shard", SmallInteger, nullable=False),
    Column("generation", BigInteger, nullable=False),
    _count("vector_generation"),
    _count("entity_generation"),
    PrimaryKeyConstraint("tenant_id", "scope", "shard", name="index_generations_pkey"),
)

_OPEN_JOB = "state = ANY (ARRAY['queued'::text, 'listing'::text, 'running'::text])"
_OPEN_ITEM = "state = ANY (ARRAY['queued'::text, 'running'::text])"

crawl_jobs = Table(
    "crawl_jobs", metadata,
    _id(),
    _fk("tenant_id", "tenants.id"),
    _fk("source_id", "sources.id"),
    Column("state", Text, nullable=False, server_default=text("'queued'::text")),
    Column("reason", Text, nullable=False, server_default=text("'manual'::text")),
    Column("scheduled_for", _TS),
    _now("run_after"),
    Column("leased_by", Text),
    Column("lease_expires_at", _TS),
    _count("attempts", Integer),
    Column("last_error", Text),
    _now("created_at"),
    Column("started_at", _TS),
    Column("listed_at", _TS),
    Column("finished_at", _TS),
    *(_count(name) for name in ("listed", "excluded", "unchanged", "deleted", "queued_files", "indexed",
                                "failed", "chunks", "bytes")),
    Column("problems", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Index("crawl_jobs_one_active_idx", "source_id", unique=True,
          postgresql_where=text("state = ANY (ARRAY['listing'::text, 'running'::text])")),
    Index("crawl_jobs_one_queued_idx", "source_id", unique=True, postgresql_where=text("state = 'queued'::text")),
    Index("crawl_jobs_open_idx", "run_after", "id", postgresql_where=text(_OPEN_JOB)),
    Index("crawl_jobs_slot_idx", "source_id", "scheduled_for", unique=True),
    Index("crawl_jobs_source_created_idx", "source_id", text("created_at DESC")),
    Index("crawl_jobs_tenant_idx", "tenant_id"),
    CheckConstraint("state <> 'listing'::text OR leased_by IS NOT NULL AND lease_expires_at IS NOT NULL",
                    name="crawl_jobs_check"),
    CheckConstraint("reason = ANY (ARRAY['manual'::text, 'schedule'::text])", name="crawl_jobs_reason_check"),
    CheckConstraint("state = ANY (ARRAY['queued'::text, 'listing'::text, 'running'::text, 'done'::text, "
                    "'failed'::text])", name="crawl_jobs_state_check"),
)

crawl_items = Table(
    "crawl_items", metadata,
    _id(),
    _fk("job_id", "crawl_jobs.id"),
    Column("tenant_id", UUID(as_uuid=True), nullable=False),
    Column("source_id", UUID(as_uuid=True), nullable=False),
    Column("key", Text, nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("mtime", _TS),
    Column("etag", Text),
    Column("storage_class", Text),
    Column("owner", Text),
    Column("mode", Integer),
    Column("uid", Integer),
    Column("gid", Integer),
    Column("had_file", Boolean, nullable=False, server_default=text("true")),
    Column("state", Text, nullable=False, server_default=text("'queued'::text")),
    Column("leased_by", Text),
    Column("lease_expires_at", _TS),
    _count("attempts", Integer),
    Column("last_error", Text),
    Column("file_status", Text),
    Column("chunk_count", Integer),
    Column("finished_at", _TS),
    Column("sidecar_key", Text),
    Column("started_at", _TS),
    Column("permission_set", BigInteger),  # 0023
    _count("breaks", Integer),
    UniqueConstraint("job_id", "key", name="crawl_items_job_id_key_key"),
    Index("crawl_items_holder_idx", "leased_by", postgresql_where=text("state = 'running'::text")),
    Index("crawl_items_job_open_idx", "job_id", postgresql_where=text(_OPEN_ITEM)),
    Index("crawl_items_open_idx", "id", postgresql_where=text(_OPEN_ITEM)),
    Index("crawl_items_source_open_idx", "source_id", "id", postgresql_where=text(_OPEN_ITEM)),
    CheckConstraint("state <> 'running'::text OR leased_by IS NOT NULL AND lease_expires_at IS NOT NULL",
                    name="crawl_items_check"),
    CheckConstraint("state = ANY (ARRAY['queued'::text, 'running'::text, 'done'::text, 'failed'::text])",
                    name="crawl_items_state_check"),
)
