-- kdbl_bm25 1.1: see kdbl_bm25.c for what each function computes. Pure functions of their arguments.
\echo Use "CREATE EXTENSION kdbl_bm25" to load this file. \quit

CREATE FUNCTION kdbl_bm25_pack_step(internal, bigint, integer, integer) RETURNS internal
    AS 'MODULE_PATHNAME', 'kdbl_bm25_pack_step' LANGUAGE C CALLED ON NULL INPUT PARALLEL SAFE;
CREATE FUNCTION kdbl_bm25_pack_final(internal) RETURNS bytea
    AS 'MODULE_PATHNAME', 'kdbl_bm25_pack_final' LANGUAGE C PARALLEL SAFE;
CREATE AGGREGATE kdbl_bm25_pack(bigint, integer, integer) (
    SFUNC = kdbl_bm25_pack_step, STYPE = internal, FINALFUNC = kdbl_bm25_pack_final,
    FINALFUNC_MODIFY = READ_WRITE, PARALLEL = SAFE
);

CREATE FUNCTION kdbl_bm25_unpack(bytea, OUT chunk_id bigint, OUT tf integer, OUT dl integer)
    RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'kdbl_bm25_unpack' LANGUAGE C STRICT IMMUTABLE PARALLEL SAFE;

CREATE FUNCTION kdbl_bm25_topk_step(internal, bytea, bigint, integer, integer, float8, float8, float8,
                                    integer, bigint[]) RETURNS internal
    AS 'MODULE_PATHNAME', 'kdbl_bm25_topk_step' LANGUAGE C CALLED ON NULL INPUT PARALLEL SAFE;
CREATE FUNCTION kdbl_bm25_topk_final(internal) RETURNS float8[]
    AS 'MODULE_PATHNAME', 'kdbl_bm25_topk_final' LANGUAGE C PARALLEL SAFE;
-- (list, chunk_id, tf, dl, weight, k1b_avgdl, k1_1mb, k, exclude)
CREATE AGGREGATE kdbl_bm25_topk(bytea, bigint, integer, integer, float8, float8, float8, integer, bigint[]) (
    SFUNC = kdbl_bm25_topk_step, STYPE = internal, FINALFUNC = kdbl_bm25_topk_final,
    FINALFUNC_MODIFY = READ_WRITE, PARALLEL = SAFE
);

-- Nobody may call these but the database's owner, who may grant them on (K-Lake's migrator, as the
-- owner, grants kdbl_bm25_topk to kdbl_api, kdbl_bm25_pack to kdbl_worker, both and kdbl_bm25_unpack to
-- kdbl_admin: kdbl_core.db.pgext.INSTALL_SQL). Creating the extension takes a superuser (it is not
-- trusted, as pgvector is not), who need not be that owner, hence the grant to pg_database_owner. The
-- support functions are granted to no one: an aggregate checks its owner's right to them.
REVOKE ALL ON FUNCTION kdbl_bm25_pack_step(internal, bigint, integer, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION kdbl_bm25_pack_final(internal) FROM PUBLIC;
REVOKE ALL ON FUNCTION kdbl_bm25_pack(bigint, integer, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION kdbl_bm25_unpack(bytea) FROM PUBLIC;
REVOKE ALL ON FUNCTION kdbl_bm25_topk_step(internal, bytea, bigint, integer, integer, float8, float8, float8,
                                           integer, bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION kdbl_bm25_topk_final(internal) FROM PUBLIC;
REVOKE ALL ON FUNCTION kdbl_bm25_topk(bytea, bigint, integer, integer, float8, float8, float8, integer, bigint[])
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION kdbl_bm25_pack(bigint, integer, integer), kdbl_bm25_unpack(bytea),
    kdbl_bm25_topk(bytea, bigint, integer, integer, float8, float8, float8, integer, bigint[])
    TO pg_database_owner WITH GRANT OPTION;
