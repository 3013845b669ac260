#!/usr/bin/env bash
# The whole suite, as `npm test` runs it (the README's Quick start, and CI):
#   1. hygiene (formatting, types, lint, import cycles, the packed package, the API report);
#   2. the unit and property projects on Node.js 22 and 24 (scripts/node-versions.sh);
#   3. every project on the machine's Node.js, against the broker on the configured ports — the
#      line `scripts/rabbitmq.sh up` started, RABBITMQ_LINE (4.3 unless set);
#   4. the broker-behaviour tests again on each other supported line (BROKER_FILES below: the broker
#      rules, sub-entry dedup, the AMQP 0-9-1 conversion, single-active-consumer hand-over, the
#      cluster and group fault tests), each started with `RABBITMQ_LINE=<line> scripts/rabbitmq.sh up`
#      (root), then the first line is started again. STREAM_DEDUP_OTHER_LINES overrides which lines
#      (space-separated); set it empty to test only the broker you point the tests at (a broker of
#      your own without root, say).
# Every step runs even when one before it failed; the run ends with the failed tests again, one line
# each (file, name, first line of the error: CI shows only the end of the output; the first three of
# each vitest run with up to 40 more lines of their message, such as a timed-out wait's last lines), then one line that
# adds up the vitest runs of steps 2, 3 and 4, `tests: N passed, N failed, N skipped` (a step that
# fails without a test failing — hygiene, an install, a broker that does not start — counts as one
# failure), and exits non-zero if anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."

LINE=${RABBITMQ_LINE:-4.3}
ALL_LINES="4.3 4.0"
default_others=""
for l in $ALL_LINES; do [ "$l" = "$LINE" ] || default_others+="$l "; done
read -r -a others <<<"${STREAM_DEDUP_OTHER_LINES-$default_others}"
BROKER_FILES=(
  test/integration/broker-rules.test.ts
  test/integration/sub-entry-publish.test.ts
  test/integration/amqp091-decode.test.ts
  test/integration/consumer-group.test.ts
  test/integration/consumer-group-crash.test.ts
  test/integration/consumer-group-cluster.test.ts
  test/integration/cluster.test.ts
)

summary=$(mktemp)
failures=$(mktemp)
trap 'rm -f "$summary" "$failures"' EXIT
export STREAM_DEDUP_SUMMARY_FILE=$summary STREAM_DEDUP_FAILURES_FILE=$failures
failed_steps=()
step() { # step NAME COMMAND…: runs it, timed; a failure is recorded, not fatal.
  local name=$1 start=$SECONDS
  shift
  echo "== test-all: $name" >&2
  if ! "$@"; then failed_steps+=("$name"); fi
  echo "== test-all: $name took $((SECONDS - start)) s" >&2
}

step hygiene npm run hygiene
step node-versions npm run test:node-versions
step "suite on RabbitMQ $LINE" env RABBITMQ_LINE="$LINE" STREAM_DEDUP_RUN_LABEL="whole suite, RabbitMQ $LINE" npx vitest run --reporter=default --reporter=./scripts/summary-reporter.js
for other in "${others[@]}"; do
  step "RabbitMQ $other up" env RABBITMQ_LINE="$other" bash scripts/rabbitmq.sh up
  step "broker-behaviour tests on RabbitMQ $other" env RABBITMQ_LINE="$other" \
    STREAM_DEDUP_RUN_LABEL="broker tests, RabbitMQ $other" npx vitest run --project integration --reporter=default --reporter=./scripts/summary-reporter.js "${BROKER_FILES[@]}"
  step "RabbitMQ $other down" env RABBITMQ_LINE="$other" bash scripts/rabbitmq.sh down
done
if [ ${#others[@]} -gt 0 ]; then step "RabbitMQ $LINE up again" env RABBITMQ_LINE="$LINE" bash scripts/rabbitmq.sh up; fi

# Lines of "passed failed skipped", one per vitest run (the summary reporter appends them).
read -r passed failed skipped < <(awk '{p += $1; f += $2; s += $3} END {print p+0, f+0, s+0}' "$summary")
runs=$(wc -l <"$summary")
if [ -s "$failures" ]; then
  echo "test-all: failed tests:" >&2
  sed 's/^/  /' "$failures" >&2
fi
if [ ${#failed_steps[@]} -gt 0 ]; then
  echo "test-all: failed: ${failed_steps[*]}" >&2
  # A step that failed without a test failing (hygiene, a broker that did not start) still fails.
  [ "$failed" -gt 0 ] || failed=${#failed_steps[@]}
fi
echo "test-all: $runs vitest runs added up (Node.js 22/24 unit and property runs included); broker lines: $LINE${others[*]:+ (whole suite), ${others[*]} (broker-behaviour tests)}" >&2
echo
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ ${#failed_steps[@]} -eq 0 ] && [ "$failed" -eq 0 ]
