-- TLS certificates live inside the versioned snapshots, like every other
-- part of the configuration: config_versions.snapshot holds them under field
-- 10 (gateway.v1.Certificate, private_key_pem left empty) and their private
-- keys under field 11, each sealed with AES-256-GCM under the key of the
-- control plane's --secrets-key-file: the certificate's name, a 12-byte
-- random nonce, and the ciphertext with its tag (the name is the associated
-- data). So a rollback restores the certificates of an old version with
-- their keys, and no plaintext key is ever written to this file.
--
-- One check value sealed with that key, written in the same transaction as
-- the first private key ever stored. While it exists, the control plane
-- refuses to start without the key file, or with another key.
CREATE TABLE secrets_key_check (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    nonce      BLOB    NOT NULL CHECK (length(nonce) = 12),
    ciphertext BLOB    NOT NULL
);
