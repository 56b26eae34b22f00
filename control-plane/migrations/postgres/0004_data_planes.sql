-- The data-plane registry, shared by every control plane of this database
-- (src/nodes/shared.rs), so ListDataPlanes on any replica lists every data
-- plane. With SQLite the registry stays in the one control plane's memory.

-- One row per control plane process, alive while it beats: a data plane
-- whose control plane stopped beating is DISCONNECTED.
CREATE TABLE control_planes (
    -- Random per process start.
    id           TEXT        PRIMARY KEY,
    -- The listen address it reported, for operators.
    listen       TEXT        NOT NULL,
    started_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- The database's clock, so replicas' clocks never need to agree.
    heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- One row per data plane ever seen; the last stream it opened owns the row.
CREATE TABLE data_planes (
    node_id           TEXT    PRIMARY KEY,
    hostname          TEXT    NOT NULL,
    build_version     TEXT    NOT NULL,
    -- The control plane that holds its stream, and which stream of that
    -- process: a stale stream of a node that reconnected elsewhere cannot
    -- overwrite the row.
    control_plane     TEXT    NOT NULL,
    stream            BIGINT  NOT NULL,
    -- When that stream opened (Unix ms, its control plane's clock): of two
    -- control planes that each think they hold the node, the later stream wins.
    connected_at      BIGINT  NOT NULL,
    -- The stream is open (as its control plane last said).
    connected         BOOLEAN NOT NULL,
    acked_version     BIGINT,
    last_nack_version BIGINT,
    last_nack_error   TEXT    NOT NULL DEFAULT '',
    -- RFC 3339 UTC, from the control plane's clock.
    last_seen         TEXT    NOT NULL,
    -- When a control plane last wrote the row (the database's clock): a data
    -- plane that is not connected and was not written for an hour is forgotten.
    updated_at        TIMESTAMPTZ NOT NULL DEFAULT now()
);
