//! The PostgreSQL leader lease and semaphore vs a ShedLock-style lock table polled by its
//! contenders, side by side in one fresh database.
//!
//! `cargo bench -p lease-postgres --bench postgres_leader --features backend`; the quick mode CI
//! runs (5 losses each way, one round of 4 contenders each way, 8 semaphore jobs each way; a few
//! seconds): `LEASE_BENCH_QUICK=1 cargo test -p lease-postgres --bench postgres_leader --features
//! backend`. In every mode the run fails if a loss of ours is noticed later than the lease's
//! fence interval ([`LeaseSpec::fence_after`]), if two leader holders (ours or the table's) or
//! more than the limit of semaphore holders overlap, if one of our leases is lost while held, or
//! if a round does not complete (within [`STALL`]).
//!
//! # The peer: a ShedLock-style lock table
//!
//! ShedLock's JDBC provider keeps one row per lock, `shedlock(name PRIMARY KEY, lock_until,
//! locked_at, locked_by)`. With the database's clock (`usingDbTime()`, on PostgreSQL) a node
//! takes the lock with `INSERT … ON CONFLICT (name) DO UPDATE SET lock_until = now() +
//! lockAtMostFor, locked_at = now(), locked_by = me WHERE lock_until <= now()` (one row changed:
//! it holds), and unlocks with `UPDATE … SET lock_until = greatest(locked_at + lockAtLeastFor,
//! now()) WHERE name = ? AND locked_by = me`. ShedLock does not wait: a node that finds the lock
//! held skips the run, and its scheduler tries again at the next tick. Waiting is modelled here
//! as polling the lock every [`POLL`] (100 ms): far more often than a scheduler's usual seconds or
//! minutes, so the table is measured at the best hand-off it would give at ten statements a second
//! per waiting node. `lockAtMostFor` is 10 s (an expiry only a dead holder reaches here) and
//! `lockAtLeastFor` 0 (an unlock frees the row at once). Each contender is a node with
//! `locked_by` of its own (ShedLock's default, the host name, would be shared by the tasks of one
//! process); all share one connection, as ours share one `Postgres`. A node that finds the lock
//! held waits a random part of a period before its first retry, so the nodes poll out of phase,
//! as independent hosts would (started together, they polled in lockstep and every hand-off waited
//! most of a period: 59 ms p50 in a first run).
//!
//! - loss → cancel: an operator takes the holder's lease (ours: deletes its row; the table's:
//!   deletes its `shedlock` row); we time until the guarded work is dropped. ShedLock has no loss
//!   detection at all: its holder runs to the end whatever happens to the row. The figure given
//!   for it is that of a holder that checks its row every [`POLL`] (`locked_by = me AND
//!   lock_until > now()`) and stops when it is not: a generous model, not something ShedLock
//!   does. The operator acts at a random point of that polling period, so the figure is not an
//!   artefact of its phase.
//! - hand-off gap: 16 contenders each hold 20 ms and release; the gap between one holder's end and
//!   the next holder's start.
//! - semaphore: 32 jobs of 50 ms at limit 4; the ideal is 32 / 4 × 50 ms = 0.4 s. The table's
//!   semaphore is 4 rows `name#0` … `name#3`: a job tries each once per poll.
//!
//! Timestamps are wall-clock nanoseconds (`SystemTime`), taken in this one process.

#![allow(clippy::unwrap_used)] // A benchmark that cannot set up should stop loudly.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_core::{Backend, LeaseSpec, Sequencer};
use lease_postgres::Postgres;
use lease_tests::overlap::{
    DropStamp, Rng, Timeline, leader_handoff, loss_to_cancel, now_ns, semaphore_jobs,
};
use lease_tests::postgres::TestDb;
use lease_tests::stats::{percentile, scaled};
use tokio_postgres::Client;

const LOSS_TRIALS: usize = 30;
const CONTENDERS: usize = 16;
const HOLD: Duration = Duration::from_millis(20);
const ROUNDS: usize = 3;
const JOBS: usize = 32;
const LIMIT: u32 = 4;
const JOB: Duration = Duration::from_millis(50);
/// How often a waiting node retries the table, and how often a holder checks its row.
const POLL: Duration = Duration::from_millis(100);
/// The table's `lockAtMostFor`: how long a row stays taken if its holder dies.
const LOCK_AT_MOST_FOR: Duration = Duration::from_secs(10);
/// How long a round may take before the run fails as stalled: a liveness bound far above any
/// round's time, not a timing that is asserted.
const STALL: Duration = Duration::from_secs(120);

/// The operator takes the holder's lease by deleting its row (`Postgres::delete_holder`, an
/// administrator's `DELETE`), on a handle of its own.
async fn ours_loss_to_cancel(operator: &Postgres, postgres: &Postgres) -> Vec<f64> {
    let spec = |trial| LeaseSpec::leader(format!("bench/loss/ours-{trial}"));
    let delete_row = async |sequencer: &Sequencer| {
        let deleted = operator.delete_holder(sequencer.holder()).await.unwrap();
        assert!(deleted, "the holder's row was there to delete");
    };
    loss_to_cancel(
        postgres,
        scaled(LOSS_TRIALS, 5),
        spec,
        delete_row,
        "its row was deleted",
    )
    .await
}

/// The ShedLock-style table (see the module docs), on one shared connection.
#[derive(Clone)]
struct Table {
    client: Arc<Client>,
}

impl Table {
    async fn create(client: Client) -> Table {
        client
            .batch_execute(
                "CREATE TABLE shedlock (name varchar(64) PRIMARY KEY, \
                 lock_until timestamptz NOT NULL, locked_at timestamptz NOT NULL, \
                 locked_by varchar(255) NOT NULL)",
            )
            .await
            .unwrap();
        Table {
            client: Arc::new(client),
        }
    }

    /// One attempt: whether `node` now holds `name`.
    async fn try_lock(&self, name: &str, node: &str) -> bool {
        let at_most = LOCK_AT_MOST_FOR.as_millis() as i64;
        let changed = self
            .client
            .execute(
                "INSERT INTO shedlock AS s (name, lock_until, locked_at, locked_by) \
                 VALUES ($1, now() + $3::int8 * interval '1 millisecond', now(), $2) \
                 ON CONFLICT (name) DO UPDATE SET lock_until = excluded.lock_until, \
                 locked_at = excluded.locked_at, locked_by = excluded.locked_by \
                 WHERE s.lock_until <= now()",
                &[&name, &node, &at_most],
            )
            .await
            .unwrap();
        changed == 1
    }

    /// Attempts each of `rows` once, from `rows[first]` on, then again after `phase`, then every
    /// [`POLL`] until `node` holds one: the row it holds.
    async fn lock_any<'r>(
        &self,
        rows: &'r [String],
        first: usize,
        node: &str,
        phase: Duration,
    ) -> &'r str {
        let mut wait = phase;
        loop {
            for k in 0..rows.len() {
                let row = &rows[(first + k) % rows.len()];
                if self.try_lock(row, node).await {
                    return row;
                }
            }
            tokio::time::sleep(wait).await;
            wait = POLL;
        }
    }

    /// ShedLock's unlock with `lockAtLeastFor` 0: the row is free from now.
    async fn unlock(&self, name: &str, node: &str) {
        self.client
            .execute(
                "UPDATE shedlock SET lock_until = greatest(locked_at, now()) \
                 WHERE name = $1 AND locked_by = $2",
                &[&name, &node],
            )
            .await
            .unwrap();
    }

    /// Whether the row still says `node` holds `name` (the holder's own check, not ShedLock's).
    async fn still_held(&self, name: &str, node: &str) -> bool {
        let rows = self
            .client
            .query(
                "SELECT 1 FROM shedlock WHERE name = $1 AND locked_by = $2 AND lock_until > now()",
                &[&name, &node],
            )
            .await
            .unwrap();
        !rows.is_empty()
    }
}

async fn table_loss_to_cancel(admin: &Client, table: &Table, rng: &mut Rng) -> Vec<f64> {
    let mut samples = Vec::new();
    for trial in 0..scaled(LOSS_TRIALS, 5) {
        let name = format!("bench/loss/table-{trial}");
        let node = format!("node-{trial}");
        assert!(table.try_lock(&name, &node).await, "trial {trial}: free");
        let (stamp, dropped) = DropStamp::new();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let holder = {
            let (table, name) = (table.clone(), name.clone());
            tokio::spawn(async move {
                let work = async move {
                    let _stamp = stamp;
                    let _ = ready_tx.send(());
                    std::future::pending::<()>().await
                };
                let check = async {
                    loop {
                        tokio::time::sleep(POLL).await;
                        if !table.still_held(&name, &node).await {
                            return;
                        }
                    }
                };
                tokio::select! {
                    () = work => {}
                    () = check => {}
                }
            })
        };
        ready_rx.await.unwrap();
        // At a random point of the holder's polling period.
        let phase = Duration::from_micros(rng.below(POLL.as_micros() as u64));
        tokio::time::sleep(phase).await;
        let t0 = now_ns();
        let deleted = admin
            .execute("DELETE FROM shedlock WHERE name = $1", &[&name])
            .await
            .unwrap();
        assert_eq!(deleted, 1, "trial {trial}: the row was there");
        tokio::time::timeout(STALL, holder)
            .await
            .unwrap_or_else(|_| panic!("trial {trial}: the holder never noticed"))
            .unwrap();
        let t1 = dropped.lock().unwrap().expect("work dropped");
        samples.push(t1.saturating_sub(t0) as f64 / 1e6);
    }
    samples
}

async fn ours_handoff(postgres: &Postgres) -> Vec<f64> {
    let spec = |round| LeaseSpec::leader(format!("bench/handoff/ours-{round}"));
    let (rounds, contenders) = (scaled(ROUNDS, 1), scaled(CONTENDERS, 4));
    leader_handoff(postgres, rounds, spec, contenders, HOLD, STALL).await
}

/// A random point of a polling period for each of `n` nodes.
fn phases(rng: &mut Rng, n: usize) -> Vec<Duration> {
    (0..n)
        .map(|_| Duration::from_micros(rng.below(POLL.as_micros() as u64)))
        .collect()
}

/// `n` nodes (`<role>-<i>`) take the table's `rows` in turn: each starts polling at a random
/// point of a period, holds a row for `hold` and unlocks it. Node `i` tries `rows[i % len]` first,
/// so a first wave fills every row. Returns their holds, once every node has held and unlocked;
/// fails if they take longer than [`STALL`] or a node never held.
async fn table_in_turn(
    table: &Table,
    rows: &[String],
    role: &str,
    n: usize,
    hold: Duration,
    rng: &mut Rng,
) -> Timeline {
    let timeline = Timeline::new();
    let tasks: Vec<_> = (phases(rng, n).into_iter().enumerate())
        .map(|(i, phase)| {
            let (table, rows, timeline) = (table.clone(), rows.to_vec(), timeline.clone());
            let node = format!("{role}-{i}");
            tokio::spawn(async move {
                let row = table.lock_any(&rows, i, &node, phase).await;
                let guard = timeline.hold(node.clone());
                tokio::time::sleep(hold).await;
                drop(guard);
                table.unlock(row, &node).await;
            })
        })
        .collect();
    let joined = async {
        for task in tasks {
            task.await.unwrap();
        }
    };
    tokio::time::timeout(STALL, joined)
        .await
        .unwrap_or_else(|_| panic!("the table's {n} {role}s on {rows:?} stalled for {STALL:?}"));
    assert_eq!(timeline.len(), n, "not every {role} held a row of {rows:?}");
    timeline
}

async fn table_handoff(table: &Table, rng: &mut Rng) -> Vec<f64> {
    let mut all = Vec::new();
    for round in 0..scaled(ROUNDS, 1) {
        let rows = [format!("bench/handoff/table-{round}")];
        let contenders = scaled(CONTENDERS, 4);
        let timeline = table_in_turn(table, &rows, "node", contenders, HOLD, rng).await;
        all.extend(timeline.handoff_gaps_ms());
    }
    all
}

async fn table_semaphore(table: &Table, jobs: usize, rng: &mut Rng) -> f64 {
    let rows: Vec<String> = (0..LIMIT).map(|k| format!("bench/sem/table#{k}")).collect();
    let started = Instant::now();
    let timeline = table_in_turn(table, &rows, "job", jobs, JOB, rng).await;
    let took = started.elapsed().as_secs_f64();
    timeline.assert_at_most(LIMIT as usize);
    took
}

#[tokio::main]
async fn main() {
    let db = TestDb::create("postgres_leader").await;
    let admin = db.connect().await;
    let postgres = Postgres::new(db.url()).unwrap();
    let operator = Postgres::builder()
        .url(db.url())
        .application_name("bench-operator")
        .build()
        .unwrap();
    let table = Table::create(db.connect().await).await;
    let mut rng = Rng::seeded(20_251_126);

    let ours_loss = ours_loss_to_cancel(&operator, &postgres).await;
    let table_loss = table_loss_to_cancel(&admin, &table, &mut rng).await;
    let ours_gap = ours_handoff(&postgres).await;
    let table_gap = table_handoff(&table, &mut rng).await;
    let jobs = scaled(JOBS, 8);
    let spec = LeaseSpec::semaphore("bench/sem/ours", LIMIT);
    let ours_sem = semaphore_jobs(&postgres, &spec, jobs, JOB, STALL)
        .await
        .as_secs_f64();
    let table_sem = table_semaphore(&table, jobs, &mut rng).await;
    let ideal = jobs as f64 / f64::from(LIMIT) * JOB.as_secs_f64();

    let contenders = scaled(CONTENDERS, 4);
    println!(
        "ShedLock-style table: polled every {POLL:?}, lockAtMostFor {LOCK_AT_MOST_FOR:?}, \
         lockAtLeastFor 0; its loss figure is a holder checking its row every {POLL:?} \
         (ShedLock itself never notices)"
    );
    println!("{:<38} {:>9} {:>9} {:>6}", "ms", "p50", "p99", "n");
    let rows = [
        ("loss -> cancel (ours)".to_owned(), &ours_loss),
        ("loss -> cancel (table, own check)".to_owned(), &table_loss),
        (format!("hand-off gap, {contenders} (ours)"), &ours_gap),
        (format!("hand-off gap, {contenders} (table)"), &table_gap),
    ];
    for (name, samples) in rows {
        println!(
            "{name:<38} {:>9.2} {:>9.2} {:>6}",
            percentile(samples, 50.0),
            percentile(samples, 99.0),
            samples.len()
        );
    }
    println!(
        "semaphore: {jobs} x {JOB:?} jobs at limit {LIMIT}: ours {ours_sem:.3} s, table \
         {table_sem:.3} s (ideal {ideal:.1} s)"
    );
    println!(
        "RESULT pg_loss_cancel_p99_ms={:.2} shedlock_loss_p99_ms={:.2} pg_handoff_p50_ms={:.2} \
         shedlock_handoff_p50_ms={:.2} pg_sem_total_s={ours_sem:.3} \
         shedlock_sem_total_s={table_sem:.3} ideal_s={ideal:.1}",
        percentile(&ours_loss, 99.0),
        percentile(&table_loss, 99.0),
        percentile(&ours_gap, 50.0),
        percentile(&table_gap, 50.0),
    );
    postgres.shutdown().await;
}
