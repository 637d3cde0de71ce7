//! The semaphore of Consul's semaphore guide as Consul and the in-process store both keep it, and the one place
//! that decides who holds a slot.
//!
//! A semaphore under `<prefix>` is a contender key `<prefix>/<session>` per holder, held by the
//! holder's session, and the coordinating key `<prefix>/.lock` recording the limit and the holder
//! set. [`value`] holds those shapes and one consistent look at a prefix (a [`Snapshot`]);
//! [`plan`] turns a snapshot and the queued takes and give-backs into the writes of one round.
//!
//! Neither does I/O. The Consul coordinator (`consul::semaphore`) reads the prefix, plans and
//! writes the plan as one transaction; the memory store (`memory`) plans and applies the plan
//! under its lock. Both backends thus admit, prune and refuse by the same code.

// Each backend uses part of the shared surface (the coordinator's queue handling, the memory
// store's planner bookkeeping); built with one of them, the other part has no caller.
#![cfg_attr(not(all(feature = "memory", feature = "consul")), allow(dead_code))]

mod plan;
mod queue;
mod value;

pub(crate) use self::plan::{Next, Planner, Taken, Write};
pub(crate) use self::queue::{Give, Queue, Take};
pub(crate) use self::value::{
    LockValue, SEMAPHORE_FLAGS, Snapshot, Unreadable, contender_key, lock_key, prefix_of,
};
