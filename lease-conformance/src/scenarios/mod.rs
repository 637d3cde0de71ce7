//! The scenarios, one `async fn` each, documented in one line.
//!
//! Each takes a fresh [`Harness`](crate::Harness) and panics when the backend breaks the
//! contract. A scenario that needs a [`Capability`](crate::Capability) the harness declares
//! lacking does not run: it checks the refusal instead and returns
//! [`Outcome::NotApplicable`](crate::Outcome::NotApplicable) (see
//! [`Harness::not_applicable`](crate::Harness::not_applicable)). Leases use a 15 s TTL and
//! lock-delay unless a scenario says otherwise, so a lease that leaks, or a hand-over that waits
//! for expiry instead of a release, shows up within one test.
//!
//! [`suite!`](crate::suite) generates one test per scenario, in this order;
//! [`SCENARIOS`](crate::SCENARIOS) lists them for a driver of one's own.

// A scenario is a test: an unwrap that fails is a test that fails loudly.
#![allow(clippy::unwrap_used)]

mod common;
mod handover;
mod lock_delay;
mod loss;
mod semaphore;
mod shutdown;

pub use handover::{
    check_sequencer_refuses_a_released_acquisition, contention_then_handover_on_release,
    drop_releases_without_lock_delay, never_waiting_answers_at_once, observers_follow_the_leader,
    sequencer_changes_on_every_acquisition, wait_up_to_gives_up_with_busy,
};
pub use lock_delay::{lock_delay_holds_off_the_next_holder, zero_lock_delay_means_zero};
pub use loss::{
    loss_on_key_delete, loss_on_key_release, loss_on_session_destroy_cancels_work,
    revoke_cancels_work,
};
pub use semaphore::{
    another_kind_of_lock_is_refused_at_once, semaphore_admits_up_to_its_limit,
    semaphore_dead_holder_keeps_its_slot_for_the_lock_delay,
    semaphore_holder_loses_on_session_destroy,
};
pub use shutdown::{release_at_outlives_the_holders_shutdown, shutdown_releases_every_lease};
