-- Postgres translation of ../0002_hash_key.sql: the key of the keyed digests
-- that stand in for secrets in config_versions.hash. One row, 32 random
-- bytes, made by the first control plane that opens the database (under the
-- write lock, so replicas starting together agree on one key).
CREATE TABLE hash_key (
    id  INTEGER PRIMARY KEY CHECK (id = 1),
    key BYTEA   NOT NULL CHECK (length(key) = 32)
);
