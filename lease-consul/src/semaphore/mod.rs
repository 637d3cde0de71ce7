//! The Consul semaphore (Consul's semaphore guide): at most `limit` holders under a prefix, interoperating with
//! `consul lock -n`.
//!
//! Layout, as Consul's CLI and Go client write it: a contender key `<prefix>/<session>` held by
//! each holder's session (behaviour delete, so a dead holder's key vanishes), and the coordinating
//! key `<prefix>/.lock` = `{"Limit":N,"Holders":{"<session>":true}}`, both with flags
//! [`SEMAPHORE_FLAGS`]. The guide's list form of `Holders` is read too ([`value`]).
//!
//! Admission: one transaction locks our contender key and CASes us into `Holders` on the lock
//! key's ModifyIndex (0 when creating), pruning holders whose session no longer holds a key. The
//! process's takes and give-backs of one prefix are batched into such transactions by one
//! [`coordinator`] task, so they never race each other; a full semaphore is waited for with a
//! watch of the prefix. Who is admitted, kept or pruned is decided by the planner shared
//! with the memory backend (`lease_core::semaphore`); the coordinator only executes its plans.
//!
//! A holder whose session is gone keeps its slot for the settle time
//! (`LeaseSpec::settle_after_removal`: max(lock-delay, settle)) before it is pruned, so a
//! holder invalidated behind its back has that long to notice and stop its work before anyone
//! else is admitted; lock-delay and settle 0 prune at once.
//!
//! Holding: the prefix, through the client's shared prefix watches (`watch`), beside what keeps
//! the session alive. The lease is lost when our session leaves `Holders`, our contender key goes or changes
//! hands, the session is invalidated, or the self-fencing deadline passes. The sequencer is our
//! contender key with its LockIndex and our session. A pooled session ([`pool`]) re-locks its
//! contender key when admitted again, so the sequencer changes on every acquisition.

mod coordinator;
mod pool;
mod state;
mod value;

pub use self::state::{SemaphoreHolder, SemaphoreState};
pub(crate) use self::state::{destroy, state};

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use self::coordinator::{Coordinators, TakeArgs};
use self::pool::{Pool, Pooled};
use self::value::{directory, read_snapshot};
use super::client::Client;
use super::session::{self, Renewals, Session, SessionEnd, SessionLock};
use super::watch::{Interest, Listing};
use super::wire::{Behavior, ConsulHttp, KvEntry};
pub(crate) use lease_core::semaphore::{SEMAPHORE_FLAGS, prefix_of};
use lease_core::semaphore::{Taken, contender_key};
use lease_core::{Backend, Error, Lease, LeaseSpec, LostReason, Sequencer, Target};

/// A client's semaphore machinery: the idle-session pool and the per-prefix coordinators.
#[derive(Debug)]
pub(crate) struct Semaphores {
    pool: Pool,
    coordinators: Coordinators,
}

impl Semaphores {
    pub(crate) fn new(pool_idle_for: Option<Duration>) -> Self {
        Semaphores {
            pool: Pool::new(pool_idle_for),
            coordinators: Coordinators::default(),
        }
    }
}

/// Acquires a slot of the semaphore `spec` names (validated by the caller).
pub(crate) async fn acquire(
    client: &Arc<Client>,
    semaphores: &Arc<Semaphores>,
    spec: &LeaseSpec,
    backend: Arc<dyn Backend>,
) -> Result<Lease, Error> {
    let Target::Semaphore { prefix, limit } = spec.target() else {
        return Err(Error::config("not a semaphore spec"));
    };
    let limit = u64::from(*limit);
    let started = Instant::now();
    let deadline = spec.wait_policy().deadline(started);
    let once = spec.wait_policy() == lease_core::Wait::Never;
    let busy = || Error::Busy {
        key: prefix.clone(),
        waited: started.elapsed(),
    };
    loop {
        let Pooled {
            mut session,
            mut renewals,
        } = match semaphores.pool.take(prefix).await {
            Some(pooled) => pooled,
            None => {
                let (session, renewals) = Session::create(client, spec, Behavior::Delete).await?;
                Pooled { session, renewals }
            }
        };
        let take = semaphores.coordinators.take(
            client,
            prefix,
            TakeArgs {
                session: session.id(),
                limit,
                value: spec.advertised_value(),
                settle: spec.settle_after_removal(),
                once,
            },
        );
        // `Wait::Never` is answered by the coordinator after one fresh read, not by a timer.
        let waited = async {
            match deadline {
                Some(deadline) if !once => tokio::time::timeout_at(deadline, take).await.ok(),
                _ => Some(take.await),
            }
        };
        let outcome = tokio::select! {
            biased;
            end = &mut renewals => Err(end),
            taken = waited => Ok(taken),
        };
        match outcome {
            Ok(Some(Ok(Taken::Admitted { lock_index, index }))) => {
                let admitted = Admitted { lock_index, index };
                return Ok(into_lease(
                    semaphores, spec, session, renewals, admitted, backend,
                ));
            }
            Ok(Some(Ok(Taken::SessionGone))) => {
                let _ = session.destroy().await;
            }
            // Busy. The session holds no slot (if the coordinator admitted it as the wait ran
            // out, the coordinator gives that slot back itself): keep it for the next try, or
            // destroy it.
            Ok(Some(Ok(Taken::Full)) | None) => {
                if let Err(Pooled { mut session, .. }) =
                    semaphores.pool.put(prefix, Pooled { session, renewals })
                {
                    let _ = session.destroy().await;
                }
                return Err(busy());
            }
            Ok(Some(Err(error))) => {
                // A call that timed out in a pause of this process fails beside the fence.
                let error = session.fence().explain(error);
                let _ = session.destroy().await;
                return Err(error);
            }
            // The waiting session was destroyed (by an operator, or it expired): wait with another.
            Err(SessionEnd::Invalidated) => {}
            Err(end) => return Err(end.into_wait_error(prefix)),
        }
    }
}

/// What admission learned: our contender key's LockIndex and an index to watch from.
struct Admitted {
    lock_index: u64,
    index: u64,
}

fn into_lease(
    semaphores: &Arc<Semaphores>,
    spec: &LeaseSpec,
    session: Session,
    renewals: Renewals,
    admitted: Admitted,
    backend: Arc<dyn Backend>,
) -> Lease {
    let prefix = spec.key();
    let contender = contender_key(prefix, session.id());
    let lock = SemaphoreSlot {
        semaphores: Arc::clone(semaphores),
        prefix: prefix.to_owned(),
        directory: directory(prefix),
        settle: spec.settle_after_removal(),
        lock_index: admitted.lock_index,
    };
    // A contender key is the holder's own: no generation orders it against others.
    let at = (contender.as_str(), 0, admitted.lock_index, admitted.index);
    session::start_lease(at, session, renewals, backend, lock)
}

/// Whether a holder still holds its slot, from one read of the prefix; `None` if it does. A
/// contender key that is gone is reported as [`LostReason::KeyDeleted`]; whether the session was
/// invalidated (which deletes it) takes one more read (`session::went_with_session`).
fn verdict(
    prefix: &str,
    entries: &[KvEntry],
    session: &str,
    lock_index: u64,
) -> Option<LostReason> {
    let contender = contender_key(prefix, session);
    match entries.iter().find(|e| e.key == contender) {
        None => return Some(LostReason::KeyDeleted),
        Some(e) if e.holder() != Some(session) || e.lock_index != lock_index => {
            return Some(match e.holder() {
                Some(holder) => LostReason::KeyTaken {
                    lock_index: e.lock_index,
                    session: holder.to_owned(),
                },
                None => LostReason::KeyReleased,
            });
        }
        Some(_) => {}
    }
    // An unreadable lock key means our slot is no longer provable: that is loss too.
    if read_snapshot(prefix, entries, 0).records_holder(session) {
        None
    } else {
        Some(LostReason::HolderPruned)
    }
}

/// The slot a session holds: its contender key under `prefix`, recorded in `Holders`.
struct SemaphoreSlot {
    semaphores: Arc<Semaphores>,
    prefix: String,
    /// `<prefix>/`, which every key of the semaphore is under.
    directory: String,
    /// `LeaseSpec::settle_after_removal`, for the give-back.
    settle: Duration,
    lock_index: u64,
}

impl SessionLock for SemaphoreSlot {
    /// The contender key is gone: deleted by an operator, or with our invalidated session.
    const COARSE: LostReason = LostReason::KeyDeleted;

    fn interest(&self) -> Interest {
        Interest::Prefix(self.directory.clone())
    }

    fn verdict(&self, listing: &Listing, session: &str) -> Option<LostReason> {
        let entries = listing.under(&self.directory);
        verdict(&self.prefix, entries, session, self.lock_index)
    }

    async fn give_back(
        &mut self,
        slot: &mut Option<Session>,
        renewals: &mut Renewals,
    ) -> Result<(), Error> {
        let Some(mut session) = slot.take() else {
            return Ok(());
        };
        let client = Arc::clone(session.client());
        let (semaphores, prefix, settle) = (&self.semaphores, &self.prefix, self.settle);
        if semaphores.pool.enabled() {
            // Keep the session and its contender key for the next acquisition.
            let given = semaphores
                .coordinators
                .give(&client, prefix, session.id(), false, settle)
                .await;
            if let Err(error) = given {
                *slot = Some(session);
                return Err(error);
            }
            let renewals = std::mem::replace(renewals, Box::pin(std::future::pending()));
            if let Err(Pooled { mut session, .. }) =
                semaphores.pool.put(prefix, Pooled { session, renewals })
            {
                return session.destroy().await;
            }
            return Ok(());
        }
        let left = semaphores
            .coordinators
            .give(&client, prefix, session.id(), true, settle)
            .await;
        let destroyed = session.destroy().await;
        left.and(destroyed)
    }
}

/// Whether `sequencer` (a contender key of the semaphore at `prefix`) still holds a slot.
pub(crate) async fn check_sequencer(
    http: &ConsulHttp,
    prefix: &str,
    sequencer: &Sequencer,
) -> Result<(), Error> {
    let (entries, _) = http
        .kv_list(&directory(prefix))
        .await
        .map_err(|e| e.into_error(http, format_args!("read semaphore {prefix:?}")))?;
    let lost = verdict(prefix, &entries, sequencer.holder(), sequencer.index());
    session::judged::<SemaphoreSlot>(http, sequencer.holder(), lost).await
}
