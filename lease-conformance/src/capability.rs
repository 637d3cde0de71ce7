//! [`Capability`]: what a backend (or its operator) may lack, which a harness declares.

use std::fmt;

/// What a backend (or its operator) may lack. A scenario that needs a capability the harness
/// declares lacking does not run; the suite checks the backend's refusal instead, where the
/// contract defines one, and the scenario answers [`Outcome::NotApplicable`](crate::Outcome::NotApplicable).
///
/// Some capabilities only sharpen assertions ([`RisingIndex`](Capability::RisingIndex),
/// [`ContenderKeys`](Capability::ContenderKeys), [`LimitAgreement`](Capability::LimitAgreement),
/// [`LockKinds`](Capability::LockKinds)): without them the scenarios still run, and skip or
/// loosen the assertions that need them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Capability {
    /// `LeaseSpec::semaphore`. A backend without semaphores refuses them with
    /// `Error::Unsupported` (checked).
    Semaphores,
    /// `Backend::observe_leader`. A backend without it answers `Error::Unsupported` (checked).
    ObserveLeader,
    /// Lock-delay: after a holder's session is invalidated, its key stays barred for the spec's
    /// lock-delay. Nothing outside the backend can check its absence.
    LockDelay,
    /// The sequencer's index rises with every acquisition of a key (a LockIndex), rather than
    /// naming a slot.
    RisingIndex,
    /// A semaphore holder's sequencer names its own key, `<prefix>/<holder>` (the layout of
    /// `consul lock -n`).
    ContenderKeys,
    /// Contenders agree on a semaphore's limit: one that asks for another gets
    /// `Error::LimitMismatch` (rather than the limit being set by an administrator).
    LimitAgreement,
    /// The backend tells a leader lock from a one-slot semaphore on the same name, so a semaphore
    /// asked for where a leader lock is gets `Error::FlagsConflict`. Without it (RabbitMQ, where
    /// a leader lock is a one-slot semaphore) that semaphore may get `Error::LimitMismatch`
    /// instead, still at once and for good; a leader lock on a semaphore of more slots is
    /// `FlagsConflict` either way.
    LockKinds,
    /// [`Operator::destroy_session`](crate::Operator::destroy_session). An operator without it answers `Unsupported` (checked).
    DestroySession,
    /// [`Operator::delete_key`](crate::Operator::delete_key). An operator without it answers `Unsupported` (checked).
    DeleteKey,
    /// [`Operator::release_key`](crate::Operator::release_key). An operator without it answers `Unsupported` (checked).
    ReleaseKey,
    /// A lease given back at a set time ([`Lease::release_at`](lease_core::Lease::release_at),
    /// what a guarded call's `min_hold` uses) stays held on the server until then even if its
    /// holder shuts down first ([`Hold::keep_until`](lease_core::backend::Hold::keep_until)
    /// answers `true`). Without it (memory, RabbitMQ) a shutdown gives the lease back at once.
    KeepsPastHolder,
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Capability::Semaphores => "semaphores",
            Capability::ObserveLeader => "observing a leader",
            Capability::LockDelay => "lock-delay",
            Capability::RisingIndex => "a rising sequencer index",
            Capability::ContenderKeys => "semaphore contender keys",
            Capability::LimitAgreement => "limits agreed by contenders",
            Capability::LockKinds => "telling a leader lock from a one-slot semaphore",
            Capability::DestroySession => "destroying a session",
            Capability::DeleteKey => "deleting a key",
            Capability::ReleaseKey => "releasing a key",
            Capability::KeepsPastHolder => "keeping a lease past its holder until its release time",
        })
    }
}
