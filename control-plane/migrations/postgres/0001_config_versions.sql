-- Postgres translation of ../0001_config_versions.sql (with 0002's final
-- update trigger): every committed configuration, one row per version. The
-- current configuration is the row with the highest version; version 0 (the
-- empty configuration) has no row. History is append-only. Several control
-- planes share these rows: each writer holds the advisory lock of
-- src/store/db.rs for its transaction, so versions are appended one at a time.
CREATE TABLE config_versions (
    -- 1, 2, 3, ... without gaps (enforced by the trigger below).
    version    BIGINT PRIMARY KEY CHECK (version > 0),
    -- prost-encoded gateway.v1.ConfigSnapshot (see the SQLite schema).
    snapshot   BYTEA  NOT NULL,
    -- Keyed digest of the content (gateway_proto::hash, key in hash_key).
    hash       TEXT   NOT NULL,
    -- Commit time, RFC 3339 UTC, from the committing control plane's clock.
    created_at TEXT   NOT NULL,
    -- One-line description, e.g. `upsert route "orders"`.
    summary    TEXT   NOT NULL,
    -- Who committed it: an admin token's name, or 'anonymous'.
    author     TEXT   NOT NULL DEFAULT 'anonymous'
);

-- Versions are consecutive: a writer must insert exactly MAX(version) + 1.
CREATE FUNCTION config_versions_consecutive() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.version <> COALESCE((SELECT MAX(version) FROM config_versions), 0) + 1 THEN
        RAISE EXCEPTION 'config_versions: versions must be consecutive';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER config_versions_consecutive
BEFORE INSERT ON config_versions
FOR EACH ROW EXECUTE FUNCTION config_versions_consecutive();

-- History is append-only: committed versions are never changed or removed.
-- `hash` alone may be rewritten, once, when the hash key is made (as in SQLite).
CREATE FUNCTION config_versions_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'config_versions: history is append-only';
END
$$;

CREATE TRIGGER config_versions_no_update
BEFORE UPDATE OF version, snapshot, created_at, summary, author ON config_versions
FOR EACH ROW EXECUTE FUNCTION config_versions_append_only();

CREATE TRIGGER config_versions_no_delete
BEFORE DELETE ON config_versions
FOR EACH ROW EXECUTE FUNCTION config_versions_append_only();

CREATE TRIGGER config_versions_no_truncate
BEFORE TRUNCATE ON config_versions
FOR EACH STATEMENT EXECUTE FUNCTION config_versions_append_only();
