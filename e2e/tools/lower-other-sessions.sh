#!/usr/bin/env bash
# Lowers every other session on this machine to the lowest CPU group priority while a benchmark
# runs, so that the benchmark's session has the CPU as on a quiet machine (see
# docs/benchmarks.md, "Measuring on this machine"). Linux with sched_autogroup, as root.
#
#   e2e/tools/lower-other-sessions.sh cargo bench -p webhook --bench hostile
#
# Every 5 s, each process of another session gets `19` in /proc/<pid>/autogroup; when the command
# ends, their groups go back to 0.
set -euo pipefail
mine="$(cut -d' ' -f1 /proc/$$/autogroup)"
lower() {
  local level="$1" f group rest
  for f in /proc/[0-9]*/autogroup; do
    read -r group rest <"$f" 2>/dev/null || continue
    [ "$group" = "$mine" ] && continue
    echo "$level" >"$f" 2>/dev/null || true
  done
}
(while true; do lower 19; sleep 5; done) &
keeper=$!
trap 'kill "$keeper" 2>/dev/null || true; lower 0' EXIT
"$@"
