//! The conformance suite for lease backends: the scenarios every [`Backend`] is held to, and the
//! [`Operator`] that injects the faults they need.
//!
//! A backend passes when every scenario either passes or is not applicable because the backend
//! declares it lacks something the scenario needs. The in-tree backends (memory, Consul,
//! etcd, RabbitMQ) run it in `tests/tests/conformance.rs`; a backend written elsewhere runs it from its
//! own tests with the same call (`examples/file_lock` in this workspace does, built only on
//! `lease_core::backend`).
//!
//! # Running it against your backend
//!
//! Add the crate as a dev-dependency, then, in `tests/conformance.rs`:
//!
//! 1. implement [`Operator`] for what an administrator of your backend can do (destroy a session,
//!    delete a key, release a key); [`Operator::revoke`], taking a lease away, is the one action
//!    every operator offers;
//! 2. write a function that builds a fresh [`Harness`] (called once per scenario): your backend,
//!    its operator, every [`Capability`] it [`lacks`](Harness::lacks), and, if your backend keeps
//!    state between runs, a [`clean_up_with`](Harness::clean_up_with);
//! 3. call [`suite!`] with a module name and that function. It generates one `#[test]` per
//!    scenario, named after it, each on its own tokio runtime (your crate needs no tokio macros).
//!
//! ```
//! use lease_conformance::{Capability, Harness, Operator, OperatorError};
//! use lease_core::BoxFuture;
//! use lease_core::memory::Memory;
//!
//! /// Stand-in for your backend's administration: here the in-process store's own operator,
//! /// cut down to deleting keys.
//! struct KeysOnly(Memory);
//!
//! impl Operator for KeysOnly {
//!     fn delete_key<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), OperatorError>> {
//!         Operator::delete_key(&self.0, key)
//!     }
//!
//!     fn revoke<'a>(
//!         &'a self,
//!         lease: &'a lease_core::Sequencer,
//!     ) -> BoxFuture<'a, Result<(), OperatorError>> {
//!         Operator::delete_key(&self.0, lease.key())
//!     }
//! }
//!
//! async fn harness() -> Harness {
//!     let backend = Memory::new(); // your backend, connected to a fresh server or directory
//!     Harness::new(backend.clone(), KeysOnly(backend))
//!         // The scenarios that destroy sessions or release keys do not run; the suite checks
//!         // that this operator refuses both with `OperatorError::Unsupported` instead.
//!         .lacks(Capability::DestroySession)
//!         .lacks(Capability::ReleaseKey)
//! }
//!
//! lease_conformance::suite!(my_backend, harness);
//! # fn main() {}
//! ```
//!
//! `cargo test --test conformance` then lists `my_backend::loss_on_key_delete`,
//! `my_backend::semaphore_admits_up_to_its_limit`, … one test per scenario.
//!
//! # Capabilities
//!
//! A backend need not do everything Consul does. What it lacks, the harness declares with
//! [`Harness::lacks`], and the declaration is checked, not taken on trust: a scenario that needs
//! a lacking [`Capability`] does not run, and instead asserts that the backend or operator
//! refuses it (`Error::Unsupported` from `acquire` of a semaphore or from `observe_leader`,
//! `OperatorError::Unsupported` from the operator), then answers [`Outcome::NotApplicable`].
//! [`Capability::RisingIndex`], [`Capability::ContenderKeys`], [`Capability::LimitAgreement`]
//! and [`Capability::LockKinds`] only sharpen assertions.
//!
//! # The scenarios
//!
//! Each is an `async fn` in [`scenarios`], documented there in one line. [`SCENARIOS`] lists
//! them, for a driver of your own:
//!
//! ```no_run
//! # async fn f(harness: lease_conformance::Harness) {
//! for scenario in lease_conformance::SCENARIOS {
//!     let outcome = scenario.run(&harness).await; // panics when the backend breaks it
//!     println!("{}: {outcome:?}", scenario.name());
//! }
//! # }
//! ```
//!
//! # The operator outside tests
//!
//! [`Operator`] is also how the demo (`cargo run -p lease-demo`) kills its leader, on every
//! backend: it is implemented here for `lease_core::memory::Memory` (feature `memory`, on by
//! default), `lease_consul::Consul` (feature `consul`), `lease_etcd::Etcd` (feature `etcd`),
//! `lease_amqp::Amqp` (feature `amqp`), `lease_postgres::Postgres` (feature `postgres`) and
//! `lease_redis::Redis` (feature `redis`).
//!
//! [`Backend`]: lease_core::Backend
#![cfg_attr(docsrs, feature(doc_cfg))] // On docs.rs, each feature-gated item names its feature.

mod capability;
mod harness;
mod operator;
mod outcome;
mod scenario;
pub mod scenarios;
pub mod support;

pub use capability::Capability;
pub use harness::Harness;
pub use operator::{Operator, OperatorError};
pub use outcome::Outcome;
pub use scenario::{SCENARIOS, Scenario};
// Where `__for_each_scenario!` calls it back, as `$crate::__scenario_table!`.
use scenario::__scenario_table;

/// Generates a test module `$module` with one `#[test]` per scenario, named after it, each
/// running the scenario against the [`Harness`] that `$harness` builds.
///
/// `$harness` is a function or closure taking nothing and returning a future of a [`Harness`]
/// (an `async fn` name, or `|| async { … }`); it is called afresh for every scenario, inside
/// the scenario's tokio runtime (current-thread, time and I/O enabled). The module imports its
/// parent's items, so `$harness` may name a private function beside the call.
///
/// A scenario that is [not applicable](Outcome::NotApplicable) passes after checking the
/// backend's refusal, and says so on stderr (`--nocapture` shows it).
///
/// See the [crate documentation](crate) for an example.
#[macro_export]
macro_rules! suite {
    ($module:ident, $harness:expr $(,)?) => {
        $crate::__for_each_scenario!(__suite_module! { $module, $harness });
    };
}

/// The module [`suite!`] generates, given the scenario names.
#[doc(hidden)]
#[macro_export]
macro_rules! __suite_module {
    ($module:ident, $harness:expr; $($scenario:ident),* $(,)?) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[test]
                fn $scenario() {
                    $crate::__private::run_test(::core::stringify!($scenario), $harness);
                }
            )*
        }
    };
}

#[doc(hidden)]
pub mod __private {
    use std::future::Future;

    use crate::{Harness, Outcome, Scenario};

    /// The body of a test [`suite!`] generates.
    pub fn run_test<F, Fut>(name: &str, make_harness: F)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Harness>,
    {
        let scenario = Scenario::named(name)
            .unwrap_or_else(|| panic!("lease-conformance has no scenario {name:?}"));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|error| panic!("cannot start a tokio runtime for {name}: {error}"));
        runtime.block_on(async {
            let harness = make_harness().await;
            let outcome = scenario.run(&harness).await;
            harness.finish().await;
            if let Outcome::NotApplicable(lacking) = outcome {
                let lacking: Vec<String> = lacking.iter().map(ToString::to_string).collect();
                eprintln!(
                    "{name}: not applicable, the harness declares that the backend lacks {} \
                     (the refusals the contract defines were checked)",
                    lacking.join(", ")
                );
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use lease_core::{Backend, BoxFuture, Error, Lease, LeaseSpec};

    use super::*;

    /// A backend that offers nothing, and an operator that can do nothing.
    #[derive(Debug)]
    struct Nothing;

    impl Backend for Nothing {
        fn acquire<'a>(&'a self, _: &'a LeaseSpec) -> BoxFuture<'a, Result<Lease, Error>> {
            Box::pin(async {
                Err(Error::Unsupported {
                    backend: "nothing",
                    operation: "acquiring",
                })
            })
        }
    }

    impl Operator for Nothing {}

    fn lacking_everything() -> Harness {
        [
            Capability::Semaphores,
            Capability::ObserveLeader,
            Capability::LockDelay,
            Capability::DestroySession,
            Capability::DeleteKey,
            Capability::ReleaseKey,
        ]
        .into_iter()
        .fold(Harness::new(Nothing, Nothing), Harness::lacks)
    }

    #[tokio::test]
    async fn a_declared_lack_is_checked_not_run() {
        let harness = lacking_everything();
        for needs in [
            &[Capability::Semaphores, Capability::LockDelay][..],
            &[Capability::ObserveLeader],
            &[Capability::DestroySession, Capability::DeleteKey],
            &[Capability::ReleaseKey],
        ] {
            assert_eq!(
                harness.not_applicable(needs).await,
                Some(Outcome::NotApplicable(needs.to_vec()))
            );
        }
        assert_eq!(
            scenarios::observers_follow_the_leader(&harness).await,
            Outcome::NotApplicable(vec![Capability::ObserveLeader])
        );
        assert_eq!(
            harness.not_applicable(&[Capability::RisingIndex]).await,
            None
        );
    }

    #[cfg(feature = "memory")]
    #[tokio::test]
    #[should_panic(expected = "declares that the backend lacks observing a leader")]
    async fn a_false_declaration_fails() {
        let memory = lease_core::memory::Memory::new();
        let harness = Harness::new(memory.clone(), memory).lacks(Capability::ObserveLeader);
        harness.not_applicable(&[Capability::ObserveLeader]).await;
    }

    #[cfg(feature = "memory")]
    #[tokio::test]
    #[should_panic(expected = "declares that the backend lacks destroying a session")]
    async fn a_false_declaration_of_an_operator_fails() {
        let memory = lease_core::memory::Memory::new();
        let harness = Harness::new(memory.clone(), memory).lacks(Capability::DestroySession);
        harness.not_applicable(&[Capability::DestroySession]).await;
    }

    #[test]
    fn scenarios_are_listed_once_each() {
        let mut names: Vec<&str> = SCENARIOS.iter().map(Scenario::name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), SCENARIOS.len());
        assert!(Scenario::named("loss_on_key_delete").is_some());
    }
}

/// The examples of this crate's README (what crates.io shows), compiled as doctests so that the
/// front page cannot drift from the API; `tests/tests/readmes.rs` of the workspace checks the
/// features, commands and links it names.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
