//! The fence from the moment of acquisition, proved with real processes: a leader whose link to
//! the lease backend is frozen (a blackhole in the fault proxy) goes on with fenced writes to
//! PostgreSQL; the next leader acquires once the lease has expired; and no write of the old
//! leader commits after that acquisition, although the new leader waits before its first write
//! (as a leader loading its state does). Consul, etcd and PostgreSQL leases; the verdict from the
//! table the writers fill (`fenced_writes`, with the server's `clock_timestamp()` of each insert)
//! beside the histories.
//!
//! Each holder is a `lease-fenced-writer` process. The old leader A runs `--unchecked`: it never
//! looks at its lease, so every one of its writes is one a pause between a check and a commit
//! could produce, and only the fence can stop it. Both run `--advance`: the holder is registered
//! with the fence when it acquires (`fence::tokio_postgres::advance_on_acquire` for Consul and
//! etcd, `PostgresBuilder::advance_fence` in the acquiring transaction for PostgreSQL leases).
//! A fourth case, on PostgreSQL leases, fences with the lease row itself (`--fence held`), without
//! advance: A is refused from the moment its row has expired by the database's clock, whatever B
//! does (`lease-postgres/tests/fence_leases.rs` shows it with no next holder at all).
//!
//! `LEASE_TEST_FENCE_WITHOUT_ADVANCE=1` runs the same cases without `--advance`, as the fence
//! worked before it: then A's writes keep committing between B's acquisition and B's first write,
//! and the advance cases fail.
//!
//! The freeze only needs to outlast the TTL (10 s, the shortest the library takes; Consul's
//! server may wait up to twice that): about 12 s per case, 27 s for the four on two cores, so
//! this binary runs in the second lane (scripts/test.sh `long_tests`). Every wait is bounded and
//! waits on an event.
//!
//! ```sh
//! cargo test -p lease-tests --test fence_frozen_link -- --nocapture   # prints RESULT lines
//! ```
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use lease_core::Sequencer;
use lease_tests::consul::Agent;
use lease_tests::history::{Kind, Line};
use lease_tests::overlap::now_ns;
use lease_tests::postgres::{TestDb, server_addr, through};
use lease_tests::proxy::Proxy;
use lease_tests::workers::{Run, wait_for};
use tokio_postgres::Client;

const WRITER: &str = env!("CARGO_BIN_EXE_lease-fenced-writer");
const KEY: &str = "fence/frozen";
const TTL_SECS: u64 = 10;
/// How long the new leader waits before its first write: the window the fence used to leave.
const FIRST_WRITE_AFTER_MS: u64 = 1_500;
const START: Duration = Duration::from_secs(60);
const TAKEOVER: Duration = Duration::from_secs(3 * TTL_SECS + 30);
const STEP: Duration = Duration::from_secs(30);

/// Where the leases live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Leases {
    Consul,
    Etcd,
    Postgres,
}

/// How the writers fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    /// `lease_fence.fence`, each holder advanced at acquisition.
    Advance,
    /// `lease.fence_held`: the holder's own lease row (PostgreSQL leases only).
    Held,
}

fn without_advance() -> bool {
    std::env::var_os("LEASE_TEST_FENCE_WITHOUT_ADVANCE").is_some_and(|v| v == "1")
}

/// Waits for the first line of worker `who` of `kind`.
async fn line_of(run: &Run, who: usize, kind: Kind, limit: Duration) -> Line {
    let pid = run.pid(who);
    wait_for(
        limit,
        || format!("a {kind} line of pid {pid}; {}", run.files()),
        || {
            run.history(&[who])
                .of_pid(pid)
                .find(|l| l.kind == kind)
                .cloned()
        },
    )
    .await
}

/// A's rows: (insert time in ns since the epoch, attempt).
async fn rows_of(client: &Client, holder: &str) -> Vec<(u128, i64)> {
    client
        .query(
            "SELECT (extract(epoch FROM written_at) * 1e6)::bigint, attempt FROM fenced_writes \
             WHERE holder = $1 ORDER BY id",
            &[&holder],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| {
            let micros: i64 = r.get(0);
            (u128::try_from(micros).unwrap() * 1_000, r.get(1))
        })
        .collect()
}

async fn frozen_link(test: &str, leases: Leases, variant: Variant) {
    let db = TestDb::create(test).await;
    let client = db.connect_for_fenced_writes().await;

    // A reaches the lease backend through the proxy, B directly; both write to the database
    // directly.
    let mut _consul = None;
    let mut _etcd = None;
    let (flag, upstream, direct) = match leases {
        Leases::Consul => {
            let agent = Agent::start().await;
            let found = ("--consul", agent.addr(), agent.url());
            _consul = Some(agent);
            found
        }
        Leases::Etcd => {
            let server = lease_tests::etcd::Server::start().await;
            let found = ("--etcd", server.addr(), server.url());
            _etcd = Some(server);
            found
        }
        Leases::Postgres => (
            "--postgres-leases",
            server_addr(db.url()),
            db.url().to_owned(),
        ),
    };
    let proxy = Proxy::start(upstream).await.unwrap();
    let proxied = match leases {
        Leases::Postgres => through(db.url(), proxy.addr(), "lease-a"),
        _ => proxy.url(),
    };

    let advance = variant == Variant::Advance && !without_advance();
    let common = |lease_url: &str| {
        let mut args: Vec<String> = [
            flag,
            lease_url,
            "--key",
            KEY,
            "--postgres",
            db.url(),
            "--ttl",
            &TTL_SECS.to_string(),
            "--lock-delay",
            "0",
        ]
        .map(str::to_owned)
        .to_vec();
        if advance {
            args.push("--advance".to_owned());
        }
        if variant == Variant::Held {
            args.extend(["--fence".to_owned(), "held".to_owned()]);
        }
        args
    };
    let mut run = Run::new("fence-frozen-link", test, WRITER.as_ref());
    let mut a_args = common(&proxied);
    a_args.push("--unchecked".to_owned());
    let a = run.spawn("a", &a_args);
    let a_acquired = line_of(&run, a, Kind::Acquired, START).await;
    let a_seq: Sequencer = a_acquired.seq.parse().unwrap();
    line_of(&run, a, Kind::Write, STEP).await;
    let mut b_args = common(&direct);
    b_args.extend([
        "--first-write-after-ms".to_owned(),
        FIRST_WRITE_AFTER_MS.to_string(),
    ]);
    let b = run.spawn("b", &b_args);

    // A's link to the lease backend freezes; A writes on.
    proxy.set_blackhole(true);
    let frozen = now_ns();
    let b_acquired = line_of(&run, b, Kind::Acquired, TAKEOVER).await;
    let b_seq: Sequencer = b_acquired.seq.parse().unwrap();
    assert!(
        b_seq.order() > a_seq.order(),
        "B's sequencer {b_seq} is not newer than A's {a_seq}"
    );
    let a_refused = line_of(&run, a, Kind::Other("refused".into()), STEP).await;
    line_of(&run, b, Kind::Write, STEP).await;
    run.assert_alive();
    run.terminate_all().await.unwrap();

    let a_rows = rows_of(&client, a_seq.holder()).await;
    let stale: Vec<&(u128, i64)> = a_rows.iter().filter(|(t, _)| *t > b_acquired.t).collect();
    let ms = |from: u128, to: u128| (to as f64 - from as f64) / 1e6;
    let report = format!(
        "RESULT fence_frozen_link leases={leases:?} variant={variant:?} advance={advance} \
         a_rows={} stale_rows_after_next_acquisition={} takeover_ms={:.0} \
         a_refused_minus_b_acquired_ms={:.0}",
        a_rows.len(),
        stale.len(),
        ms(frozen, b_acquired.t),
        ms(b_acquired.t, a_refused.t),
    );
    println!("{report}");
    let refused_as_stale = a_refused.detail.contains("LF001") || a_refused.detail.contains("stale");
    if !stale.is_empty() || !refused_as_stale {
        run.keep = true;
        panic!(
            "{report}\nA's rows committed after B acquired (ns, attempt): {stale:?}\nA's refusal: \
             {a_refused}\nhistories:\n{}\n({})",
            run.all().around(b_acquired.t, 40),
            run.files()
        );
    }
    drop(db);
}

#[tokio::test]
async fn consul_no_stale_write_commits_after_the_next_leader_acquires() {
    frozen_link("frozen_consul", Leases::Consul, Variant::Advance).await;
}

#[tokio::test]
async fn etcd_no_stale_write_commits_after_the_next_leader_acquires() {
    frozen_link("frozen_etcd", Leases::Etcd, Variant::Advance).await;
}

#[tokio::test]
async fn postgres_no_stale_write_commits_after_the_next_leader_acquires() {
    frozen_link("frozen_postgres", Leases::Postgres, Variant::Advance).await;
}

#[tokio::test]
async fn postgres_the_row_fence_refuses_a_holder_whose_row_has_expired() {
    frozen_link("frozen_postgres_held", Leases::Postgres, Variant::Held).await;
}
