#!/usr/bin/env bash
# A consumer rank's process is killed; the channel behaves as docs/mpi.md
# ("When a rank dies") says:
#   1. attached to a group that outlives the job (a real `strom server`),
#      the job ends with an error, and a new job that opens the channel
#      resumes: the dead rank's consumer after its last ack (nothing acked
#      comes again, nothing unacked is lost), the others from the start;
#   2. with embedded servers, the job ends with an error, without hanging.
# Usage: tests/mpi/kill.sh STROM_BINARY TEST_KILL_BINARY [MPIRUN...]
set -euo pipefail
STROM=$1
TEST=$2
shift 2
MPIRUN=("$@")
[ ${#MPIRUN[@]} -gt 0 ] || MPIRUN=(mpirun --allow-run-as-root --oversubscribe)
N=300 # events per producer rank
K=37  # events the victim acks before it dies
VICTIM=2
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT

"$STROM" server --data-dir "$dir/data" --group-file "$dir/group.json" 2> "$dir/server.log" &
for _ in $(seq 1 200); do
  [ -s "$dir/group.json" ] && break
  sleep 0.05
done
[ -s "$dir/group.json" ] || { echo "the server did not start:"; cat "$dir/server.log"; exit 1; }

run() { timeout -k 10 120 "${MPIRUN[@]}" -n 4 "$TEST" "$@"; }
fail() { { echo "kill.sh: $*"; echo "--- server log ---"; tail -20 "$dir/server.log"; } >&2; exit 1; }

run "$dir/group.json" produce $N > "$dir/produce.out" 2>&1 || { cat "$dir/produce.out"; fail "produce failed"; }

# A job whose rank dies must end with an error well before the timeout
# (mpirun's own status for a rank killed by SIGKILL is 137, like timeout's
# last resort, so the time tells them apart).
ends_with_error() { # NAME OUTPUT_FILE ARGS...
  local name=$1 out=$2 start status took
  shift 2
  start=$(date +%s)
  set +e
  run "$@" > "$out" 2>&1
  status=$?
  set -e
  took=$(($(date +%s) - start))
  [ $status -ne 0 ] || { cat "$out" >&2; fail "$name: the job with a killed rank exited 0"; }
  [ $took -lt 100 ] && [ $status -ne 124 ] || { cat "$out" >&2; fail "$name: the job with a killed rank hung"; }
  echo "$status ${took}s"
}
died=$(ends_with_error attached "$dir/die.out" "$dir/group.json" consume-die $K $VICTIM)
grep -q "acked $K events; killing myself" "$dir/die.out" || { cat "$dir/die.out"; fail "the victim did not die as planned"; }

run "$dir/group.json" consume $K $VICTIM > "$dir/resume.out" 2>&1 || { cat "$dir/resume.out"; fail "the resumed job failed"; }
want=$((4 * N - K))
grep -q "{\"events_after_restart\":$want}" "$dir/resume.out" ||
  { cat "$dir/resume.out"; fail "the resumed job did not read exactly the $want unacked events"; }
echo "kill.sh: attached: rank $VICTIM died after $K acks (mpirun: exit status, time: $died); the next job resumed and read the other $want events"

died=$(ends_with_error embedded "$dir/embedded.out" - embedded-die)
echo "kill.sh: embedded: a consumer rank died; mpirun ended the job (exit status, time: $died)"
