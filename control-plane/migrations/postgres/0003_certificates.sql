-- Postgres translation of ../0003_certificates.sql: one check value sealed
-- with the --secrets-key-file key, written with the first private key ever
-- stored. While it exists, a control plane starts only with that same key,
-- so every replica sharing this database must be given the same key file.
CREATE TABLE secrets_key_check (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    nonce      BYTEA   NOT NULL CHECK (length(nonce) = 12),
    ciphertext BYTEA   NOT NULL
);
