-- The Ed25519 signing keys and their rotation schedule, shared by every auth
-- service of the database (src/shared_keys.rs), so they all sign with the
-- current key and publish the same JWKS. The schedule is applied under an
-- advisory lock: a rotation happens once, whichever replica gets there first.
-- Times are Unix seconds, as in a key directory's <kid>.json.
CREATE TABLE signing_keys (
    -- RFC 7638 thumbprint of the public key.
    kid          TEXT    PRIMARY KEY,
    alg          TEXT    NOT NULL CHECK (alg = 'EdDSA'),
    created_at   BIGINT  NOT NULL,
    activates_at BIGINT  NOT NULL,
    -- Set once a successor exists; the key is deleted after it.
    retires_at   BIGINT,
    -- The PKCS#8 private key, sealed with AES-256-GCM under the
    -- --keys-secret-file key with the kid as associated data.
    nonce        BYTEA   NOT NULL CHECK (length(nonce) = 12),
    sealed_key   BYTEA   NOT NULL
);
