//! Where the library's tasks run, and where its random numbers come from: the one place lease-core
//! and the backend crates start a task ([`spawn`]) or draw a random number
//! ([`random_below`](crate::backoff::random_below)).
//!
//! Normally [`spawn`] is `tokio::spawn`, and random draws are seeded by the process. A future run
//! under [`local`] instead keeps every task the library starts from it (and from those tasks) on
//! the [`LocalSet`](tokio::task::LocalSet) that polls it, and draws its random numbers from a
//! seed of the caller's. That is what a deterministic simulation needs (lease-sim runs several
//! processes in one thread): each process's tasks live in its own `LocalSet`, so not polling the
//! set freezes the process as a `SIGSTOP` would (its timers fire while it is stopped; its tasks
//! run when it is resumed), dropping the set ends it as a `kill -9` would, and the same seed gives
//! the same run.
//!
//! ```
//! use tokio::task::LocalSet;
//!
//! async fn draws() -> (u64, u64) {
//!     // A task the library starts here runs on the LocalSet, not on the runtime's scheduler.
//!     let task = lease_core::runtime::spawn(async { lease_core::backoff::random_below(1000) });
//!     let mine = lease_core::backoff::random_below(1000);
//!     (mine, task.await.expect("the task ran"))
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let process = LocalSet::new();
//! let first = process.run_until(lease_core::runtime::local(7, draws())).await;
//! let again = process.run_until(lease_core::runtime::local(7, draws())).await;
//! assert_eq!(first, again, "the same seed, the same draws");
//! # }
//! ```

use std::cell::Cell;
use std::future::Future;

use tokio::task::JoinHandle;

tokio::task_local! {
    /// The random draws of the code running under [`local`].
    static LOCAL: Draws;
}

/// A task's own stream of random numbers, under [`local`].
struct Draws(Cell<u64>);

impl Draws {
    /// The next number (splitmix64: every seed, 0 included, gives a well-mixed stream).
    fn next(&self) -> u64 {
        let state = self.0.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
        self.0.set(state);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Starts `future` as a task, as `tokio::spawn` does, and returns its handle: on the current
/// tokio runtime, or, under [`local`], on the `LocalSet` that polls the caller (with a stream of
/// random numbers of its own, drawn from its parent's).
///
/// # Panics
///
/// Outside a tokio runtime, as `tokio::spawn` does; under [`local`], outside a `LocalSet`, as
/// `tokio::task::spawn_local` does.
pub fn spawn<F>(future: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match LOCAL.try_with(Draws::next) {
        Ok(seed) => tokio::task::spawn_local(LOCAL.scope(Draws(Cell::new(seed)), future)),
        Err(_) => tokio::spawn(future),
    }
}

/// Runs `future` with every task the library starts from it, and from those tasks, started on the
/// `LocalSet` that polls them (`tokio::task::spawn_local`), and the library's random draws taken
/// from a stream seeded by `seed`. Poll it inside a `LocalSet`:
/// `set.run_until(local(seed, future))`.
///
/// Those tasks belong to the set: a holder task dropped with it unfinished gives nothing back (as
/// in a process killed with `kill -9`), where outside `local` it would hand its release to the
/// process-wide clean-up thread.
pub fn local<F: Future>(seed: u64, future: F) -> impl Future<Output = F::Output> {
    LOCAL.scope(Draws(Cell::new(seed)), future)
}

/// Whether the code running now runs under [`local`].
pub(crate) fn is_local() -> bool {
    LOCAL.try_with(|_| ()).is_ok()
}

/// The next random number of the task running under [`local`], if it is.
pub(crate) fn local_draw() -> Option<u64> {
    LOCAL.try_with(Draws::next).ok()
}
