#!/bin/sh
# cvslurm benchmarks: builds the static release binary, starts the CloudVision stand-in,
# and prints  figure | cvslurm | comparison | ratio | target | pass/fail.
# Figures, not timed tests: the exit status is 1 if a target is missed, 2 on set-up failure.
# Needs: cargo with the x86_64-unknown-linux-musl target, python3, openssl, curl;
# hyperfine (apt install hyperfine) is used for the --version figure when present.
# Environment knobs: see tests/bench/bench.py (BENCH_NODES, BENCH_RUNS, BENCH_POLLS,
# BENCH_ONLY, BENCH_BIN, BENCH_WORK).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
if [ -z "${BENCH_BIN:-}" ]; then
    cargo build --release --target x86_64-unknown-linux-musl >&2 || exit 2
fi
for t in python3 openssl curl; do
    command -v "$t" >/dev/null || { echo "run.sh: $t is needed" >&2; exit 2; }
done
exec python3 tests/bench/bench.py
