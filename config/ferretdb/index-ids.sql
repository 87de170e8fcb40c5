-- Run once by PostgreSQL's first start (the official image runs /docker-entrypoint-initdb.d/*.sql;
-- so does scripts/stack/postgres-entrypoint.sh), in the database FerretDB uses.
--
-- FerretDB 1.24 asks PostgreSQL for a document by `_id` as `_jsonb -> '_id' @> value`. Its own
-- `_id` index is a btree on `_jsonb -> '_id'`, which serves `=` but not `@>`, so every lookup by
-- `_id` reads the whole table: each `$inc` of a rollup, each document a tail asks for. With
-- rollups of hashtags that was 4.5 ms a lookup at 12,800 rollups and 27 events/s at most on a
-- 2-core machine; with a GIN index on the same expression, 0.46 ms, and 70 events/s held
-- (docs/BENCHMARKS.md, "FerretDB on PostgreSQL").
--
-- FerretDB creates its tables when a collection is first written, so this adds the index to
-- every table created later that has FerretDB's `_jsonb` column, in any schema (one per
-- MongoDB database). Creating an event trigger needs a superuser: POSTGRES_USER is one.
CREATE OR REPLACE FUNCTION index_ferretdb_ids() RETURNS event_trigger
LANGUAGE plpgsql AS $$
DECLARE
  created record;
BEGIN
  FOR created IN
    SELECT objid, object_identity FROM pg_event_trigger_ddl_commands()
    WHERE command_tag = 'CREATE TABLE' AND object_type = 'table'
  LOOP
    IF EXISTS (SELECT 1 FROM pg_attribute
               WHERE attrelid = created.objid AND attname = '_jsonb' AND NOT attisdropped) THEN
      EXECUTE format('CREATE INDEX ON %s USING gin ((_jsonb -> ''_id'') jsonb_path_ops)',
                     created.object_identity);
    END IF;
  END LOOP;
END
$$;

DROP EVENT TRIGGER IF EXISTS index_ferretdb_ids;
CREATE EVENT TRIGGER index_ferretdb_ids ON ddl_command_end
  WHEN TAG IN ('CREATE TABLE') EXECUTE FUNCTION index_ferretdb_ids();
