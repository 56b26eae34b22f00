-- The key of the keyed digests that stand in for secrets (upstreams'
-- identity_signing_secret, API keys' key_sha256) in config_versions.hash, so
-- the hash every viewer sees lets no one test a guessed secret offline.
-- One row, 32 random bytes, made by the control plane at first open; it
-- never leaves this file, which holds the secrets themselves anyway.
CREATE TABLE hash_key (
    id  INTEGER PRIMARY KEY CHECK (id = 1),
    key BLOB    NOT NULL CHECK (length(key) = 32)
);

-- `hash` is derived from `snapshot` and the key: it is recomputed once, when
-- the key is made for a database whose versions were hashed without one.
-- Everything else about a committed version stays append-only. (This
-- supersedes the comment on `hash` in 0001, which stays as it was: sqlx
-- refuses a database whose applied migrations changed.)
DROP TRIGGER config_versions_no_update;

CREATE TRIGGER config_versions_no_update
BEFORE UPDATE OF version, snapshot, created_at, summary, author ON config_versions
BEGIN
    SELECT RAISE(ABORT, 'config_versions: history is append-only');
END;
