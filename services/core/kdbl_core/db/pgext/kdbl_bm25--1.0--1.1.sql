-- kdbl_bm25 1.0 -> 1.1 (issue 27): the same C functions, range-checked (kdbl_bm25.c), and the privileges
-- and aggregate markings of a fresh 1.1 (kdbl_bm25--1.1.sql).
\echo Use "ALTER EXTENSION kdbl_bm25 UPDATE TO '1.1'" to load this file. \quit

-- 1.0 left the aggregates PARALLEL UNSAFE (the default) while their support functions are SAFE.
CREATE OR REPLACE AGGREGATE kdbl_bm25_pack(bigint, integer, integer) (
    SFUNC = kdbl_bm25_pack_step, STYPE = internal, FINALFUNC = kdbl_bm25_pack_final,
    FINALFUNC_MODIFY = READ_WRITE, PARALLEL = SAFE
);
CREATE OR REPLACE AGGREGATE kdbl_bm25_topk(bytea, bigint, integer, integer, float8, float8, float8, integer,
                                           bigint[]) (
    SFUNC = kdbl_bm25_topk_step, STYPE = internal, FINALFUNC = kdbl_bm25_topk_final,
    FINALFUNC_MODIFY = READ_WRITE, PARALLEL = SAFE
);

-- 1.0 let every role call them (EXECUTE to PUBLIC, the default); now the database's owner, who grants on.
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
