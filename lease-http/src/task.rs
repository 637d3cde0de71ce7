//! A client's background task, kept running while the client is used; the loop of a task that
//! keeps a stream open, opening it again when it breaks; and the task that probes a server while
//! it is unreachable.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use lease_core::CancellationToken;
use lease_core::backend::Reachability;
use lease_core::backoff::Backoff;
use tokio::task::JoinHandle;

/// A background task of a client (a stream it keeps open, a batch it sends): started on first
/// use, and again if the one before has ended, as it does with the runtime it ran on (a client
/// kept across runtimes, as tests and `#[tokio::main]` functions called twice do).
///
/// The task should hold its client only weakly, so that it ends with it, or end when the client's
/// token is cancelled as it is dropped (as [`reopen`] does).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let task = lease_http::Task::default();
/// assert!(task.ensure(std::future::pending::<()>), "started");
/// assert!(!task.ensure(std::future::pending::<()>), "runs once at a time");
/// # }
/// ```
#[derive(Debug, Default)]
pub struct Task(Mutex<Option<JoinHandle<()>>>);

impl Task {
    /// Spawns `start()` unless the task runs; true if it spawned it.
    pub fn ensure<F>(&self, start: impl FnOnce() -> F) -> bool
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let mut task = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if task.as_ref().is_some_and(|task| !task.is_finished()) {
            return false;
        }
        *task = Some(lease_core::runtime::spawn(start()));
        true
    }
}

/// The executor hyper and tonic start a connection's tasks on: [`lease_core::runtime::spawn`], so
/// they run where the client's other tasks do.
#[derive(Clone, Copy, Debug, Default)]
pub struct Executor;

impl<F> hyper::rt::Executor<F> for Executor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        drop(lease_core::runtime::spawn(future));
    }
}

/// A stream a client keeps open (a watch stream, a keep-alive stream), served by [`reopen`] in
/// its [`Task`]: given what it needs (the wire client, its channels) when the task starts.
pub trait Reopen: Send {
    /// Why a stream ended.
    type Error: fmt::Display + Send;

    /// Opens the stream and serves it until it breaks; returns why. `first`: the task's first
    /// stream (else one opened again after a break). `pause` is the wait before the next
    /// opening: the stream resets it when the server answers.
    fn serve(
        &mut self,
        first: bool,
        pause: &mut Backoff,
    ) -> impl Future<Output = Self::Error> + Send;

    /// The stream broke with `error`, before the pause.
    fn broke(&mut self, error: &Self::Error);
}

/// Serves `stream` until `closed` is cancelled (the client is gone), opening it again whenever it
/// breaks, after a pause of [`backoff`](crate::backoff) that grows while the openings fail.
/// `what` names the stream in the log (`"the {what} stream broke; opening it again"`).
pub async fn reopen<S: Reopen>(mut stream: S, what: &str, closed: CancellationToken) {
    let mut pause = crate::backoff();
    let mut first = true;
    loop {
        let Some(broke) = closed
            .run_until_cancelled(stream.serve(first, &mut pause))
            .await
        else {
            return;
        };
        first = false;
        stream.broke(&broke);
        tracing::debug!(error = %broke, "the {what} stream broke; opening it again");
        if closed.run_until_cancelled(pause.wait()).await.is_none() {
            return;
        }
    }
}

/// The first pause of a [`Probe`], before its first request.
const PROBE_FIRST: Duration = Duration::from_millis(100);

/// The longest pause between two requests of a [`Probe`]: a healed server is seen within about
/// this (plus the request's round trip) without any other traffic.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);

/// A client's probe of its server while the server is unreachable, so that
/// [`Backend::reachability`](lease_core::Backend::reachability) turns current again when the
/// server comes back, even if nothing else is sent (a load balancer that takes a node out on a
/// 503 never sends the request that would bring it back).
///
/// [`watch`](Probe::watch) is called where the backend reports its reachability: while the
/// report is [`Reachability::Unreachable`], it starts (once) a [`Task`] that sends the
/// backend's cheapest request, paused by a [`Backoff`] from 100 ms up to [`PROBE_EVERY`], until
/// the report is no longer unreachable. The request feeds the client's
/// [`ReachabilityTracker`](lease_core::backend::ReachabilityTracker) as every other request
/// does. The task holds its client only weakly between requests, so it ends with the client
/// (within one pause, plus one request still on its way).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::sync::Arc;
/// use lease_core::backend::{Reachability, ReachabilityTracker};
///
/// #[derive(Default)]
/// struct Client {
///     reachability: ReachabilityTracker,
///     probe: lease_http::Probe,
/// }
///
/// let client = Arc::new(Client::default());
/// client.reachability.answered(false);
/// let now = client.probe.watch(&client, |c| c.reachability.get(), |c: Arc<Client>| async move {
///     c.reachability.answered(true) // the server answered the probe's request
/// });
/// assert!(matches!(now, Reachability::Unreachable { .. }));
/// tokio::time::sleep(lease_http::PROBE_EVERY * 2).await;
/// assert_eq!(client.reachability.get(), Reachability::Reachable);
/// # }
/// ```
#[derive(Debug, Default)]
pub struct Probe(Task);

impl Probe {
    /// Reads `client`'s reachability (`reachability`), and, if it is unreachable and this is
    /// called on a Tokio runtime, starts probing unless a probe runs: `probe` sends one request,
    /// bounded by its own timeout. Returns what was read: no I/O here.
    pub fn watch<C, R, P, F>(&self, client: &Arc<C>, reachability: R, probe: P) -> Reachability
    where
        C: Send + Sync + 'static,
        R: Fn(&C) -> Reachability + Send + 'static,
        P: Fn(Arc<C>) -> F + Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let now = reachability(client);
        if matches!(now, Reachability::Unreachable { .. })
            && tokio::runtime::Handle::try_current().is_ok()
        {
            let client = Arc::downgrade(client);
            self.0
                .ensure(move || probe_until_reachable(client, reachability, probe));
        }
        now
    }
}

async fn probe_until_reachable<C, R, P, F>(client: Weak<C>, reachability: R, probe: P)
where
    R: Fn(&C) -> Reachability,
    P: Fn(Arc<C>) -> F,
    F: Future<Output = ()>,
{
    let mut pause = Backoff::new(PROBE_FIRST, PROBE_EVERY);
    loop {
        pause.wait().await;
        let Some(client) = client.upgrade() else {
            return;
        };
        if !matches!(reachability(&client), Reachability::Unreachable { .. }) {
            return;
        }
        probe(client).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use lease_core::CancellationToken;
    use lease_core::backend::{Reachability, ReachabilityTracker};
    use lease_core::backoff::Backoff;

    use super::{PROBE_EVERY, Probe, Reopen, reopen};

    /// A stream that breaks at once, and on its third opening closes its client.
    struct Breaking {
        closed: CancellationToken,
        opened: Vec<bool>,
        broke: usize,
    }

    impl Reopen for &mut Breaking {
        type Error = &'static str;

        async fn serve(&mut self, first: bool, _: &mut Backoff) -> &'static str {
            self.opened.push(first);
            if self.opened.len() == 3 {
                self.closed.cancel();
            }
            "reset"
        }

        fn broke(&mut self, _: &&'static str) {
            self.broke += 1;
        }
    }

    /// A broken stream is opened again (not as the first) after each break, until the client's
    /// token is cancelled.
    #[tokio::test]
    async fn a_stream_is_opened_again_until_its_client_closes() {
        let closed = CancellationToken::new();
        let mut stream = Breaking {
            closed: closed.clone(),
            opened: Vec::new(),
            broke: 0,
        };
        reopen(&mut stream, "test", closed).await;
        assert_eq!(stream.opened, [true, false, false]);
        assert_eq!(
            stream.broke, 3,
            "the third break too, before the pause sees the token"
        );
    }

    #[derive(Default)]
    struct Client {
        reachability: ReachabilityTracker,
        probe: Probe,
    }

    /// A probe of a server that never answers keeps going while its client lives, and its task
    /// ends (dropping what it holds) within a pause of the client's drop: no task outlives it.
    #[tokio::test]
    async fn the_probe_ends_with_its_client() {
        let client = Arc::new(Client::default());
        client.reachability.answered(false);
        let probes = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&probes);
        let now = client.probe.watch(
            &client,
            |c| c.reachability.get(),
            move |c: Arc<Client>| {
                counted.fetch_add(1, Ordering::SeqCst);
                async move { c.reachability.answered(false) }
            },
        );
        assert!(matches!(now, Reachability::Unreachable { .. }));
        tokio::time::sleep(PROBE_EVERY * 2).await;
        assert!(probes.load(Ordering::SeqCst) >= 2, "probing every second");
        drop(client);
        tokio::time::sleep(PROBE_EVERY * 2).await;
        assert_eq!(Arc::strong_count(&probes), 1, "the probe's task has ended");
    }
}
