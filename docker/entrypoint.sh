#!/bin/bash
# gateway-entrypoint: prepares what a service needs on first start, then execs the binary
# (so it runs as PID 1 and receives SIGTERM from `docker stop` / `--scale` down directly).
#
#   control-plane ...  unless --auth-tokens-file is given, writes one from GATEWAY_ADMIN_TOKEN,
#                      GATEWAY_DATA_PLANE_TOKEN and GATEWAY_VIEWER_TOKEN (compose's .env; any may be
#                      empty, not all) to $GATEWAY_TOKENS_FILE (default /var/lib/gateway/auth-tokens)
#                      as SHA-256 digests under the names compose-admin, compose-data-plane and
#                      compose-viewer, and adds --auth-tokens-file. A token shorter than 32
#                      characters, or with spaces, stops the container with the reason. The tokens
#                      are removed from the environment before the control plane starts.
#                      Unless --secrets-key-file is given, a non-empty GATEWAY_SECRETS_KEY (64 hex
#                      digits) is written to $GATEWAY_SECRETS_KEY_FILE (default
#                      /run/gateway/secrets-key, in memory, mode 0600) and --secrets-key-file added: the
#                      key that encrypts certificates' private keys in the database.
#   data-plane ...     adds `--node-id $(hostname)` unless a node id is given: the container
#                      hostname is unique per replica and stable across `docker restart`.
#                      With GATEWAY_OPS_NET (the first three octets of a /24) and no
#                      --admin-listen, binds the ops listener to the container's address in that
#                      network only (`--admin-listen=ADDR:9901`, written to /tmp/ops-address for the
#                      healthcheck); no address there stops the container with the reason.
#   auth-service ...   when the database file (--database, else $AUTH_DATABASE) does not exist yet,
#                      first creates the users listed in GATEWAY_SEED_USERS ("name:password:role
#                      name:password:role ..."; none by default), then removes the variable from
#                      the server's environment.
#   mock-service ...   adds `--instance-id $(hostname)` unless an id is given (flag or
#                      MOCK_INSTANCE_ID): replicas of a scaled service answer with distinct ids.
#   anything else      runs as given.
set -euo pipefail

# Prints the value of option $1 (`--opt VALUE` or `--opt=VALUE`) among the remaining arguments.
option_value() {
  local name=$1; shift
  while [ $# -gt 0 ]; do
    case "$1" in
      "$name") echo "${2:-}"; return 0 ;;
      "$name"=*) echo "${1#*=}"; return 0 ;;
    esac
    shift
  done
  return 1
}

seed_users() {
  local db=$1 entry name password role
  echo "gateway-entrypoint: new auth database $db: adding the users from GATEWAY_SEED_USERS" >&2
  for entry in ${GATEWAY_SEED_USERS}; do
    IFS=: read -r name password role <<<"$entry"
    if [ -z "$name" ] || [ -z "$password" ] || [ -z "$role" ]; then
      echo "gateway-entrypoint: GATEWAY_SEED_USERS entry '$entry' is not name:password:role" >&2
      rm -f "$db"
      exit 64
    fi
    if ! printf '%s\n' "$password" | auth-service --database "$db" users add "$name" --role "$role" >&2; then
      # Leave no half-seeded database behind: the next start tries again from scratch.
      rm -f "$db" "$db-wal" "$db-shm"
      exit 1
    fi
  done
}

# The tokens the control plane's tokens file is written from: VARIABLE:NAME:ROLE.
TOKEN_VARS=(GATEWAY_ADMIN_TOKEN:compose-admin:admin GATEWAY_DATA_PLANE_TOKEN:compose-data-plane:data-plane
  GATEWAY_VIEWER_TOKEN:compose-viewer:viewer)

# Writes $1 from the non-empty GATEWAY_*_TOKEN variables, as SHA-256 digests (mode 0600). Every
# token is checked before anything is written.
write_tokens_file() {
  local file=$1 entry var name role token lines=
  for entry in "${TOKEN_VARS[@]}"; do
    IFS=: read -r var name role <<<"$entry"
    token=${!var:-}
    [ -n "$token" ] || continue
    if [ "${#token}" -lt 32 ]; then
      echo "gateway-entrypoint: $var is too short (${#token} characters, at least 32): generate one with 'openssl rand -hex 32'" >&2
      exit 64
    fi
    if ! [[ $token =~ ^[[:graph:]]+$ ]]; then
      echo "gateway-entrypoint: $var must be printable characters without spaces" >&2
      exit 64
    fi
    lines+="$name $role sha256:$(printf %s "$token" | sha256sum | cut -d' ' -f1)"$'\n'
  done
  (umask 077 && printf '# written by gateway-entrypoint at every start: SHA-256 of GATEWAY_*_TOKEN\n%s' "$lines" >"$file")
  echo "gateway-entrypoint: wrote $file ($(printf %s "$lines" | grep -c .) tokens, as SHA-256)" >&2
}

case "${1:-}" in
  control-plane)
    if ! option_value --auth-tokens-file "$@" >/dev/null &&
      [ -n "${GATEWAY_ADMIN_TOKEN:-}${GATEWAY_DATA_PLANE_TOKEN:-}${GATEWAY_VIEWER_TOKEN:-}" ]; then
      tokens_file=${GATEWAY_TOKENS_FILE:-/var/lib/gateway/auth-tokens}
      write_tokens_file "$tokens_file"
      set -- "$@" --auth-tokens-file "$tokens_file"
    fi
    if ! option_value --secrets-key-file "$@" >/dev/null && [ -n "${GATEWAY_SECRETS_KEY:-}" ]; then
      if ! [[ $GATEWAY_SECRETS_KEY =~ ^[0-9a-fA-F]{64}$ ]]; then
        echo "gateway-entrypoint: GATEWAY_SECRETS_KEY must be 64 hex digits: generate one with 'openssl rand -hex 32'" >&2
        exit 64
      fi
      # Never beside the database: /run/gateway is a tmpfs in compose and an in-memory
      # emptyDir in Kubernetes, so a copy of the database's volume holds no key.
      key_file=${GATEWAY_SECRETS_KEY_FILE:-/run/gateway/secrets-key}
      (umask 077 && printf '%s\n' "$GATEWAY_SECRETS_KEY" >"$key_file")
      # Earlier images wrote it into the database's volume: remove that copy.
      if [ "$key_file" != /var/lib/gateway/secrets-key ]; then
        rm -f /var/lib/gateway/secrets-key
      fi
      set -- "$@" --secrets-key-file "$key_file"
    fi
    # The control plane needs only the files.
    unset GATEWAY_ADMIN_TOKEN GATEWAY_DATA_PLANE_TOKEN GATEWAY_VIEWER_TOKEN GATEWAY_SECRETS_KEY
    ;;
  data-plane)
    if ! option_value --node-id "$@" >/dev/null; then
      set -- "$@" --node-id "$(hostname)"
    fi
    if [ -n "${GATEWAY_OPS_NET:-}" ] && ! option_value --admin-listen "$@" >/dev/null; then
      ops_addr=
      for a in $(hostname -I); do
        case "$a" in "$GATEWAY_OPS_NET".*) ops_addr=$a; break ;; esac
      done
      if [ -z "$ops_addr" ]; then
        echo "gateway-entrypoint: no address of this container is in GATEWAY_OPS_NET=$GATEWAY_OPS_NET.0/24 (its addresses: $(hostname -I)); is it attached to that network?" >&2
        exit 64
      fi
      printf '%s\n' "$ops_addr" >/tmp/ops-address
      set -- "$@" --admin-listen "$ops_addr:9901"
    fi
    ;;
  mock-service)
    if ! option_value --instance-id "$@" >/dev/null && [ -z "${MOCK_INSTANCE_ID:-}" ]; then
      set -- "$@" --instance-id "$(hostname)"
    fi
    ;;
  auth-service)
    db=$(option_value --database "$@") || db=${AUTH_DATABASE:-auth.db}
    if [ -n "${GATEWAY_SEED_USERS:-}" ] && [ ! -e "$db" ]; then
      seed_users "$db"
    fi
    unset GATEWAY_SEED_USERS
    ;;
esac
exec "$@"
