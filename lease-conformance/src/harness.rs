//! One backend under test: the backend, its operator, and what it declares it lacks.
//!
//! A [`Harness`] is built fresh for every scenario by the function given to
//! [`suite!`](crate::suite). It hands each scenario keys nobody else uses, and clean-up runs
//! over those keys when the scenario is done (for servers that keep what a test created).

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use lease_core::{Backend, BoxFuture, Error, LeaseSpec, Wait};

use crate::{Capability, Operator, OperatorError, Outcome};

/// Removes what a scenario created on a server that keeps it, given the scenario's keys.
type CleanUp = Box<dyn FnOnce(Vec<String>) -> BoxFuture<'static, ()> + Send + Sync>;

/// One backend under test, as the scenarios see it.
///
/// # Examples
///
/// ```
/// use lease_conformance::{Capability, Harness};
/// use lease_core::memory::Memory;
///
/// let memory = Memory::new();
/// // The store is its own operator; a backend that cannot observe leaders would say so:
/// let harness = Harness::new(memory.clone(), memory).lacks(Capability::ObserveLeader);
/// assert!(!harness.has(Capability::ObserveLeader));
/// assert!(harness.has(Capability::Semaphores));
/// ```
pub struct Harness {
    backend: Arc<dyn Backend>,
    operator: Box<dyn Operator>,
    lacks: Vec<Capability>,
    keys: Mutex<Vec<String>>,
    clean_up: Option<CleanUp>,
}

impl fmt::Debug for Harness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Harness")
            .field("backend", &self.backend)
            .field("lacks", &self.lacks)
            .finish_non_exhaustive()
    }
}

impl Harness {
    /// A harness for `backend`, faulted by `operator`, claiming every [`Capability`] until
    /// told otherwise with [`lacks`](Harness::lacks).
    pub fn new(backend: impl Backend, operator: impl Operator) -> Harness {
        Harness {
            backend: Arc::new(backend),
            operator: Box::new(operator),
            lacks: Vec::new(),
            keys: Mutex::default(),
            clean_up: None,
        }
    }

    /// Declares that the backend (or its operator) lacks `capability`.
    #[must_use]
    pub fn lacks(mut self, capability: Capability) -> Harness {
        if !self.lacks.contains(&capability) {
            self.lacks.push(capability);
        }
        self
    }

    /// Runs `clean_up` with every key the scenario used once it is done, for a server that keeps
    /// what a test created (RabbitMQ's durable slot queues, lock files).
    #[must_use]
    pub fn clean_up_with<F, Fut>(mut self, clean_up: F) -> Harness
    where
        F: FnOnce(Vec<String>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.clean_up = Some(Box::new(move |keys| Box::pin(clean_up(keys))));
        self
    }

    /// The backend under test.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Its operator.
    pub fn operator(&self) -> &dyn Operator {
        &*self.operator
    }

    /// Whether the harness claims `capability` (it was not declared lacking).
    pub fn has(&self, capability: Capability) -> bool {
        !self.lacks.contains(&capability)
    }

    /// The capabilities declared lacking, in the order they were declared.
    pub fn lacking(&self) -> &[Capability] {
        &self.lacks
    }

    /// A key (or semaphore prefix) no other scenario or test process uses:
    /// `conformance/<scenario>/<pid>-<n>`. Handed to [`clean_up_with`](Harness::clean_up_with)'s
    /// function at the end.
    pub fn key(&self, scenario: &str) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let key = format!(
            "conformance/{scenario}/{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        self.keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(key.clone());
        key
    }

    /// `None` when the harness has every capability in `needs`. Otherwise checks that the
    /// backend and its operator refuse each lacking one with `Unsupported` (where the contract
    /// defines a refusal; see [`Capability`]) and answers [`Outcome::NotApplicable`]: a scenario
    /// starts with it and returns that outcome instead of running.
    ///
    /// # Panics
    ///
    /// When the backend or operator does what the harness declares it lacks.
    pub async fn not_applicable(&self, needs: &[Capability]) -> Option<Outcome> {
        let lacking: Vec<Capability> = needs
            .iter()
            .copied()
            .filter(|capability| !self.has(*capability))
            .collect();
        if lacking.is_empty() {
            return None;
        }
        for capability in &lacking {
            if let Some(answer) = self.unexpected_answer(*capability).await {
                panic!(
                    "the harness declares that the backend lacks {capability}, but asking for it \
                     answered {answer}; a backend or operator without it answers Unsupported, \
                     or the harness should not declare it lacking"
                );
            }
        }
        Some(Outcome::NotApplicable(lacking))
    }

    /// What asking for `capability` answered, unless it was refused with `Unsupported`.
    async fn unexpected_answer(&self, capability: Capability) -> Option<String> {
        /// A session and key name no scenario uses.
        const NO_SUCH: &str = "conformance/no-such-name";
        fn operator(answer: Result<(), OperatorError>) -> Option<String> {
            match answer {
                Err(OperatorError::Unsupported { .. }) => None,
                other => Some(format!("{other:?}")),
            }
        }
        match capability {
            Capability::Semaphores => {
                let spec = LeaseSpec::semaphore(self.key("refused-semaphore"), 1).wait(Wait::Never);
                match self.backend.acquire(&spec).await {
                    Err(Error::Unsupported { .. }) => None,
                    other => Some(format!("{other:?}")),
                }
            }
            Capability::ObserveLeader => {
                match self
                    .backend
                    .observe_leader(&self.key("refused-observe"))
                    .await
                {
                    Err(Error::Unsupported { .. }) => None,
                    other => Some(format!("{other:?}")),
                }
            }
            Capability::DestroySession => operator(self.operator.destroy_session(NO_SUCH).await),
            Capability::DeleteKey => operator(self.operator.delete_key(NO_SUCH).await),
            Capability::ReleaseKey => operator(self.operator.release_key(NO_SUCH, NO_SUCH).await),
            // Lock-delay shows only once a session is invalidated, and the others only sharpen
            // assertions: there is nothing to refuse.
            Capability::LockDelay
            | Capability::RisingIndex
            | Capability::ContenderKeys
            | Capability::LimitAgreement
            | Capability::LockKinds
            | Capability::KeepsPastHolder => None,
        }
    }

    /// Runs the clean-up for every key handed out.
    pub async fn finish(self) {
        let keys = std::mem::take(&mut *self.keys.lock().unwrap_or_else(PoisonError::into_inner));
        if let Some(clean_up) = self.clean_up {
            clean_up(keys).await;
        }
    }
}
