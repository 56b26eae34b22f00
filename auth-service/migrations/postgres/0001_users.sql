-- Postgres translation of ../0001_users.sql: users who can log in, shared by
-- every auth service given the same --database. Passwords are Argon2id PHC
-- strings; the plaintext is never stored.
CREATE TABLE IF NOT EXISTS users (
    id            BIGSERIAL   PRIMARY KEY,
    username      TEXT        NOT NULL UNIQUE,
    password_hash TEXT        NOT NULL,
    role          TEXT        NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);
