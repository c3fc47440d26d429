#!/usr/bin/env bash
# The whole test suite, as CI runs it (needs root: it stands up a real Slurm cluster in
# network namespaces). Installs what it needs, checks format and lints, builds the static
# binary, runs the unit and integration tests, then the end-to-end tests on real Slurm,
# and ends with one line: "N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
LOG_DIR="${CVSLURM_TEST_LOGS:-target/test-logs}"
mkdir -p "$LOG_DIR"
failures=()
step() { printf '\n== %s\n' "$*"; }

step "dependencies"
tests/deps.sh || { echo "dependency install failed"; exit 1; }

step "format and lints"
cargo fmt --check || failures+=("cargo fmt --check")
cargo clippy --all-targets --quiet -- -D warnings || failures+=("cargo clippy")

step "static release build"
if cargo build --release --target x86_64-unknown-linux-musl --quiet; then
  BIN=target/x86_64-unknown-linux-musl/release/cvslurm
  ldd "$BIN" 2>&1 | grep -Eq 'not a dynamic executable|statically linked' \
    || failures+=("static build is dynamically linked")
  echo "built $BIN ($(stat -c %s "$BIN") bytes, $(ldd "$BIN" 2>&1 | xargs))"
else
  failures+=("static build"); BIN=""
fi

if [ -n "$BIN" ]; then
  step "packages (.deb and .rpm), built and inspected"
  CVSLURM_BIN="$PWD/$BIN" packaging/build-deb.sh >"$LOG_DIR/deb.log" 2>&1 \
    && tail -5 "$LOG_DIR/deb.log" || { tail -20 "$LOG_DIR/deb.log"; failures+=("deb package"); }
  CVSLURM_BIN="$PWD/$BIN" packaging/build-rpm.sh >"$LOG_DIR/rpm.log" 2>&1 \
    && tail -5 "$LOG_DIR/rpm.log" || { tail -20 "$LOG_DIR/rpm.log"; failures+=("rpm package"); }
fi

step "unit and integration tests"
cargo test 2>&1 | tee "$LOG_DIR/cargo-test.log" | grep -E '^(test |test result|failures:|---- )' 
[ "${PIPESTATUS[0]}" = 0 ] || failures+=("cargo test")

if [ -n "$BIN" ]; then
  step "end-to-end tests on a real Slurm cluster"
  CVSLURM_E2E_BIN="$PWD/$BIN" cargo test --release --test e2e -- --ignored --test-threads=4 2>&1 \
    | tee "$LOG_DIR/e2e.log" | grep -E '^(test |test result|failures:|---- |\[e2e\])'
  [ "${PIPESTATUS[0]}" = 0 ] || failures+=("end-to-end tests")
  for p in /var/tmp/cvslurm-e2e/*.pid; do [ -f "$p" ] && kill "$(cat "$p")" 2>/dev/null; done
  tests/cluster/cluster.sh down >/dev/null 2>&1 || true
  rm -f /etc/slurm/cloudvision.conf
  step "end-to-end test of JobInterfaces on GPU nodes"
  cargo test --release --test e2e_gpu -- --ignored 2>&1 \
    | tee "$LOG_DIR/e2e-gpu.log" | grep -E '^(test |test result|failures:|---- )'
  [ "${PIPESTATUS[0]}" = 0 ] || failures+=("GPU end-to-end test")
  if [ -x tests/install/test_install.sh ]; then
    step "install.sh on the real cluster"
    tests/cluster/cluster.sh up 2 >"$LOG_DIR/install-cluster.log" 2>&1 \
      || { tail -20 "$LOG_DIR/install-cluster.log"; failures+=("cluster for install tests"); }
    LIVE=1 CVSLURM_BIN="$PWD/$BIN" tests/install/test_install.sh 2>&1 | tee "$LOG_DIR/install.log"
    [ "${PIPESTATUS[0]}" = 0 ] || failures+=("install tests")
    tests/cluster/cluster.sh down >/dev/null 2>&1 || true
  fi
fi

passed=0; failed=0
for f in "$LOG_DIR/cargo-test.log" "$LOG_DIR/e2e.log" "$LOG_DIR/e2e-gpu.log"; do
  [ -f "$f" ] || continue
  while read -r p q; do passed=$((passed + p)); failed=$((failed + q)); done < <(
    sed -n 's/^test result: [a-zA-Z]*\. \([0-9]*\) passed; \([0-9]*\) failed.*/\1 \2/p' "$f")
done
if [ -f "$LOG_DIR/install.log" ]; then
  read -r p q < <(sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' "$LOG_DIR/install.log" | tail -1) || true
  passed=$((passed + ${p:-0})); failed=$((failed + ${q:-0}))
fi
echo
for f in "${failures[@]}"; do echo "FAILED: $f"; done
# A failing step that is not a test (build, lint) counts as one failure.
nontest=0
for f in "${failures[@]}"; do
  case "$f" in "cargo test"|"end-to-end tests"|"install tests") ;; *) nontest=$((nontest + 1)) ;; esac
done
total_failed=$((failed + nontest))
# A suite that failed without a test result line (did not compile, crashed) still fails.
[ ${#failures[@]} -gt 0 ] && [ "$total_failed" -eq 0 ] && total_failed=${#failures[@]}
echo "$passed passed, $total_failed failed"
[ ${#failures[@]} -eq 0 ]
