# Sourced by scripts/bench when BENCH_CALLGRIND=1: instructions and cache misses per request,
# counted by valgrind's callgrind, for the plain and the full route, and the /match route (4 header
# matchers) beside the plain route called with the same 4 headers ("plain4h"), which isolates the
# matchers' cost from that of reading 4 more headers, and the /cached route (each request a HIT).
# Uses the stack scripts/bench started (control plane, auth service, Redis, nginx upstream) and its
# variables and functions (BIN, WORK, P_CP, AUTH, P_REDIS, AUTHZ, start, wait_for, log, die).
#
# Method (BENCHMARKS.md, "callgrind"): a second data plane, from a copy of the measured binary
# passed through `strip -g` (valgrind 3.19 does not read this toolchain's DWARF), runs under
# `valgrind --tool=callgrind --cache-sim=yes` next to the measured one. For each route: 3 s of
# `wrk -t1 -c16` to warm it, `callgrind_control -z`, `wrk -t1 -c16 -d6s`, `callgrind_control -d`;
# the dump's totals divided by wrk's request count. Counts do not depend on the machine's load,
# unlike requests per second: this is the figure to compare across commits.
#
# Env: CALLGRIND_SECONDS=6  CALLGRIND_CONNECTIONS=16
#      CALLGRIND_OPTS   more valgrind options, e.g. --dump-instr=yes (costs per instruction, for
#                       callgrind_annotate or objdump; with BENCH_KEEP=1 the dumps stay in the work directory)

callgrind_measure() {
  command -v callgrind_control >/dev/null 2>&1 || die "valgrind is missing: apt-get install -y valgrind"
  local secs=${CALLGRIND_SECONDS:-6} conns=${CALLGRIND_CONNECTIONS:-16}
  local ports cg_port cg_ops
  ports=$(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]
print(" ".join(str(x.getsockname()[1]) for x in s))')
  read -r cg_port cg_ops <<<"$ports"
  cp "$BIN/data-plane" "$WORK/data-plane-cg"
  strip -g "$WORK/data-plane-cg"
  mkdir -p "$WORK/cg-cache"
  log "starting a data plane under callgrind :$cg_port (ops :$cg_ops); slow to start"
  # shellcheck disable=SC2086 # CALLGRIND_OPTS is a list of options, split on purpose
  start data-plane-cg env RUST_LOG="${DP_RUST_LOG:-info,access=off}" DP_CONTROL_PLANE_TOKEN="$BENCH_DP_TOKEN" valgrind --tool=callgrind --cache-sim=yes ${CALLGRIND_OPTS:-} \
    --callgrind-out-file="$WORK/callgrind.out.%p" "$WORK/data-plane-cg" \
    --listen "127.0.0.1:$cg_port" --admin-listen "127.0.0.1:$cg_ops" \
    --control-plane "http://127.0.0.1:$P_CP" --node-id callgrind --cache-dir "$WORK/cg-cache" \
    --jwks-url "$AUTH/.well-known/jwks.json" --redis-url "redis://127.0.0.1:$P_REDIS"
  wait_for "the callgrind data plane's /readyz" data-plane-cg 300 curl -sf -o /dev/null "http://127.0.0.1:$cg_ops/readyz"
  wait_for "the callgrind data plane's plain route" data-plane-cg 60 curl -sf -o /dev/null "http://127.0.0.1:$cg_port/plain"
  local pid=$PID_data_plane_cg
  local route url header out requests dump summary
  printf '\n%-7s %12s %10s %10s %10s %10s %10s\n' route requests instr I1miss D1rmiss D1wmiss "LLmiss" >&2
  for route in plain full plain4h matched cached; do
    url="http://127.0.0.1:$cg_port/$route"
    header=()
    [ "$route" = full ] && header=(-H "$AUTHZ")
    [ "$route" = plain4h ] && url="http://127.0.0.1:$cg_port/plain" && header=("${MATCH_HEADERS[@]}")
    [ "$route" = matched ] && url="http://127.0.0.1:$cg_port/match" && header=("${MATCH_HEADERS[@]}")
    if [ "$route" = full ] && [ -z "${FULL_OK:-}" ]; then
      log "the full route is not measured (it did not answer 200 with a token)"
      continue
    fi
    # wrk's -H with an empty array would send an empty header: only pass it when set.
    wrk -t1 "-c$conns" -d3s "${header[@]}" "$url" >/dev/null
    callgrind_control -z "$pid" >/dev/null
    out=$(wrk -t1 "-c$conns" "-d${secs}s" "${header[@]}" "$url")
    callgrind_control -d "$pid" >/dev/null
    requests=$(printf '%s\n' "$out" | awk '/requests in/ {print $1}')
    non2xx=$(printf '%s\n' "$out" | awk '/Non-2xx/ {print $NF}')
    [ -z "$non2xx" ] || die "$route: $non2xx non-2xx answers under callgrind: $out"
    [ -n "$requests" ] && [ "$requests" -gt 0 ] || die "$route: no request counted by wrk: $out"
    dump=$(ls -t "$WORK"/callgrind.out."$pid".* 2>/dev/null | head -n 1)
    [ -n "$dump" ] || die "$route: callgrind wrote no dump"
    # The totals line ("summary:", or "totals:") in the order of the "events:" line.
    summary=$(awk '
      /^events:/ { for (i = 2; i <= NF; i++) col[$i] = i }
      /^(summary|totals):/ && !done {
        print $col["Ir"], $col["I1mr"], $col["D1mr"], $col["D1mw"], $col["ILmr"] + $col["DLmr"] + $col["DLmw"]
        done = 1
      }' "$dump")
    [ -n "$summary" ] || die "$route: no totals in $dump"
    # shellcheck disable=SC2086
    set -- $summary
    awk -v r="$route" -v n="$requests" -v ir="$1" -v i1="$2" -v d1r="$3" -v d1w="$4" -v ll="$5" \
      'BEGIN { printf "%-7s %12d %10.0f %10.1f %10.1f %10.1f %10.1f\n", r, n, ir / n, i1 / n, d1r / n, d1w / n, ll / n }' >&2
  done
  log "per request, from $BUILT_FROM"
}
