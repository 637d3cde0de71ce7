//! The list of scenarios, and what running one answers.

use std::fmt;

use lease_core::BoxFuture;

use crate::{Harness, Outcome, scenarios};

/// One scenario of the suite, by name.
#[derive(Clone, Copy)]
pub struct Scenario {
    name: &'static str,
    body: for<'a> fn(&'a Harness) -> BoxFuture<'a, Outcome>,
}

impl fmt::Debug for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Scenario").field(&self.name).finish()
    }
}

impl Scenario {
    /// The scenario's name: its function in [`scenarios`], and the test
    /// [`suite!`](crate::suite) generates for it.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The scenario called `name`.
    pub fn named(name: &str) -> Option<&'static Scenario> {
        SCENARIOS.iter().find(|scenario| scenario.name == name)
    }

    /// Runs the scenario against `harness`.
    ///
    /// # Panics
    ///
    /// When the backend breaks the scenario: an assertion fails, or an awaited event does not
    /// happen within ten seconds.
    pub async fn run(&self, harness: &Harness) -> Outcome {
        (self.body)(harness).await
    }
}

/// The scenario names, in order: the one list that [`suite!`](crate::suite) and
/// [`SCENARIOS`] are both made from. Calls `$crate::$callback!` with the given arguments, a `;`,
/// and the names.
#[doc(hidden)]
#[macro_export]
macro_rules! __for_each_scenario {
    ($callback:ident! { $($args:tt)* }) => {
        $crate::$callback! {
            $($args)*;
            contention_then_handover_on_release,
            loss_on_session_destroy_cancels_work,
            loss_on_key_delete,
            loss_on_key_release,
            revoke_cancels_work,
            sequencer_changes_on_every_acquisition,
            check_sequencer_refuses_a_released_acquisition,
            drop_releases_without_lock_delay,
            wait_up_to_gives_up_with_busy,
            never_waiting_answers_at_once,
            lock_delay_holds_off_the_next_holder,
            zero_lock_delay_means_zero,
            observers_follow_the_leader,
            semaphore_admits_up_to_its_limit,
            another_kind_of_lock_is_refused_at_once,
            semaphore_holder_loses_on_session_destroy,
            semaphore_dead_holder_keeps_its_slot_for_the_lock_delay,
            shutdown_releases_every_lease,
            release_at_outlives_the_holders_shutdown,
        }
    };
}

/// Builds [`SCENARIOS`] from the list of names.
macro_rules! __scenario_table {
    (; $($name:ident),* $(,)?) => {
        &[$(
            Scenario {
                name: stringify!($name),
                body: {
                    fn body(harness: &Harness) -> BoxFuture<'_, Outcome> {
                        Box::pin(scenarios::$name(harness))
                    }
                    body
                },
            }
        ),*]
    };
}
pub(crate) use __scenario_table;

/// Every scenario, in the order [`suite!`](crate::suite) generates their tests; each is
/// documented in [`scenarios`].
pub static SCENARIOS: &[Scenario] = __for_each_scenario!(__scenario_table! {});
