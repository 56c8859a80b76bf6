-- Members of archives and e-mails (issue 14): an archive entry or an attachment is a file row of its own,
-- key = the listed file's key + '!/' + the member path ('bundle.zip!/docs/a.md', nested
-- 'a.zip!/b.tar.gz!/c.md'), with parent_id = the id of the LISTED (top-level) file it came from, at any
-- depth: one hop replaces or deletes all of a file's members, and a member's download starts from the
-- one file its connector can open. Children are told apart by parent_id, never by '!/' in the key (a real
-- folder may be called 'x!'). Deleting a parent deletes its members (cascade); the worker subtracts their
-- BM25 statistics first, as for any file (kdbl_core.db.content).

ALTER TABLE files ADD COLUMN parent_id bigint REFERENCES files (id) ON DELETE CASCADE;
CREATE INDEX files_parent_idx ON files (parent_id) WHERE parent_id IS NOT NULL;

-- Row-level security: members carry their parent's tenant and source, so every policy on files, chunks and
-- postings covers them as it covers any file. A file granted one by one (grants.file_key) also grants its
-- members: they are found through this definer function, because a policy on files cannot itself read files.
CREATE FUNCTION kdbl_granted_members() RETURNS SETOF bigint
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
        SELECT c.id FROM public.files c
          JOIN public.files p ON p.id = c.parent_id
          JOIN public.grants g ON g.source_id = p.source_id AND g.file_key = p.key
         WHERE g.tenant_id = public.kdbl_tenant() AND c.tenant_id = public.kdbl_tenant()
           AND g.subject = ANY (public.kdbl_subjects())
    $$;
REVOKE ALL ON FUNCTION kdbl_granted_members() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION kdbl_granted_members() TO kdbl_api;

CREATE OR REPLACE FUNCTION kdbl_granted_files() RETURNS SETOF bigint
    LANGUAGE sql STABLE
    AS $$
        SELECT f.id FROM files f
          JOIN grants g ON g.source_id = f.source_id AND g.file_key = f.key
         WHERE g.tenant_id = kdbl_tenant() AND g.subject = ANY (kdbl_subjects())
        UNION ALL
        SELECT m.id FROM kdbl_granted_members() AS m(id)
    $$;

DROP POLICY api_read ON files;
CREATE POLICY api_read ON files FOR SELECT TO kdbl_api
    USING (tenant_id = kdbl_tenant()
           AND (source_id IN (SELECT ws.id FROM kdbl_whole_sources() AS ws(id))
                OR (source_id, key) IN (SELECT g.source_id, g.file_key FROM grants g
                                         WHERE g.file_key IS NOT NULL
                                           AND g.subject = ANY (kdbl_subjects()))
                OR id IN (SELECT gm.id FROM kdbl_granted_members() AS gm(id))));
