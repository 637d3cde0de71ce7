#!/usr/bin/env bash
# Runs every check and every test, starting or installing what the tests need:
# Consul and etcd (fetched into tools/ when missing), RabbitMQ and PostgreSQL (started, or installed,
# when not running), and redis-server (installed when missing; each Redis test starts its own on a
# free port).
#
#   bash scripts/test.sh            # everything CI runs
#   bash scripts/test.sh -- NAME    # only the tests whose names contain NAME: extra arguments go to
#                                   # each `cargo test` that runs tests (both lanes, see below)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# A checkout with changes of its own before this run (a developer's; CI's fresh clone has none):
# the publish dry run below packages them too. In a clean clone, a file the run itself changes
# (a rewritten Cargo.lock) fails that check, as it would fail a real `cargo publish`.
if [[ -n "$(git status --porcelain 2>/dev/null)" ]]; then
  export LEASE_DIRTY_CHECKOUT=1
fi

step() { printf '\n==> [%4ds] %s\n' "$SECONDS" "$*" >&2; }

# PostgreSQL for lease-postgres's tests, as scripts/ensure-rabbitmq.sh does for RabbitMQ: nothing
# if LEASE_TEST_POSTGRES_URL names a server; else 127.0.0.1:5432, its clusters started (Debian's
# pg_ctlcluster), or postgresql installed with apt (as root) first. The tests connect as
# postgres@127.0.0.1 without a password (trust); where the server asks for one (a fresh Debian
# install does), a role lease_test that may create databases is made over the local socket and
# LEASE_TEST_POSTGRES_URL names it.
postgres_listening() { (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; }
ensure_postgres() {
  local url=postgres://postgres@127.0.0.1:5432/postgres
  if [[ -n "${LEASE_TEST_POSTGRES_URL:-}" ]]; then
    echo "using LEASE_TEST_POSTGRES_URL" >&2
    return 0
  fi
  if ! postgres_listening; then
    if ! command -v pg_ctlcluster >/dev/null 2>&1; then
      if [[ $(id -u) -ne 0 ]]; then
        echo "PostgreSQL is not installed; run: sudo apt-get install postgresql" >&2
        return 1
      fi
      apt-get update -qq >&2
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
    fi
    local version cluster port status rest
    while read -r version cluster port status rest; do
      if [[ $status == down* ]]; then
        echo "starting PostgreSQL $version/$cluster (port $port)" >&2
        pg_ctlcluster "$version" "$cluster" start >&2 || true
      fi
    done < <(pg_lsclusters -h)
    for _ in $(seq 1 120); do
      if postgres_listening; then break; fi
      sleep 0.5
    done
    if ! postgres_listening; then
      echo "PostgreSQL did not start listening on 127.0.0.1:5432; see /var/log/postgresql/" >&2
      return 1
    fi
  fi
  if [[ $(id -u) -eq 0 ]] && command -v psql >/dev/null 2>&1 &&
    ! PGCONNECT_TIMEOUT=5 psql -qAt "$url" -c 'SELECT 1' >/dev/null 2>&1; then
    runuser -u postgres -- psql -qAt -c "DO \$\$ BEGIN
      IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'lease_test') THEN
        CREATE ROLE lease_test LOGIN CREATEDB PASSWORD 'lease_test';
      END IF; END \$\$" >&2
    export LEASE_TEST_POSTGRES_URL=postgres://lease_test:lease_test@127.0.0.1:5432/postgres
  fi
  if command -v psql >/dev/null 2>&1; then
    PGCONNECT_TIMEOUT=5 psql -qAt "${LEASE_TEST_POSTGRES_URL:-$url}" -c 'SELECT version()' >&2 || true
  fi
}

step "Consul"
CONSUL_BIN=$(bash scripts/ensure-consul.sh)
export CONSUL_BIN
# The first line by parameter expansion: piping consul into an early-exiting reader would kill
# it with SIGPIPE under pipefail (exit 141).
consul_version=$("$CONSUL_BIN" version)
printf '%s\n' "${consul_version%%$'\n'*}" >&2

step "etcd"
ETCD_BIN=$(bash scripts/ensure-etcd.sh)
ETCDCTL_BIN="${ETCDCTL_BIN:-$(dirname "$ETCD_BIN")/etcdctl}"
command -v "$ETCDCTL_BIN" >/dev/null 2>&1 || ETCDCTL_BIN=$(command -v etcdctl)
export ETCD_BIN ETCDCTL_BIN
etcd_version=$("$ETCD_BIN" --version)
printf '%s\n' "${etcd_version%%$'\n'*}" >&2

step "RabbitMQ"
bash scripts/ensure-rabbitmq.sh

step "PostgreSQL"
ensure_postgres

# redis-server for lease-redis's tests: each test starts its own (lease_tests::redis) on a free
# port, so only the binary is needed: Debian's redis-server (its --sentinel mode is the sentinel
# of the failover test), installed with apt (as root) when missing.
ensure_redis() {
  if [[ -n "${REDIS_SERVER_BIN:-}" ]] || command -v redis-server >/dev/null 2>&1; then
    "${REDIS_SERVER_BIN:-redis-server}" --version >&2
    return 0
  fi
  if [[ $(id -u) -ne 0 ]]; then
    echo "redis-server is not installed; run: sudo apt-get install redis-server" >&2
    return 1
  fi
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >&2
  redis-server --version >&2
}

step "Redis"
ensure_redis

step "cargo fmt --check"
cargo fmt --all -- --check

# Clippy and the docs first, in the foreground: the docs reuse clippy's checked dependencies, and
# the test build its build-script runs (aws-lc-sys's C) and proc macros.
step "cargo clippy"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --all-features --no-deps --quiet

# The other checks that only compile (the publish dry run, each feature set alone, the MSRV) run
# in the background at the lowest CPU priority, in target directories of their own (cargo locks
# its build directory), while the tests build and run: the tests mostly wait on services, and the
# background takes only the CPU they leave. Its output is shown, and its result counted, once the
# tests are done.
mkdir -p target
side_log=target/side-checks.log
msrv_log=target/msrv-check.log
msrv=$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' Cargo.toml)
# The declared rust-version must hold for the libraries users depend on, with every feature (the
# tests may use a newer compiler). rustup fetches the toolchain once (minimal profile, ~1 min); a
# machine that cannot fetch it says so and goes on, since that is no fault of the code.
msrv_check() {
  set -euo pipefail
  step "MSRV: Rust $msrv"
  if command -v rustup >/dev/null 2>&1; then
    # Read into a variable: `grep -q` on a pipe could kill rustup with SIGPIPE under pipefail.
    toolchains=$(rustup toolchain list)
    if [[ $'\n'"$toolchains" == *$'\n'"$msrv"-* ]] || rustup toolchain install "$msrv" --profile minimal; then
      CARGO_TARGET_DIR=target/msrv cargo "+$msrv" check --quiet -p lease-core -p lease-macros -p lease-tower \
        -p lease-http -p lease-consul -p lease-etcd -p lease-amqp -p lease-postgres -p lease-redis \
        --all-features
    else
      echo "could not install Rust $msrv: not checking the MSRV (see the README's MSRV section)"
    fi
  else
    echo "rustup not found: not checking the MSRV (see the README's MSRV section)"
  fi
}
side_checks() {
  set -euo pipefail
  export CARGO_TARGET_DIR=target/side
  # The MSRV check beside the rest: one cargo alone leaves a core idle at times (a crate that
  # builds alone, a link), and this fills it.
  msrv_check >"$msrv_log" 2>&1 &
  local msrv_pid=$!
  # shellcheck disable=SC2064 # the pid, now: a failure below ends the check with the rest
  trap "kill $msrv_pid 2>/dev/null || true" EXIT
  # The crates meant for users (publish = false marks the rest) are packaged, each against the
  # others as packaged (a local registry stands in for crates.io): their manifests, versions and
  # file lists. First, so the checkout is read before the tests run in it. Not built from the
  # packages (--no-verify): that build, 4 CPU-minutes of a 2-core CI run, did not fit beside the
  # simulation's sweep; `cargo publish` of a release builds each package as it always does, and
  # the feature-by-feature clippy below builds each crate alone.
  step "cargo publish --workspace --dry-run --no-verify"
  CARGO_TARGET_DIR=target/publish cargo publish --workspace --dry-run --no-verify --quiet \
    ${LEASE_DIRTY_CHECKOUT:+"--allow-dirty"}

  # The README's first command: the demo as `cargo run -p lease-demo` builds it (the in-process
  # backend alone), lint-clean, its own tests passing (the workspace tests build it with every
  # feature).
  step "the demo as the first command builds it"
  cargo clippy --quiet -p lease-demo --all-targets -- -D warnings
  cargo test --quiet -p lease-demo --bins

  # A user who enables one feature of lease-core, or one TLS choice of a backend crate, must get a
  # clean build and clean docs.
  step "lease-core, the backend crates and lease-tower feature by feature"
  for features in "" "--no-default-features" "--no-default-features --features macros" \
    "--no-default-features --features metrics" "--no-default-features --features memory,metrics"; do
    # shellcheck disable=SC2086
    cargo clippy --quiet -p lease-core $features -- -D warnings
    # shellcheck disable=SC2086
    RUSTDOCFLAGS="-D warnings" cargo doc --quiet -p lease-core --no-deps $features
  done
  # Each backend crate with its default TLS (rustls), with none, and with the cfg-gated
  # native-tls code of its own (lease-http's, under Consul's pool and etcd's gRPC channel);
  # lease-postgres with each client and with its lease backend, with its TLS (rustls, the
  # default) and without.
  for args in "-p lease-http" "-p lease-http --no-default-features" \
    "-p lease-http --no-default-features --features native-tls" \
    "-p lease-consul" "-p lease-consul --no-default-features" \
    "-p lease-consul --no-default-features --features native-tls" \
    "-p lease-etcd --no-default-features" \
    "-p lease-etcd --no-default-features --features native-tls" \
    "-p lease-amqp --no-default-features" \
    "-p lease-postgres" "-p lease-postgres --features tokio-postgres" \
    "-p lease-postgres --features sqlx" "-p lease-postgres --features backend" \
    "-p lease-postgres --no-default-features --features backend" \
    "-p lease-redis" "-p lease-redis --no-default-features"; do
    # shellcheck disable=SC2086
    cargo clippy --quiet $args -- -D warnings
  done
  cargo clippy --quiet -p lease-tower --no-default-features -- -D warnings
  RUSTDOCFLAGS="-D warnings" cargo doc --quiet -p lease-tower --no-deps --no-default-features


  step "the MSRV check (its log)"
  local msrv_status=0
  wait "$msrv_pid" || msrv_status=$?
  cat "$msrv_log"
  return "$msrv_status"
}
step "feature sets one by one, MSRV: in the background (see $side_log)"
# SCHED_IDLE where the system offers it: it runs only when nothing else wants a CPU (nice alone
# still took a share: the test build ran 342 s beside it, against 285 s under SCHED_IDLE).
idle=(nice -n 19)
if command -v chrt >/dev/null 2>&1 && chrt --idle 0 true 2>/dev/null; then
  idle=(chrt --idle 0 nice -n 19)
fi
"${idle[@]}" bash -c "SECONDS=$SECONDS; msrv=$msrv msrv_log=$msrv_log; $(declare -f step msrv_check side_checks); side_checks" > "$side_log" 2>&1 &
side_pid=$!

step "examples"
cargo run --quiet -p lease-jobs-example

# Each test stage runs under a bound far above its usual time (`timeout` signals the whole process
# group): a hang is a failure that names the stage within minutes, not a CI run that uses up its
# 90 minutes and says nothing.
bounded() {
  local limit=$1
  shift
  local status=0
  timeout --kill-after=30 "$limit" "$@" || status=$?
  if ((status == 124 || status == 137)); then
    echo "'$*' did not finish within ${limit}s: it hung (the log above shows where)" >&2
  fi
  return "$status"
}

# The tests run in two lanes at once: the binaries `lanes` names in the background, everything
# else (unit, integration and doc tests of every package) in the first. They are long (chaos
# alone 100 s, 4 to 5 minutes in all) and mostly idle, waiting on services, timeouts and worker
# processes, so beside the first lane they cost little CPU and take minutes off the step.
# lease-sim's `sweep` is the one that computes. Four lanes (the background split in three) ended
# no sooner, the first lane being the longest, and the load made two timing-bound tests fail.
lanes=(
  "chaos consul_scale process_edges amqp_scale consul_cluster etcd_scale fence_frozen_link redis_scale redis_sentinel sweep"
)
test_log=target/test.log
lane_logs=()
for i in "${!lanes[@]}"; do lane_logs+=("target/test-lane$((i + 2)).log"); done
: >"$test_log"
for log in "${lane_logs[@]}"; do : >"$log"; done
tests_status=0
lanes_status=0

# Built once, first: cargo holds its build-directory lock while it builds, not while tests run
# (with cargo 1.95, a second `cargo test` ran, and even rebuilt, beside a running one), and the
# lanes select the same packages and features, so they find every unit fresh and only run. The
# JSON lists each test executable `cargo test` runs, for the split.
step "cargo test: the build"
bounded 1800 cargo test --workspace --all-features --no-run --message-format=json-render-diagnostics \
  >target/test-build.json || tests_status=$?
if ((tests_status == 0)); then
  # `kind name` of each test executable: a library's or binary's unit tests, an integration test,
  # or an example or benchmark with `test = true`.
  test_executables=$(sed -n -E '/"profile":\{[^}]*"test":true\}/ {
      /"executable":"/ s/.*"target":\{"kind":\["([^"]+)"[^}]*"name":"([^"]+)".*/\1 \2/p
    }' target/test-build.json)
  # The first lane names the rest target by target (the same name in two packages runs in both).
  lane1=()
  while read -ra filter; do
    if [[ ${filter[0]} == --test && " ${lanes[*]} " == *" ${filter[1]} "* ]]; then continue; fi
    lane1+=("${filter[@]}")
  done < <(awk '{ f = $1 == "bin" ? "--bins" : $1 ~ /^(test|example|bench)$/ ? "--" $1 " " $2 : "--lib"
                  if (!seen[f]++) print f }' <<<"$test_executables")

  # Extra arguments go to every lane. --no-fail-fast: one run shows every failing test binary,
  # not only the first. Failures are reported after the background checks are in.
  lane_pids=()
  for i in "${!lanes[@]}"; do
    filters=()
    for name in ${lanes[i]}; do filters+=(--test "$name"); done
    step "cargo test, lane $((i + 2)) (${lanes[i]}): in the background (see ${lane_logs[i]})"
    (
      status=0
      bounded 1200 cargo test --workspace --all-features --no-fail-fast "${filters[@]}" "$@" || status=$?
      step "lane $((i + 2)) done"
      exit "$status"
    ) >"${lane_logs[i]}" 2>&1 &
    lane_pids+=($!)
  done

  step "cargo test, first lane: every other test binary"
  bounded 1200 cargo test --workspace --all-features --no-fail-fast "${lane1[@]}" "$@" 2>&1 |
    tee -a "$test_log" || tests_status=$?
  bounded 600 cargo test --workspace --all-features --no-fail-fast --doc "$@" 2>&1 |
    tee -a "$test_log" || tests_status=$?

  for i in "${!lanes[@]}"; do
    step "cargo test, lane $((i + 2)) (its log)"
    status=0
    wait "${lane_pids[i]}" || status=$?
    cat "${lane_logs[i]}"
    if ((status != 0)); then
      echo "lane $((i + 2))'s tests failed (exit $status): see ${lane_logs[i]} above" >&2
      lanes_status=$status
    fi
  done

  # Each test executable once, in one lane or another: a target the split left out, or ran
  # twice, fails the run instead of passing unseen.
  ran=$(cat "$test_log" "${lane_logs[@]}" | grep -c '^ *Running ' || true)
  built=$(grep -c . <<<"$test_executables" || true)
  if ((tests_status == 0 && lanes_status == 0 && ran != built)); then
    echo "the lanes ran $ran test executables, the build made $built: the split is wrong" >&2
    tests_status=1
  fi
else
  echo "the test build failed (exit $tests_status): no test runs" >&2
fi

# Every benchmark in its quick mode, in the test profile (the test build's dependencies): a few
# trials each, failing on the correctness bounds they measure around, never on a timing.
# `--all-features` takes in those behind a feature too (lease-postgres's postgres_leader needs
# `backend`). After the tests, not beside them: their bounds (a loss noticed within the fence
# interval, a lease not lost while held) are the kind a loaded machine upsets, and the scale
# benchmarks would meet the scale tests.
step "benchmarks, quick mode"
bench_status=0
LEASE_BENCH_QUICK=1 bounded 900 cargo test --workspace --all-features --no-fail-fast --bench '*' 2>&1 |
  tee target/bench-quick.log || bench_status=$?
grep '^RESULT' target/bench-quick.log >&2 || true

step "the background checks"
side_status=0
wait "$side_pid" || side_status=$?
cat "$side_log" >&2
if ((side_status != 0)); then
  echo "the background checks failed (exit $side_status): see above" >&2
fi

# One closing line for the whole run (cargo prints one per test binary, the last often a doc-test
# run with nothing in it).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$test_log" "${lane_logs[@]}"
step "done"
if ((tests_status != 0)); then
  echo "the tests failed (exit $tests_status): see the build above, or $test_log (the first lane)" >&2
fi
if ((lanes_status != 0)); then
  echo "a background lane's tests failed: see its log above" >&2
fi
if ((bench_status != 0)); then
  echo "a benchmark's quick mode failed (exit $bench_status): see target/bench-quick.log above" >&2
fi
((tests_status == 0 && lanes_status == 0 && side_status == 0 && bench_status == 0))
