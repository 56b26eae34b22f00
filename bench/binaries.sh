# Sourced by scripts/bench and scripts/build-pgo: the one list of the programs the benchmark's
# stack runs, and the two steps that use it (issue 48: scripts/build-pgo once copied three of the
# four into its training directory, and every fresh clone's `scripts/bench` failed on the fourth).
# Each binary is the bin target of the same name in the workspace package of the same name.
#
# BENCH_DRY_RUN=1 (scripts/bench's dry run): bench_stage writes a placeholder that stands for the
# file the build would have made, so that the rest of the run (the check below, build-pgo's
# training directory, BENCH_BIN_DIR) is exercised on the real list without building anything.

# The services beside the data plane (built with the ordinary profiles in scripts/build-pgo).
BENCH_SERVICES=(control-plane auth-service mock-service)
# Everything the stack runs.
BENCH_BINARIES=("${BENCH_SERVICES[@]}" data-plane)

# bench_cargo_args NAME...: `-p NAME` for each, for cargo build.
bench_cargo_args() {
  local name
  for name; do printf -- '-p\n%s\n' "$name"; done
}

# bench_check_targets NAME...: each NAME is a package of this workspace with a bin target of that
# name (cargo metadata, nothing built): what a dry run checks instead of building.
bench_check_targets() {
  local meta
  meta=$(cargo metadata --no-deps --format-version 1) || { echo "error: cargo metadata failed" >&2; return 1; }
  printf '%s' "$meta" | python3 -c '
import json, sys
meta = json.load(sys.stdin)
bins = {(p["name"], t["name"]) for p in meta["packages"] for t in p["targets"] if "bin" in t["kind"]}
missing = [n for n in sys.argv[1:] if (n, n) not in bins]
if missing:
    sys.exit("error: no workspace package builds the binary " + ", ".join(missing) + " (cargo metadata)")
' "$@"
}

# bench_stage SRC_DIR DEST_DIR NAME...: copies the built binaries NAME from SRC_DIR into DEST_DIR.
# In a dry run SRC_DIR need not exist: a placeholder script stands for each file.
bench_stage() {
  local src=$1 dest=$2 name
  shift 2
  mkdir -p "$dest"
  for name; do
    if [ "${BENCH_DRY_RUN:-}" = 1 ]; then
      printf '#!/bin/sh\necho "dry-run placeholder for %s/%s" >&2\nexit 1\n' "$src" "$name" >"$dest/$name"
      chmod +x "$dest/$name"
    else
      [ -x "$src/$name" ] || { echo "error: $src/$name was not built" >&2; return 1; }
      cp "$src/$name" "$dest/$name"
    fi
  done
}

# bench_check_bin_dir DIR: every binary of the stack is in DIR and executable.
bench_check_bin_dir() {
  local name missing=()
  for name in "${BENCH_BINARIES[@]}"; do
    [ -x "$1/$name" ] || missing+=("$name")
  done
  if [ "${#missing[@]}" != 0 ]; then
    echo "error: $1 lacks ${missing[*]} (the bench stack runs: ${BENCH_BINARIES[*]}; bench/binaries.sh)" >&2
    return 1
  fi
}
