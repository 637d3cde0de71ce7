//! The conformance suite: one set of lease scenarios, run against every backend.
//!
//! Each scenario is written once in [`scenarios`], generic over an `Arc<dyn Backend>` and an
//! [`Operator`] (the out-of-band actions an administrator takes: destroy a holder's session,
//! delete a key). The `conformance!` macro instantiates every scenario for one backend, so a
//! backend that passes here keeps the same contract as the others: contention, loss on session
//! destroy, a new sequencer on every acquisition, release on drop, waiting with a timeout, not
//! waiting, lock-delay, and semaphores with a limit.
//!
//! AMQP runs the scenarios that do not need sessions or keys (it has neither); its losses
//! (connection closed, slot removed) are tested in tests/amqp.rs.
//!
//! Run: `cargo test -p lease-tests --test conformance` (the Consul half starts a dev agent per
//! test; see `lease_tests::consul`; the AMQP half needs the broker on 127.0.0.1:5672).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lease_core::{Backend, Error, LeaseSpec, LostReason, Wait};
use lease_tests::{assert_refined, release_lost, within};

/// A bound on every wait for an event; generous, since only a broken lease takes this long.
const EVENT: Duration = Duration::from_secs(10);

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What an administrator does to a backend behind the clients' backs.
trait Operator: Send + Sync {
    /// Destroys the session (or holder) `holder`, as named by `Sequencer::holder`.
    fn destroy_session<'a>(&'a self, holder: &'a str) -> BoxFuture<'a, ()>;
    /// Deletes a key.
    fn delete_key<'a>(&'a self, key: &'a str) -> BoxFuture<'a, ()>;
}

/// Removes what a scenario's keys left on a server that keeps it (AMQP's durable slot queues).
type Cleanup = Box<dyn Fn(Vec<String>) -> BoxFuture<'static, ()> + Send + Sync>;

/// One backend under test, with its operator and whatever must live as long as the test.
struct Harness {
    backend: Arc<dyn Backend>,
    operator: Box<dyn Operator>,
    /// The sequencer's index is a LockIndex that rises with every acquisition (Consul, memory),
    /// not a slot number (AMQP).
    index_rises: bool,
    keys: std::sync::Mutex<Vec<String>>,
    cleanup: Option<Cleanup>,
    _keep_alive: Box<dyn std::any::Any + Send>,
}

impl Harness {
    fn new(
        backend: Arc<dyn Backend>,
        operator: Box<dyn Operator>,
        keep_alive: Box<dyn std::any::Any + Send>,
    ) -> Self {
        Harness {
            backend,
            operator,
            index_rises: true,
            keys: std::sync::Mutex::default(),
            cleanup: None,
            _keep_alive: keep_alive,
        }
    }

    /// A key no other scenario (or earlier run against the same server) uses.
    fn key(&self, scenario: &str) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let key = format!(
            "conformance/{scenario}/{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        self.keys.lock().unwrap().push(key.clone());
        key
    }

    /// Runs the backend's clean-up for every key the scenario used.
    async fn finish(self) {
        let keys = std::mem::take(&mut *self.keys.lock().unwrap());
        if let Some(cleanup) = &self.cleanup {
            cleanup(keys).await;
        }
    }
}

/// A spec with short session settings, so a lease that leaks shows up within one test.
fn leader(key: &str) -> LeaseSpec {
    LeaseSpec::leader(key)
        .ttl(Duration::from_secs(15))
        .lock_delay(Duration::from_secs(15))
}

fn semaphore(prefix: &str, limit: u32) -> LeaseSpec {
    LeaseSpec::semaphore(prefix, limit)
        .ttl(Duration::from_secs(15))
        .lock_delay(Duration::from_secs(15))
}

#[allow(clippy::unwrap_used)]
mod scenarios {
    use super::*;

    pub(crate) async fn contention_then_handover_on_release(h: &Harness) {
        let key = h.key("contention");
        let a = h.backend.acquire(&leader(&key)).await.unwrap();
        let busy = h.backend.acquire(&leader(&key).wait(Wait::Never)).await;
        assert!(busy.unwrap_err().is_busy());

        let backend = Arc::clone(&h.backend);
        let spec = leader(&key);
        let mut waiting = tokio::spawn(async move { backend.acquire(&spec).await });
        assert!(
            tokio::time::timeout(Duration::from_millis(300), &mut waiting)
                .await
                .is_err(),
            "a second holder was admitted while the first held the lease"
        );
        let first = a.sequencer().clone();
        a.release().await.unwrap();
        let b = within(EVENT, "the waiter to acquire after release", waiting)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(b.sequencer().key(), key);
        if h.index_rises {
            assert!(b.sequencer().index() > first.index());
        }
        assert_ne!(b.sequencer().holder(), first.holder());
        b.release().await.unwrap();
    }

    pub(crate) async fn loss_on_session_destroy_cancels_work(h: &Harness) {
        let key = h.key("destroy");
        let lease = h.backend.acquire(&leader(&key)).await.unwrap();
        lease.check().await.unwrap();
        let holder = lease.sequencer().holder().to_owned();
        let (work, ()) = within(EVENT, "the work to be cancelled after destroy", async {
            tokio::join!(
                lease.run(std::future::pending::<()>()),
                h.operator.destroy_session(&holder)
            )
        })
        .await;
        assert_refined(&lease, &work.unwrap_err(), LostReason::SessionInvalidated).await;
        assert!(!lease.is_held());
        assert!(matches!(
            lease.check().await,
            Err(Error::Lost(LostReason::SessionInvalidated))
        ));
        // Releasing a lost lease reports the loss.
        release_lost(lease).await;
    }

    pub(crate) async fn loss_on_key_delete(h: &Harness) {
        let key = h.key("delete");
        let lease = h.backend.acquire(&leader(&key)).await.unwrap();
        h.operator.delete_key(&key).await;
        let reason = within(EVENT, "loss after the key was deleted", lease.lost()).await;
        assert_eq!(reason, LostReason::KeyDeleted);
    }

    pub(crate) async fn sequencer_changes_on_every_acquisition(h: &Harness) {
        let key = h.key("sequencer");
        let mut seen = Vec::new();
        for _ in 0..3 {
            let lease = h.backend.acquire(&leader(&key)).await.unwrap();
            seen.push(lease.sequencer().clone());
            lease.release().await.unwrap();
        }
        for pair in seen.windows(2) {
            if h.index_rises {
                assert!(pair[1].index() > pair[0].index(), "{seen:?}");
            }
            assert_ne!(pair[1], pair[0]);
        }
        for seq in &seen {
            assert_eq!(
                seq.to_string().parse::<lease_core::Sequencer>().unwrap(),
                *seq
            );
        }
    }

    pub(crate) async fn drop_releases_without_lock_delay(h: &Harness) {
        let key = h.key("drop");
        let a = h.backend.acquire(&leader(&key)).await.unwrap();
        let watcher = a.watcher();
        drop(a);
        assert_eq!(
            within(EVENT, "the dropped lease to report release", watcher.lost()).await,
            LostReason::Released
        );
        // Lock-delay and TTL are 15 s: acquiring well within that proves a release, not expiry.
        let b = within(
            Duration::from_secs(5),
            "acquire after the holder dropped its lease",
            h.backend.acquire(&leader(&key)),
        )
        .await
        .unwrap();
        b.release().await.unwrap();
    }

    pub(crate) async fn wait_up_to_gives_up_with_busy(h: &Harness) {
        let key = h.key("wait-up-to");
        let a = h.backend.acquire(&leader(&key)).await.unwrap();
        let wait = Duration::from_millis(300);
        let err = within(
            EVENT,
            "a bounded acquire to give up",
            h.backend.acquire(&leader(&key).wait(Wait::UpTo(wait))),
        )
        .await
        .unwrap_err();
        match err {
            Error::Busy { key: busy, waited } => {
                assert_eq!(busy, key);
                assert!(waited >= wait, "gave up after {waited:?}, asked {wait:?}");
            }
            other => panic!("expected Busy, got {other}"),
        }
        assert!(a.is_held());
        a.release().await.unwrap();
    }

    pub(crate) async fn never_waiting_answers_at_once(h: &Harness) {
        let key = h.key("never");
        let a = h.backend.acquire(&leader(&key)).await.unwrap();
        let err = within(
            EVENT,
            "a non-waiting acquire to answer",
            h.backend.acquire(&leader(&key).wait(Wait::Never)),
        )
        .await
        .unwrap_err();
        assert!(err.is_busy(), "{err}");
        a.release().await.unwrap();
        let b = h
            .backend
            .acquire(&leader(&key).wait(Wait::Never))
            .await
            .unwrap();
        b.release().await.unwrap();
    }

    pub(crate) async fn lock_delay_holds_off_the_next_holder(h: &Harness) {
        let key = h.key("lock-delay");
        let spec = leader(&key).lock_delay(Duration::from_secs(2));
        let a = h.backend.acquire(&spec).await.unwrap();
        h.operator.destroy_session(a.sequencer().holder()).await;
        within(EVENT, "loss after destroy", a.lost()).await;
        let early = h
            .backend
            .acquire(&spec.clone().wait(Wait::UpTo(Duration::from_millis(500))))
            .await;
        assert!(early.unwrap_err().is_busy(), "lock-delay was not honoured");
        let b = within(EVENT, "acquire after lock-delay", h.backend.acquire(&spec))
            .await
            .unwrap();
        b.release().await.unwrap();
    }

    pub(crate) async fn zero_lock_delay_means_zero(h: &Harness) {
        let key = h.key("no-lock-delay");
        let spec = leader(&key).lock_delay(Duration::ZERO);
        let a = h.backend.acquire(&spec).await.unwrap();
        h.operator.destroy_session(a.sequencer().holder()).await;
        let b = within(
            EVENT,
            "acquire right after destroy",
            h.backend
                .acquire(&spec.clone().wait(Wait::UpTo(Duration::from_secs(1)))),
        )
        .await
        .unwrap();
        assert!(b.sequencer().index() > a.sequencer().index());
        b.release().await.unwrap();
    }

    pub(crate) async fn semaphore_admits_up_to_its_limit(h: &Harness) {
        let prefix = h.key("semaphore");
        let a = h.backend.acquire(&semaphore(&prefix, 2)).await.unwrap();
        let b = h.backend.acquire(&semaphore(&prefix, 2)).await.unwrap();
        assert_eq!(
            a.sequencer().key(),
            format!("{prefix}/{}", a.sequencer().holder())
        );
        let busy = h
            .backend
            .acquire(&semaphore(&prefix, 2).wait(Wait::Never))
            .await;
        assert!(busy.unwrap_err().is_busy());
        let mismatch = h
            .backend
            .acquire(&semaphore(&prefix, 3).wait(Wait::Never))
            .await;
        assert!(
            matches!(mismatch, Err(Error::LimitMismatch { .. })),
            "{mismatch:?}"
        );

        let backend = Arc::clone(&h.backend);
        let spec = semaphore(&prefix, 2);
        let waiting = tokio::spawn(async move { backend.acquire(&spec).await });
        drop(a);
        let c = within(EVENT, "a slot after a holder dropped out", waiting)
            .await
            .unwrap()
            .unwrap();
        b.release().await.unwrap();
        c.release().await.unwrap();
    }

    pub(crate) async fn semaphore_holder_loses_on_session_destroy(h: &Harness) {
        let prefix = h.key("semaphore-destroy");
        let spec = semaphore(&prefix, 1).lock_delay(Duration::ZERO);
        let a = h.backend.acquire(&spec).await.unwrap();
        h.operator.destroy_session(a.sequencer().holder()).await;
        let reported = within(EVENT, "semaphore loss after destroy", a.lost()).await;
        assert_refined(&a, &reported, LostReason::SessionInvalidated).await;
        // The dead holder is pruned by the next contender.
        let b = within(EVENT, "the freed slot", h.backend.acquire(&spec))
            .await
            .unwrap();
        b.check().await.unwrap();
        b.release().await.unwrap();
    }

    pub(crate) async fn semaphore_dead_holder_keeps_its_slot_for_the_lock_delay(h: &Harness) {
        let prefix = h.key("semaphore-lock-delay");
        let spec = semaphore(&prefix, 1).lock_delay(Duration::from_secs(2));
        let a = h.backend.acquire(&spec).await.unwrap();
        h.operator.destroy_session(a.sequencer().holder()).await;
        within(EVENT, "semaphore loss after destroy", a.lost()).await;
        // The dead holder may still be finishing its work: its slot is not handed on yet.
        let early = h
            .backend
            .acquire(&spec.clone().wait(Wait::UpTo(Duration::from_millis(500))))
            .await;
        assert!(
            early.unwrap_err().is_busy(),
            "a dead holder's slot was handed on inside its lock-delay"
        );
        let b = within(
            EVENT,
            "the slot after the lock-delay",
            h.backend.acquire(&spec),
        )
        .await
        .unwrap();
        b.check().await.unwrap();
        b.release().await.unwrap();
    }
}

/// `conformance!(name, harness_future; scenario, ...)`: a test module running each scenario on a
/// fresh harness.
macro_rules! conformance {
    ($backend:ident, $harness:expr; $($scenario:ident),* $(,)?) => {
        mod $backend {
            use super::*;
            $(
                #[tokio::test]
                async fn $scenario() {
                    lease_tests::init_tracing();
                    let harness = $harness.await;
                    scenarios::$scenario(&harness).await;
                    harness.finish().await;
                }
            )*
        }
    };
}

mod memory_harness {
    use super::*;
    use lease_core::memory::Memory;

    struct MemoryOperator(Memory);

    impl Operator for MemoryOperator {
        fn destroy_session<'a>(&'a self, holder: &'a str) -> BoxFuture<'a, ()> {
            Box::pin(async move {
                assert!(self.0.invalidate_session(holder), "no session {holder}");
            })
        }

        fn delete_key<'a>(&'a self, key: &'a str) -> BoxFuture<'a, ()> {
            Box::pin(async move {
                assert!(self.0.delete_key(key), "no key {key}");
            })
        }
    }

    pub(crate) async fn harness() -> Harness {
        let memory = Memory::new();
        Harness::new(
            Arc::new(memory.clone()),
            Box::new(MemoryOperator(memory)),
            Box::new(()),
        )
    }
}

mod consul_harness {
    use super::*;
    use lease_tests::consul::Agent;

    struct ConsulOperator(Arc<Agent>);

    impl Operator for ConsulOperator {
        fn destroy_session<'a>(&'a self, holder: &'a str) -> BoxFuture<'a, ()> {
            Box::pin(self.0.destroy_session(holder))
        }

        fn delete_key<'a>(&'a self, key: &'a str) -> BoxFuture<'a, ()> {
            Box::pin(self.0.delete_key(key))
        }
    }

    pub(crate) async fn harness() -> Harness {
        let agent = Arc::new(Agent::start().await);
        Harness::new(
            Arc::new(agent.backend()),
            Box::new(ConsulOperator(Arc::clone(&agent))),
            Box::new(agent),
        )
    }
}

mod amqp_harness {
    use super::*;
    use lease_tests::amqp::{backend, require_broker};

    /// RabbitMQ has no sessions or keys to act on; the scenarios that need them are not run here
    /// (tests/amqp.rs covers loss on AMQP: connection closed, slot removed).
    struct NoOperator;

    impl Operator for NoOperator {
        fn destroy_session<'a>(&'a self, _holder: &'a str) -> BoxFuture<'a, ()> {
            Box::pin(async { panic!("no sessions on AMQP: this scenario does not apply") })
        }

        fn delete_key<'a>(&'a self, _key: &'a str) -> BoxFuture<'a, ()> {
            Box::pin(async { panic!("no keys on AMQP: this scenario does not apply") })
        }
    }

    pub(crate) async fn harness() -> Harness {
        require_broker().await;
        let (amqp, _) = backend();
        let mut harness = Harness::new(Arc::new(amqp.clone()), Box::new(NoOperator), Box::new(()));
        harness.index_rises = false;
        harness.cleanup = Some(Box::new(move |keys| {
            let admin = amqp.admin();
            Box::pin(async move {
                for key in keys {
                    admin.destroy(&key).await.unwrap();
                }
            })
        }));
        harness
    }
}

conformance!(amqp, amqp_harness::harness();
    contention_then_handover_on_release,
    sequencer_changes_on_every_acquisition,
    drop_releases_without_lock_delay,
    wait_up_to_gives_up_with_busy,
    never_waiting_answers_at_once,
);

conformance!(memory, memory_harness::harness();
    contention_then_handover_on_release,
    loss_on_session_destroy_cancels_work,
    loss_on_key_delete,
    sequencer_changes_on_every_acquisition,
    drop_releases_without_lock_delay,
    wait_up_to_gives_up_with_busy,
    never_waiting_answers_at_once,
    lock_delay_holds_off_the_next_holder,
    zero_lock_delay_means_zero,
    semaphore_admits_up_to_its_limit,
    semaphore_holder_loses_on_session_destroy,
    semaphore_dead_holder_keeps_its_slot_for_the_lock_delay,
);

conformance!(consul, consul_harness::harness();
    contention_then_handover_on_release,
    loss_on_session_destroy_cancels_work,
    loss_on_key_delete,
    sequencer_changes_on_every_acquisition,
    drop_releases_without_lock_delay,
    wait_up_to_gives_up_with_busy,
    never_waiting_answers_at_once,
    lock_delay_holds_off_the_next_holder,
    zero_lock_delay_means_zero,
    semaphore_admits_up_to_its_limit,
    semaphore_holder_loses_on_session_destroy,
    semaphore_dead_holder_keeps_its_slot_for_the_lock_delay,
);
