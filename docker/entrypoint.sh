#!/bin/bash
# gateway-entrypoint: prepares what a service needs on first start, then execs the binary
# (so it runs as PID 1 and receives SIGTERM from `docker stop` / `--scale` down directly).
#
#   data-plane ...     adds `--node-id $(hostname)` unless a node id is given: the container
#                      hostname is unique per replica and stable across `docker restart`.
#   auth-service ...   when the database file does not exist yet, first creates the users listed in
#                      GATEWAY_SEED_USERS ("name:password:role name:password:role ...").
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

case "${1:-}" in
  data-plane)
    if ! option_value --node-id "$@" >/dev/null; then
      set -- "$@" --node-id "$(hostname)"
    fi
    ;;
  mock-service)
    if ! option_value --instance-id "$@" >/dev/null && [ -z "${MOCK_INSTANCE_ID:-}" ]; then
      set -- "$@" --instance-id "$(hostname)"
    fi
    ;;
  auth-service)
    if [ -n "${GATEWAY_SEED_USERS:-}" ] && db=$(option_value --database "$@") && [ ! -e "$db" ]; then
      seed_users "$db"
    fi
    ;;
esac
exec "$@"
