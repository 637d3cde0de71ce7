//! What every session-backed lease shares: the lock it holds ([`SessionLock`]), the holder
//! task's [`Hold`] around it, and the one-off judgement of a sequencer.

use std::future::Future;
use std::sync::Arc;

use tokio::time::Instant;

use super::end::Renewals;
use super::life::Session;
use crate::watch::{Interest, Listing};
use crate::wire::ConsulHttp;
use lease_core::backend::Hold;
use lease_core::{Backend, BackendKind, BoxFuture, Error, Lease, LostReason, Sequencer};

/// What a session-backed lease holds (a leader key, a semaphore slot): what to watch, how to
/// judge it, and how to give it back. Everything else (keeping the session alive, the
/// self-fence, the clean-up after a loss, the last-resort release) is [`SessionHold`]'s, the
/// same for both.
pub(crate) trait SessionLock: Send + Sync + 'static {
    /// The reason a loss that may have gone with the session is first published as (a leader
    /// key released, a contender key deleted); [`went_with_session`] refines it.
    const COARSE: LostReason;

    /// The key or prefix whose changes can mean loss.
    fn interest(&self) -> Interest;

    /// Whether the acquisition by `session` is lost, judged from a listing that covers
    /// [`interest`](SessionLock::interest).
    fn verdict(&self, listing: &Listing, session: &str) -> Option<LostReason>;

    /// Gives the lock back cleanly. `session` may be taken (a semaphore's pool keeps it), and
    /// `renewals` with it.
    fn give_back(
        &mut self,
        session: &mut Option<Session>,
        renewals: &mut Renewals,
    ) -> impl Future<Output = Result<(), Error>> + Send;
}

/// The [`Hold`] of every Consul lease: a session, what keeps it alive, and the lock it holds.
pub(crate) struct SessionHold<L> {
    lock: L,
    /// Taken by a give-back that keeps the session elsewhere.
    session: Option<Session>,
    renewals: Renewals,
    /// The index of our acquisition: older listings do not show it and are not judged.
    acquired_at: u64,
    /// Set by [`Hold::keep_until`]: a release before it leaves the key held until then.
    keep_until: Option<Instant>,
}

/// Turns what `session` acquired (`key`, created at `create_index` (the sequencer's generation,
/// 0 for none), at LockIndex `lock_index`, written at `index`) into a lease held by a
/// [`SessionHold`] of `lock`, and starts its holder task.
pub(crate) fn start_lease<L: SessionLock>(
    (key, create_index, lock_index, index): (&str, u64, u64, u64),
    session: Session,
    renewals: Renewals,
    backend: Arc<dyn Backend>,
    lock: L,
) -> Lease {
    let sequencer = Sequencer::new(BackendKind::Consul, key, lock_index, session.id())
        .with_generation(create_index);
    tracing::info!(%sequencer, "lease acquired");
    let (keepers, fence) = (session.client().keepers().clone(), session.fence().clone());
    let hold = SessionHold {
        lock,
        session: Some(session),
        renewals,
        acquired_at: index,
        keep_until: None,
    };
    keepers.start(sequencer, fence, backend, hold)
}

impl<L: SessionLock> Hold for SessionHold<L> {
    async fn watch(&mut self) -> LostReason {
        let Some(session) = &self.session else {
            return LostReason::Released;
        };
        let (lock, id, acquired_at) = (&self.lock, session.id(), self.acquired_at);
        // Suspends the session's fence whenever nothing reads the lock's key: a lease the
        // process cannot see is not kept alive by its session alone.
        let mut watched =
            session
                .client()
                .watches()
                .watch(lock.interest(), false, Some(session.fence()));
        let lock_watch = async {
            loop {
                // Failures are not reported to this watch: keeping the session alive is what
                // self-fences when they last.
                if let Ok(listing) = watched.next(acquired_at).await {
                    if let Some(reason) = lock.verdict(&listing, id) {
                        return reason;
                    }
                }
            }
        };
        tokio::select! {
            biased;
            end = &mut self.renewals => end.into(),
            reason = lock_watch => reason,
        }
    }

    async fn refine(&mut self, reason: &LostReason) -> Option<LostReason> {
        let session = self.session.as_ref()?;
        if *reason != L::COARSE {
            return None;
        }
        went_with_session(session.wire(), session.id()).await
    }

    fn keep_until(&mut self, until: Instant) -> bool {
        let can = self.session.as_ref().is_some_and(Session::can_keep);
        if can {
            self.keep_until = Some(until);
        }
        can
    }

    async fn release(&mut self) -> Result<(), Error> {
        let left = self
            .keep_until
            .map(|until| until.saturating_duration_since(Instant::now()))
            .filter(|left| !left.is_zero());
        if let (Some(left), Some(session)) = (left, &mut self.session) {
            return session.keep(left).await;
        }
        self.lock
            .give_back(&mut self.session, &mut self.renewals)
            .await
    }

    async fn clean_up(&mut self, _reason: &LostReason) {
        // After a loss the work may still be stopping: destroy the session without releasing
        // first, so whatever it still holds stays under lock-delay (or is pruned after the
        // settle time) while the work stops.
        if let Some(session) = &mut self.session {
            if let Err(error) = session.destroy().await {
                tracing::warn!(%error, "could not destroy the session of a lost lease; it expires with its TTL or heartbeat check");
            }
        }
    }

    fn abandon(self) -> Option<BoxFuture<'static, ()>> {
        match self.keep_until.filter(|until| *until > Instant::now()) {
            Some(until) => self.session?.abandon_kept(until),
            None => self.session?.abandon(),
        }
    }
}

/// The answer of a one-off check (`check_sequencer`) from its verdict: the loss, refined as the
/// holder task of an `L` refines it.
pub(crate) async fn judged<L: SessionLock>(
    http: &ConsulHttp,
    session: &str,
    lost: Option<LostReason>,
) -> Result<(), Error> {
    match lost {
        None => Ok(()),
        Some(reason) if reason == L::COARSE => {
            let refined = went_with_session(http, session).await;
            Err(Error::Lost(refined.unwrap_or(reason)))
        }
        Some(reason) => Err(Error::Lost(reason)),
    }
}

/// Whether a lock that went away under `session` (a leader key released, a contender key
/// deleted) went with the session itself: one read of the session. `None` if the session still
/// exists or the read failed: the reason seen stands.
pub(crate) async fn went_with_session(http: &ConsulHttp, session: &str) -> Option<LostReason> {
    match http.session_exists(session).await {
        Ok(false) => Some(LostReason::SessionInvalidated),
        Ok(true) | Err(_) => None,
    }
}
