#!/usr/bin/env bash
# The whole test suite, as CI runs it (needs root: it stands up a real Slurm cluster in
# network namespaces). Installs what it needs; the no-root tier (format, lints, docs, the unit
# and integration tests) runs first and stops a broken tree in minutes; then it builds the
# static binary and the packages and, for each Slurm version (22.05: the host's; 24.11 and
# 26.05: Debian root filesystems built once by tests/cluster/rootfs.sh), runs the end-to-end
# tests and the live install.sh tests on a real cluster of that version. Prints one line per
# version ("24.11: N passed, M failed (…, S s)"), the time of each tier and in all, and ends
# with one line: "N passed, M failed".
# CVSLURM_SLURM_VERSIONS="22.05 24.11" runs only those versions.
set -uo pipefail
cd "$(dirname "$0")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
LOG_DIR="${CVSLURM_TEST_LOGS:-target/test-logs}"
mkdir -p "$LOG_DIR"
failures=()
step() { printf '\n== %s\n' "$*"; }
# Stops what a test left running, by the pid files in $2, with signal $1, and removes the
# files: only a process that is still ours (its command line names cvslurm or the stand-in),
# as pids wrap at pid_max (32768 here) and a stale file may name any process, this script too.
kill_ours() { # SIGNAL DIR
  local p pid cmd
  for p in "$2"/*.pid; do
    [ -f "$p" ] || continue
    pid="$(cat "$p")"
    cmd=""
    [[ "$pid" =~ ^[0-9]+$ ]] && cmd="$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline")"
    if [[ "$cmd" == *cvslurm* || "$cmd" == *standin* ]]; then
      kill "-$1" "$pid" 2>/dev/null
    fi
    rm -f "$p"
  done
}

step "dependencies"
tests/deps.sh || { echo "dependency install failed"; exit 1; }
VERSIONS="${CVSLURM_SLURM_VERSIONS:-22.05 24.11 26.05}"
CLUSTER_BIN="${CVSLURM_CLUSTER_DIR:-/var/tmp/cvslurm-cluster}/bin"
# The newer versions' root filesystems (built once, then cached) are made in the background,
# side by side, while the no-root tier compiles: fetching and unpacking packages is network
# and disk, compiling is CPU. The cluster tiers wait for them.
declare -A rootfs_pid=()
for v in $VERSIONS; do
  [ "$v" = 22.05 ] && continue
  tests/cluster/rootfs.sh "$v" >"$LOG_DIR/rootfs-$v.log" 2>&1 &
  rootfs_pid[$v]=$!
done

# "P F" from a log: cargo's "test result:" lines, or test_install.sh's "N passed, M failed"
count() { # FILE
  local p=0 q=0 a b
  [ -f "$1" ] || { echo "0 0"; return; }
  while read -r a b; do p=$((p + a)); q=$((q + b)); done < <(
    sed -n -e 's/^test result: [a-zA-Z]*\. \([0-9]*\) passed; \([0-9]*\) failed.*/\1 \2/p' \
      -e 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' "$1")
  echo "$p $q"
}

suite_t0=$SECONDS
step "format and lints"
cargo fmt --check || failures+=("cargo fmt --check")
cargo clippy --all-targets --quiet -- -D warnings || failures+=("cargo clippy")
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet || failures+=("cargo doc")

# On a failure, what each failing test printed (cargo's first "failures:" block), so the CI
# summary says why and not only which; capped so a flood cannot bury the rest.
failure_details() { # LOG
  awk '/^failures:$/ {n++; next} /^test result/ {n += n % 2} n % 2 == 1' "$1" | head -200
}

# The no-root tier also builds the end-to-end test binaries (debug, as `cargo test` builds
# every test target): the cluster tiers below run them without another build. cargo lets go
# of its build directory once the test binaries run: the static release build starts then,
# compiling while the tests mostly wait on processes and clocks.
step "unit and integration tests, and the static release build beside them"
# Four test threads: most of these tests wait on processes they start (the binary, the
# stand-in), so two cores keep four busy (72 s -> 55 s for tests/it here).
cargo test -- --test-threads=4 >"$LOG_DIR/cargo-test.log" 2>&1 &
test_pid=$!
while kill -0 "$test_pid" 2>/dev/null && ! grep -q '^ *Running ' "$LOG_DIR/cargo-test.log"; do
  sleep 1
done
if cargo build --release --target x86_64-unknown-linux-musl --quiet; then
  BIN=target/x86_64-unknown-linux-musl/release/cvslurm
  ldd "$BIN" 2>&1 | grep -Eq 'not a dynamic executable|statically linked' \
    || failures+=("static build is dynamically linked")
  echo "built $BIN ($(stat -c %s "$BIN") bytes, $(ldd "$BIN" 2>&1 | xargs))"
else
  failures+=("static build"); BIN=""
fi
wait "$test_pid"; test_rc=$?
grep -E '^(test |test result|failures:|---- )' "$LOG_DIR/cargo-test.log"
[ "$test_rc" = 0 ] || { failure_details "$LOG_DIR/cargo-test.log"; failures+=("cargo test"); }
fast_s=$((SECONDS - suite_t0))
echo "no-root tier: $fast_s s"
# A tree that fails the no-root tier stops here, in minutes, before any cluster comes up.
if [ ${#failures[@]} -gt 0 ]; then
  for f in "${failures[@]}"; do echo "FAILED: $f"; done
  read -r passed failed < <(count "$LOG_DIR/cargo-test.log")
  echo "$passed passed, $((failed + ${#failures[@]})) failed"
  kill "${rootfs_pid[@]}" 2>/dev/null # a half-built root filesystem is started again next time
  exit 1
fi

if [ -n "$BIN" ]; then
  step "packages (.deb and .rpm), built and inspected"
  CVSLURM_BIN="$PWD/$BIN" packaging/build-deb.sh >"$LOG_DIR/deb.log" 2>&1 \
    && tail -5 "$LOG_DIR/deb.log" || { tail -20 "$LOG_DIR/deb.log"; failures+=("deb package"); }
  CVSLURM_BIN="$PWD/$BIN" packaging/build-rpm.sh >"$LOG_DIR/rpm.log" 2>&1 \
    && tail -5 "$LOG_DIR/rpm.log" || { tail -20 "$LOG_DIR/rpm.log"; failures+=("rpm package"); }
fi

# e2e + install tests on one Slurm version; logs e2e-VERSION.log and install-VERSION.log
# Tests of cvslurm's own machinery that read nothing of Slurm's beyond what every other test
# reads (CloudVision down, the metrics file) run on the last version only.
ONE_VERSION_TESTS=(outage_of_cloudvision_loses_no_event the_service_metrics_file_tells_what_cloudvision_received
  # Exclusive and long (Slurm's backfill, a requeue's hold, two slurmctld restarts); what they
  # read of each version's Slurm the het and resize/suspend tests read on every version.
  het_jobs_cancelled_alone_and_requeued_stay_one_job_each
  preempted_job_is_marked_suspended_while_the_preemptor_runs)
version_suites() { # VERSION
  local v="$1" skip=() t
  if [ "$v" != "${VERSIONS##* }" ]; then
    for t in "${ONE_VERSION_TESTS[@]}"; do skip+=(--skip "$t"); done
  fi
  step "Slurm $v: end-to-end tests on a real cluster"
  SLURM="$v" PATH="$CLUSTER_BIN:$PATH" CVSLURM_E2E_BIN="$PWD/$BIN" \
    cargo test --test e2e -- --ignored --test-threads=4 "${skip[@]}" 2>&1 \
    | tee "$LOG_DIR/e2e-$v.log" | grep -E '^(test |test result|failures:|---- |\[e2e\])'
  if [ "${PIPESTATUS[0]}" != 0 ]; then
    failure_details "$LOG_DIR/e2e-$v.log"; failures+=("$v: end-to-end tests")
    # What slurmctld said meanwhile: a failure that is Slurm's shows there.
    cp -r "${CVSLURM_CLUSTER_DIR:-/var/tmp/cvslurm-cluster}/log" "$LOG_DIR/cluster-log-$v" 2>/dev/null
    echo "-- slurmctld.log, errors and last lines (all logs: $LOG_DIR/cluster-log-$v)"
    { grep -E 'error|fatal|timed out|very large processing time' "$LOG_DIR/cluster-log-$v/slurmctld.log" | tail -40
      tail -20 "$LOG_DIR/cluster-log-$v/slurmctld.log"; } 2>/dev/null
  fi
  kill_ours TERM /var/tmp/cvslurm-e2e
  tests/cluster/cluster.sh down >/dev/null 2>&1 || true
  rm -f /etc/slurm/cloudvision.conf
  step "Slurm $v: end-to-end test of JobInterfaces on GPU nodes"
  SLURM="$v" PATH="$CLUSTER_BIN:$PATH" CVSLURM_E2E_BIN="$PWD/$BIN" cargo test --test e2e_gpu -- --ignored 2>&1 \
    | tee "$LOG_DIR/e2e-gpu-$v.log" | grep -E '^(test |test result|failures:|---- )'
  [ "${PIPESTATUS[0]}" = 0 ] || { failure_details "$LOG_DIR/e2e-gpu-$v.log"; failures+=("$v: GPU end-to-end test"); }
  step "Slurm $v: end-to-end tests on a pair of controllers (takeover, kill -9, power-off)"
  SLURM="$v" PATH="$CLUSTER_BIN:$PATH" CVSLURM_E2E_BIN="$PWD/$BIN" \
    cargo test --test e2e_pair -- --ignored --test-threads=1 2>&1 \
    | tee "$LOG_DIR/e2e-pair-$v.log" | grep -E '^(test |test result|failures:|---- |\[e2e\])'
  if [ "${PIPESTATUS[0]}" != 0 ]; then
    failure_details "$LOG_DIR/e2e-pair-$v.log"; failures+=("$v: pair end-to-end tests")
    cp -r "${CVSLURM_CLUSTER_DIR:-/var/tmp/cvslurm-cluster}/hosts" "$LOG_DIR/cluster-hosts-$v" 2>/dev/null
  fi
  kill_ours KILL /var/tmp/cvslurm-e2e-pair
  tests/cluster/cluster.sh down >/dev/null 2>&1 || true
  rm -f /etc/slurm/cloudvision.conf
  step "Slurm $v: a pair installed in README's order (install.sh on each controller)"
  SLURM="$v" PATH="$CLUSTER_BIN:$PATH" CVSLURM_E2E_BIN="$PWD/$BIN" \
    cargo test --test e2e_pair_install -- --ignored 2>&1 \
    | tee "$LOG_DIR/e2e-pair-install-$v.log" | grep -E '^(test |test result|failures:|---- |\[e2e\])'
  if [ "${PIPESTATUS[0]}" != 0 ]; then
    failure_details "$LOG_DIR/e2e-pair-install-$v.log"; failures+=("$v: pair install end-to-end test")
  fi
  tests/cluster/cluster.sh down >/dev/null 2>&1 || true
  rm -f /etc/slurm/cloudvision.conf /etc/slurm/cloudvision.token
  step "Slurm $v: install.sh on the real cluster"
  if SLURM="$v" tests/cluster/cluster.sh up 2 >"$LOG_DIR/install-cluster-$v.log" 2>&1; then
    SLURM="$v" PATH="$CLUSTER_BIN:$PATH" LIVE=1 CVSLURM_BIN="$PWD/$BIN" tests/install/test_install.sh 2>&1 \
      | tee "$LOG_DIR/install-$v.log"
    [ "${PIPESTATUS[0]}" = 0 ] || failures+=("$v: install tests")
  else
    tail -20 "$LOG_DIR/install-cluster-$v.log"; failures+=("$v: cluster for install tests")
  fi
  tests/cluster/cluster.sh down >/dev/null 2>&1 || true
}

for v in "${!rootfs_pid[@]}"; do
  t0=$SECONDS
  wait "${rootfs_pid[$v]}" || { tail -20 "$LOG_DIR/rootfs-$v.log"; echo "no root filesystem for Slurm $v"; exit 1; }
  echo "Slurm $v root filesystem ready (waited $((SECONDS - t0)) s more)"
done

declare -A vtime=()
if [ -n "$BIN" ]; then
  for v in $VERSIONS; do
    rm -f "$LOG_DIR/e2e-$v.log" "$LOG_DIR/install-$v.log" "$LOG_DIR/e2e-gpu-$v.log" "$LOG_DIR/e2e-pair-$v.log" "$LOG_DIR/e2e-pair-install-$v.log"
    t0=$SECONDS
    version_suites "$v"
    vtime[$v]=$((SECONDS - t0))
  done
fi

read -r passed failed < <(count "$LOG_DIR/cargo-test.log")
echo
echo "unit and integration: $passed passed, $failed failed"
for v in $VERSIONS; do
  read -r p1 q1 < <(count "$LOG_DIR/e2e-$v.log")
  read -r p2 q2 < <(count "$LOG_DIR/install-$v.log")
  read -r p3 q3 < <(count "$LOG_DIR/e2e-gpu-$v.log")
  read -r p4 q4 < <(count "$LOG_DIR/e2e-pair-$v.log")
  read -r p5 q5 < <(count "$LOG_DIR/e2e-pair-install-$v.log")
  p1=$((p1 + p3 + p4 + p5)); q1=$((q1 + q3 + q4 + q5))
  vf=0
  for f in "${failures[@]}"; do
    case "$f" in "$v: end-to-end tests"|"$v: install tests"|"$v: GPU end-to-end test"|"$v: pair end-to-end tests"|"$v: pair install end-to-end test") ;; "$v: "*) vf=$((vf + 1)) ;; esac
  done
  echo "$v: $((p1 + p2)) passed, $((q1 + q2 + vf)) failed (e2e $p1/$((p1 + q1)), install $p2/$((p2 + q2)), ${vtime[$v]:-0} s)"
  passed=$((passed + p1 + p2)); failed=$((failed + q1 + q2))
done
echo
for f in "${failures[@]}"; do echo "FAILED: $f"; done
# A failing step that is not a test (build, lint) counts as one failure.
nontest=0
for f in "${failures[@]}"; do
  case "$f" in "cargo test"|*": end-to-end tests"|*": install tests"|*": GPU end-to-end test"|*": pair end-to-end tests"|*": pair install end-to-end test") ;; *) nontest=$((nontest + 1)) ;; esac
done
total_failed=$((failed + nontest))
# A suite that failed without a test result line (did not compile, crashed) still fails.
[ ${#failures[@]} -gt 0 ] && [ "$total_failed" -eq 0 ] && total_failed=${#failures[@]}
echo "time: no-root tier $fast_s s, then$(for v in $VERSIONS; do printf ' %s %s s,' "$v" "${vtime[$v]:-0}"; done) $((SECONDS - suite_t0)) s in all"
echo "$passed passed, $total_failed failed"
[ ${#failures[@]} -eq 0 ]
