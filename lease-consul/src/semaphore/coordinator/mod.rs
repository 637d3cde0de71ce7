//! One writer of a semaphore's `.lock` key per process: takes and give-backs are batched.
//!
//! Every slot taken or given back is a compare-and-set of `<prefix>/.lock`. If each task of a
//! process wrote for itself, they would race each other's CAS: each loser costs a failed write
//! and a re-read, and under load most writes are losers. Instead, each process runs one
//! coordinator task per prefix. The process's tasks queue their takes and give-backs with it;
//! each round it reads the prefix (or plans on what its own last write left), lets the planner
//! (`lease_core::semaphore`) decide, and writes the plan as **one transaction**:
//!
//! - delete the contender keys of those leaving;
//! - lock the contender keys of those admitted (unlock first for a pooled session, so the
//!   LockIndex rises);
//! - CAS the new holder set;
//! - when that CAS creates `.lock`, assert that no leader lock has the prefix as its key
//!   (`consul::kind`): an operation more, no request more; a failed assertion costs one read of
//!   the prefix's key, and a leader lock's there refuses every take with `FlagsConflict`.
//!
//! A give-back and a waiting take of the same process thus hand a slot over in one write. Other
//! processes (`consul lock -n`, other instances) still race, and CAS keeps that correct: a stale
//! index means someone else wrote, so the coordinator re-reads and plans again. When the
//! semaphore is full it blocks on the prefix, as Consul's semaphore guide says, and still takes requests.
//!
//! This module is how requests reach a coordinator; the task itself (`task`) only executes
//! plans: reads, the transaction, answers, and trouble.
//!
//! # Bounds
//!
//! Requests reach the coordinator through a bounded channel of [`CHANNEL_CAPACITY`]; a caller
//! finding it full waits for room. The coordinator drains the channel at every turn of its loop,
//! also while takes wait for a slot, so that wait lasts one Consul request at most, and a
//! give-back never waits for a take. The queue behind the channel holds one take per caller
//! still waiting: a take whose caller went away is dropped as soon as the coordinator is between
//! requests, not at its next round.
//!
//! # Cancel safety
//!
//! A take whose caller went away before it was admitted is dropped; one admitted after its
//! caller went away is given back by the coordinator itself.

mod request;
mod task;

use self::request::{GiveReply, Request, TakeReply};

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::client::Client;
use lease_core::Error;
use lease_core::semaphore::{Give, Take, Taken};

/// How many requests may wait in a coordinator's channel; more callers wait for room.
const CHANNEL_CAPACITY: usize = 128;

/// A request for a slot, as `acquire` makes it.
#[derive(Clone, Copy, Debug)]
pub(super) struct TakeArgs<'a> {
    /// The session to admit.
    pub(super) session: &'a str,
    /// The limit the contender expects.
    pub(super) limit: u64,
    /// The value to write into the contender key.
    pub(super) value: &'a [u8],
    /// `LeaseSpec::settle_after_removal` (see `lease_core::semaphore::Take::settle`).
    pub(super) settle: Duration,
    /// Answer `Full` after one fresh read instead of waiting.
    pub(super) once: bool,
}

/// The coordinators of one client, one per prefix, started on demand.
#[derive(Default)]
pub(super) struct Coordinators {
    senders: Mutex<BTreeMap<String, mpsc::Sender<Request>>>,
}

impl fmt::Debug for Coordinators {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prefixes = self.senders.lock().map(|s| s.len()).unwrap_or_default();
        f.debug_struct("Coordinators")
            .field("prefixes", &prefixes)
            .finish()
    }
}

impl Coordinators {
    /// Asks for a slot of `prefix`; waits until admitted (or, for a take that must not wait,
    /// until one attempt has been made on a fresh read).
    ///
    /// Cancel safe: see the module docs.
    pub(super) async fn take(
        &self,
        client: &Client,
        prefix: &str,
        take: TakeArgs<'_>,
    ) -> Result<Taken, Error> {
        self.ask(client, prefix, |answer| {
            let wanted = Take {
                session: take.session.to_owned(),
                limit: take.limit,
                settle: take.settle,
                once: take.once,
            };
            let value = take.value.to_vec();
            Request::Take(wanted, TakeReply { value, answer })
        })
        .await
    }

    /// Gives `session`'s slot of `prefix` back (if it has one), deleting its contender key too if
    /// `delete_contender`; `settle` is the lease's `LeaseSpec::settle_after_removal`. Waits for
    /// the write.
    pub(super) async fn give(
        &self,
        client: &Client,
        prefix: &str,
        session: &str,
        delete_contender: bool,
        settle: Duration,
    ) -> Result<(), Error> {
        self.ask(client, prefix, |answer| {
            let give = Give {
                session: session.to_owned(),
                delete_contender,
                settle,
            };
            Request::Give(give, GiveReply::to(answer))
        })
        .await
    }

    /// Sends the request `make` builds to the coordinator of `prefix` and waits for its answer.
    async fn ask<R>(
        &self,
        client: &Client,
        prefix: &str,
        make: impl Fn(oneshot::Sender<Result<R, Error>>) -> Request,
    ) -> Result<R, Error> {
        // A coordinator that stops for idleness just as we send drops the request (and its
        // answer channel): send again, to a new one.
        for _ in 0..3 {
            let Some(sender) = self.sender(client, prefix) else {
                break;
            };
            let (answer_tx, answer) = oneshot::channel();
            if sender.send(make(answer_tx)).await.is_ok() {
                if let Ok(result) = answer.await {
                    return result;
                }
            }
        }
        Err(stopped(prefix))
    }

    /// The channel to the coordinator of `prefix`, started if none runs; `None` if the map's
    /// lock is poisoned.
    fn sender(&self, client: &Client, prefix: &str) -> Option<mpsc::Sender<Request>> {
        let mut senders = self.senders.lock().ok()?;
        senders.retain(|_, sender| !sender.is_closed());
        let sender = senders.entry(prefix.to_owned()).or_insert_with(|| {
            let (sender, requests) = mpsc::channel(CHANNEL_CAPACITY);
            lease_core::runtime::spawn(task::run(
                Arc::clone(client.wire()),
                client.watches().clone(),
                prefix.to_owned(),
                requests,
            ));
            sender
        });
        Some(sender.clone())
    }
}

fn stopped(prefix: &str) -> Error {
    Error::Backend {
        backend: "Consul",
        operation: format!("coordinate semaphore {prefix:?}"),
        message: "the coordinator stopped repeatedly; is the runtime shutting down?".into(),
        transient: true,
    }
}
