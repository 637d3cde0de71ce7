//! The semaphore of Consul's semaphore guide as Consul and the in-process store both keep it, and the one place
//! that decides who holds a slot.
//!
//! A semaphore under `<prefix>` is a contender key `<prefix>/<session>` per holder, held by the
//! holder's session, and the coordinating key `<prefix>/.lock` recording the limit and the holder
//! set. [`LockValue`] is that record and [`Snapshot`] one consistent look at a prefix; a
//! [`Planner`] turns a snapshot and the [`Queue`] of takes and give-backs into the writes of one
//! round ([`Plan`]).
//!
//! Neither does I/O. The Consul coordinator (in `lease-consul`) reads the prefix, plans and
//! writes the plan as one transaction; the memory store (`memory`) plans and applies the plan
//! under its lock. Both backends thus admit, prune and refuse by the same code.

mod plan;
mod queue;
mod value;

pub use self::plan::{Admit, LockWrite, Next, Plan, Planner, Taken, Write};
pub use self::queue::{Give, Queue, Take};
pub use self::value::{
    LockValue, SEMAPHORE_FLAGS, Snapshot, Unreadable, contender_key, lock_key, prefix_of,
};
