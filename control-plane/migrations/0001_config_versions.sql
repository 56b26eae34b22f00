-- Every committed configuration, one row per version. The current
-- configuration is the row with the highest version; version 0 (the empty
-- configuration) has no row. History is append-only.
CREATE TABLE config_versions (
    -- 1, 2, 3, ... without gaps (enforced by the trigger below).
    version    INTEGER PRIMARY KEY CHECK (version > 0),
    -- prost-encoded gateway.v1.ConfigSnapshot holding only routes and
    -- upstreams, each sorted by name: exactly the bytes `hash` is taken over.
    snapshot   BLOB    NOT NULL,
    -- Hex SHA-256 of `snapshot` (gateway_proto::config_hash).
    hash       TEXT    NOT NULL,
    -- Commit time, RFC 3339 UTC.
    created_at TEXT    NOT NULL,
    -- One-line description, e.g. `upsert route "orders"`.
    summary    TEXT    NOT NULL,
    -- Who committed it: an admin token's name, or 'anonymous'.
    author     TEXT    NOT NULL DEFAULT 'anonymous'
);

-- Versions are consecutive: a writer must insert exactly MAX(version) + 1.
CREATE TRIGGER config_versions_consecutive
BEFORE INSERT ON config_versions
WHEN NEW.version <> COALESCE((SELECT MAX(version) FROM config_versions), 0) + 1
BEGIN
    SELECT RAISE(ABORT, 'config_versions: versions must be consecutive');
END;

-- History is append-only: committed versions are never changed or removed.
CREATE TRIGGER config_versions_no_update
BEFORE UPDATE ON config_versions
BEGIN
    SELECT RAISE(ABORT, 'config_versions: history is append-only');
END;

CREATE TRIGGER config_versions_no_delete
BEFORE DELETE ON config_versions
BEGIN
    SELECT RAISE(ABORT, 'config_versions: history is append-only');
END;
