#!/usr/bin/env bash
# Test-only tooling, installed before `cargo test` runs (cargo test itself
# installs nothing). Idempotent; PyPI only. `make test` calls it.
#   1. the official A2A conformance kit, unpacked from the shared tools
#      folder into .tools/a2a-tck with its own venv (its pins:
#      service/tests/py/a2a-tck-constraints.txt)
#   2. the official A2A Python SDK in .tools/a2a-sdk-venv
#      (service/tests/py/a2a-sdk-requirements.txt)
#   3. the Python client (service/clients/python) with its test pins in
#      .tools/py-client-venv (service/clients/python/requirements-test.txt),
#      re-installed when the pins or the package's files change
#   4. redis-server and haproxy from Debian's packages (the replica and
#      embed-queue tests start their own, on loopback, and stop them)
#   5. chromium and chromium-driver from Debian's packages (the /ui page's
#      test drives a headless Chromium through chromedriver, and stops both)
#   6. jq from Debian's packages (the README's gRPC example reads the session
#      token with it; service/clients/python/tests/test_readme.py runs it)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
TOOLS="$ROOT/.tools"
SHARED="${SCD_SHARED_DIR:-$ROOT/../shared}"
PY="${PYTHON:-python3}"
say() { printf '[test-setup] %s\n' "$*"; }
mkdir -p "$TOOLS"

# venv DIR PINS PIP-ARGS...: (re)made when PINS changes
venv() {
  local dir="$1" pins="$2"; shift 2
  if [ -x "$dir/bin/python" ] && cmp -s "$pins" "$dir/.installed"; then
    return
  fi
  [ -x "$dir/bin/python" ] || "$PY" -m venv "$dir"
  say "installing into $dir (pins: ${pins#"$ROOT"/})"
  # pip through the venv's python: a venv copied to another checkout keeps
  # scripts whose #! names the original, and bin/pip would install there
  "$dir/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
  cp "$pins" "$dir/.installed"
}

KIT="$TOOLS/a2a-tck"
if [ ! -f "$KIT/run_tck.py" ]; then
  if [ -f "$SHARED/tools/a2a-tck.tar.gz" ]; then
    say "unpacking the A2A conformance kit from $SHARED/tools"
    tar -xzf "$SHARED/tools/a2a-tck.tar.gz" -C "$TOOLS"
  else
    say "no $SHARED/tools/a2a-tck.tar.gz: the conformance test will skip (and fail under CI=true)"
  fi
fi
if [ -f "$KIT/run_tck.py" ]; then
  PINS="$ROOT/service/tests/py/a2a-tck-constraints.txt"
  venv "$KIT/venv" "$PINS" -c "$PINS" -e "$KIT"
fi

PINS="$ROOT/service/tests/py/a2a-sdk-requirements.txt"
venv "$TOOLS/a2a-sdk-venv" "$PINS" -r "$PINS"

# the client's pins plus a hash of each of its files: a changed file re-installs it
CLIENT="$ROOT/service/clients/python"
PINS="$CLIENT/requirements-test.txt"
STAMP="$TOOLS/py-client-venv.pins"
{
  cat "$PINS"
  (cd "$CLIENT" && find pyproject.toml README.md src -type f ! -path '*/__pycache__/*' ! -name '*.pyc' \
    | LC_ALL=C sort | xargs sha256sum)
} > "$STAMP"
venv "$TOOLS/py-client-venv" "$STAMP" -r "$PINS" "$CLIENT[did,langchain,llamaindex]"
# real servers the tests start themselves: installed, never left running
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
command -v haproxy >/dev/null || missing+=(haproxy)
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
# the README's gRPC example reads the session token with jq
command -v jq >/dev/null || missing+=(jq)
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  say "installing ${missing[*]} from Debian"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # the package starts a system redis on 6379 where an init system runs; the tests use their own
  if command -v systemctl >/dev/null && systemctl is-active --quiet redis-server 2>/dev/null; then
    $SUDO systemctl disable --now redis-server >/dev/null 2>&1 || true
  fi
fi
say "ready"
