//! Batched attempts: every acquisition attempt of a handle that is pending at one moment goes in
//! one statement, `lease.try_acquire_many(..)`, and so in one commit.
//!
//! An attempt that takes a lease commits a row, and a commit waits for its WAL flush: one
//! attempt per statement bounds a connection to a few hundred acquisitions a second. One task
//! per handle takes whatever attempts are queued when it wakes (a process acquiring 1,000 leases
//! at start-up, waiters woken by one release), sends them together and answers each; an attempt
//! alone goes at once, as alone. `lease.try_acquire_many(..)` locks its keys in one order, so two
//! batches never wait for each other in a cycle. The acquire keeps its attempt's [`InFlight`]
//! answer: one dropped before its attempt was sent sends nothing (the answer's receiver is gone
//! with it); one dropped while it was under way hands the receiver to its clean-up, which waits
//! for the statement's answer before it gives the row back, so that the give-back is one of the
//! clean-ups `Backend::shutdown` waits for.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::batch::{Batched, Drain};
use super::wire::{PgError, Wire};

/// The most attempts one statement carries.
const BATCH: usize = 1_000;

/// One attempt's parameters (see `lease.try_acquire`).
#[derive(Clone, Debug)]
pub(crate) struct Attempt {
    pub(crate) key: String,
    pub(crate) holder: String,
    pub(crate) semaphore: bool,
    pub(crate) limit: i32,
    pub(crate) ttl: f64,
    pub(crate) settle: f64,
    pub(crate) value: Vec<u8>,
}

/// What an attempt answered, and when the statement that carried it was sent.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) outcome: String,
    pub(crate) index: Option<i64>,
    pub(crate) in_use: Option<i32>,
    pub(crate) wait_seconds: Option<f64>,
    pub(crate) sent: Instant,
}

type Reply = oneshot::Sender<Result<Answer, PgError>>;

/// Where a queued attempt's answer arrives; an attempt whose `InFlight` is dropped before the
/// attempt is sent is not sent.
pub(crate) type InFlight = oneshot::Receiver<Result<Answer, PgError>>;

/// The pending attempts of one backend handle.
pub(crate) type Attempts = Batched<Attempt, Result<Answer, PgError>>;

/// Queues `attempt` to go with the attempts queued beside it; one try, no retry. The task that
/// sends them is handed the wire, weakly.
pub(crate) fn attempt(attempts: &Attempts, wire: &Arc<Wire>, attempt: Attempt) -> InFlight {
    attempts.push(attempt, |drain| attempt_all(drain, Arc::downgrade(wire)))
}

/// The answer of an attempt under way.
pub(crate) async fn answer(in_flight: &mut InFlight) -> Result<Answer, PgError> {
    in_flight
        .await
        .unwrap_or_else(|_| Err(PgError::Malformed("the backend handle is gone".into())))
}

async fn attempt_all(drain: Drain<Attempt, Result<Answer, PgError>>, wire: Weak<Wire>) {
    while let Some(batch) = drain.next(BATCH).await {
        // An acquire dropped before its attempt was sent needs nothing sent.
        let (batch, replies): (Vec<Attempt>, Vec<Reply>) = batch
            .into_iter()
            .filter(|(_, reply)| !reply.is_closed())
            .unzip();
        if batch.is_empty() {
            continue;
        }
        let Some(strong) = wire.upgrade() else {
            return;
        };
        let keys: Vec<&str> = batch.iter().map(|a| a.key.as_str()).collect();
        let holders: Vec<&str> = batch.iter().map(|a| a.holder.as_str()).collect();
        let semaphores: Vec<bool> = batch.iter().map(|a| a.semaphore).collect();
        let limits: Vec<i32> = batch.iter().map(|a| a.limit).collect();
        let ttls: Vec<f64> = batch.iter().map(|a| a.ttl).collect();
        let settles: Vec<f64> = batch.iter().map(|a| a.settle).collect();
        let values: Vec<&[u8]> = batch.iter().map(|a| a.value.as_slice()).collect();
        let sql = strong.sql(
            "SELECT holder, outcome, lease_index, in_use, wait_seconds \
             FROM lease.try_acquire_many($1, $2, $3, $4, $5, $6, $7)",
        );
        let mut sent = Instant::now();
        let answer = strong
            .request(true, |client| {
                sent = Instant::now();
                let (sql, keys, holders, semaphores, limits, ttls, settles, values) = (
                    &sql,
                    &keys,
                    &holders,
                    &semaphores,
                    &limits,
                    &ttls,
                    &settles,
                    &values,
                );
                async move {
                    client
                        .query(
                            sql,
                            &[keys, holders, semaphores, limits, ttls, settles, values],
                        )
                        .await
                }
            })
            .await;
        let rows = match answer {
            Ok(rows) => rows,
            Err(error) => {
                let error = Arc::new(error);
                for reply in replies {
                    let _ = reply.send(Err(PgError::Batch(Arc::clone(&error))));
                }
                continue;
            }
        };
        let mut answers: HashMap<String, Result<Answer, PgError>> = HashMap::new();
        for row in rows {
            let read = || -> Result<(String, Answer), tokio_postgres::Error> {
                Ok((
                    row.try_get(0)?,
                    Answer {
                        outcome: row.try_get(1)?,
                        index: row.try_get(2)?,
                        in_use: row.try_get(3)?,
                        wait_seconds: row.try_get(4)?,
                        sent,
                    },
                ))
            };
            if let Ok((holder, answer)) = read() {
                answers.insert(holder, Ok(answer));
            }
        }
        for (attempt, reply) in batch.into_iter().zip(replies) {
            let answer = answers.remove(&attempt.holder).unwrap_or_else(|| {
                Err(PgError::Malformed(format!(
                    "no answer for the attempt of {}",
                    attempt.holder
                )))
            });
            // Nobody to answer only if the acquire's clean-up was dropped too (its runtime
            // ended): a row inserted meanwhile expires with its TTL.
            let _ = reply.send(answer);
        }
    }
}
