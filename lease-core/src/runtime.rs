//! Where the library's tasks run, and where its random numbers come from: the one place lease-core
//! and the backend crates start a task ([`spawn`]) or draw a random number
//! ([`random_below`](crate::backoff::random_below)).
//!
//! Normally [`spawn`] is `tokio::spawn`, and random draws are seeded by the process. A future run
//! under [`local`] instead keeps every task the library starts from it (and from those tasks) on
//! a [`LocalSet`] of the caller's, and draws its random numbers from a seed of the caller's. That
//! is what a deterministic simulation needs (lease-sim runs several processes in one thread):
//! each process's tasks live in its own `LocalSet`, so not polling the set freezes the process as
//! a `SIGSTOP` would, with its timers firing while it is stopped and its tasks running only when
//! it is resumed, and the same seed gives the same run.
//!
//! ```
//! use std::rc::Rc;
//! use tokio::task::LocalSet;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let process = Rc::new(LocalSet::new());
//! let draws = process
//!     .run_until(lease_core::runtime::local(&process, 7, async {
//!         // A task the library starts here runs on `process`, not on the runtime's scheduler.
//!         let task = lease_core::runtime::spawn(async { lease_core::backoff::random_below(1000) });
//!         let mine = lease_core::backoff::random_below(1000);
//!         (mine, task.await.expect("the task ran"))
//!     }))
//!     .await;
//! // The same seed, the same draws, in the task and in the spawned one.
//! let again = process
//!     .run_until(lease_core::runtime::local(&process, 7, async {
//!         let task = lease_core::runtime::spawn(async { lease_core::backoff::random_below(1000) });
//!         (lease_core::backoff::random_below(1000), task.await.expect("the task ran"))
//!     }))
//!     .await;
//! assert_eq!(draws, again);
//! # }
//! ```

use std::cell::Cell;
use std::future::Future;
use std::rc::{Rc, Weak};

use tokio::task::{JoinHandle, LocalSet};

tokio::task_local! {
    /// The set and the draws of the code running under [`local`].
    static LOCAL: Local;
}

/// Where a task under [`local`] spawns, and its own stream of random numbers.
struct Local {
    set: Weak<LocalSet>,
    draws: Cell<u64>,
}

impl Local {
    fn new(set: Weak<LocalSet>, seed: u64) -> Local {
        Local {
            set,
            draws: Cell::new(seed),
        }
    }

    /// The next number of this task's stream (splitmix64: every seed, even 0, gives a full-period
    /// stream of well-mixed numbers).
    fn next(&self) -> u64 {
        let state = self.draws.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
        self.draws.set(state);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Starts `future` as a task, as `tokio::spawn` does, and returns its handle: on the current
/// tokio runtime, or, under [`local`], on that call's `LocalSet` (with a stream of random numbers
/// of its own, drawn from its parent's).
///
/// # Panics
///
/// Outside a tokio runtime, as `tokio::spawn` does.
pub fn spawn<F>(future: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let local = LOCAL
        .try_with(|local| {
            local
                .set
                .upgrade()
                .map(|set| (set, local.set.clone(), local.next()))
        })
        .ok()
        .flatten();
    match local {
        Some((set, weak, seed)) => set.spawn_local(LOCAL.scope(Local::new(weak, seed), future)),
        // Outside `local`, or after its set was dropped (a task dropped with it that starts
        // another on its way out): the runtime's scheduler.
        None => tokio::spawn(future),
    }
}

/// Runs `future` with every task the library starts from it, and from those tasks, spawned on
/// `set`, and the library's random draws taken from a stream seeded by `seed`. Poll it inside
/// `set` (`set.run_until(local(&set, seed, future))`) or anywhere on the thread that polls `set`.
///
/// Nothing here holds `set` alive: once it is dropped, tasks started under `local` go to the
/// runtime's scheduler.
pub fn local<F: Future>(
    set: &Rc<LocalSet>,
    seed: u64,
    future: F,
) -> impl Future<Output = F::Output> {
    LOCAL.scope(Local::new(Rc::downgrade(set), seed), future)
}

/// The next random number of the task running under [`local`], if it is.
pub(crate) fn local_draw() -> Option<u64> {
    LOCAL.try_with(Local::next).ok()
}
