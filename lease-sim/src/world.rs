//! One simulated world: a paused tokio runtime whose clock jumps to the next timer whenever every
//! task waits, the network, and the processes, each a `LocalSet` of its own behind a gate that
//! freezes it (`SIGSTOP`: not polled, its timers firing, its tasks running when it is resumed) or
//! kills it (`kill -9`: never polled again, its connections closed by its "kernel").
//!
//! Everything runs in one thread, in an order that depends on nothing but the seed: the runtime
//! is current-thread, the library's tasks and random draws go through
//! [`lease_core::runtime::local`], and the network draws its latencies from the seed.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use lease_core::BoxFuture;
use lease_http::dial::{Connection, Dial};
use tokio::task::{JoinHandle, LocalSet};

use crate::net::Net;
use crate::rng::Rng;

/// Builds the runtime a world runs on: one thread, the clock paused (it advances only when every
/// task waits, straight to the next timer), no I/O driver (the network is simulated), and tokio's
/// own random numbers (which `select!` and `sync::watch` draw from) seeded with `seed`.
///
/// The seed needs tokio's unstable API, which the workspace's `.cargo/config.toml` turns on
/// (`--cfg tokio_unstable`); a build without it cannot replay a schedule, and says so.
pub fn runtime(seed: u64) -> io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_time().start_paused(true);
    #[cfg(tokio_unstable)]
    builder.rng_seed(tokio::runtime::RngSeed::from_bytes(&seed.to_le_bytes()));
    #[cfg(not(tokio_unstable))]
    {
        let _ = seed;
        return Err(io::Error::other(
            "lease-sim needs tokio's seeded runtimes: build it with RUSTFLAGS=\"--cfg tokio_unstable\" \
             (the workspace's .cargo/config.toml sets it; a RUSTFLAGS of your own replaces it)",
        ));
    }
    #[cfg(tokio_unstable)]
    builder.build()
}

/// A simulated process: its tasks, and whether it runs.
#[derive(Clone)]
pub struct Process {
    name: Rc<str>,
    set: Rc<LocalSet>,
    gate: Rc<Gate>,
    seeds: Rc<RefCell<Rng>>,
    net: Net,
}

impl fmt::Debug for Process {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Process({})", self.name)
    }
}

#[derive(Default)]
struct Gate {
    frozen: Cell<bool>,
    killed: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Gate {
    fn wake(&self) {
        if let Some(waker) = self.waker.borrow_mut().take() {
            waker.wake();
        }
    }
}

/// Polls a process's `LocalSet` while its gate is open.
struct Driver {
    gate: Rc<Gate>,
    run: Pin<Box<dyn Future<Output = ()>>>,
}

impl Future for Driver {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.gate.killed.get() {
            return Poll::Ready(());
        }
        *self.gate.waker.borrow_mut() = Some(cx.waker().clone());
        if self.gate.frozen.get() {
            return Poll::Pending;
        }
        self.run.as_mut().poll(cx)
    }
}

impl Process {
    /// A process named `name` (its host on the network), its random draws seeded from `seed`.
    /// Must be called inside the world's root `LocalSet`, which runs it.
    pub fn start(name: &str, net: &Net, seed: u64) -> Process {
        let set = Rc::new(LocalSet::new());
        let gate = Rc::new(Gate::default());
        let run = {
            let set = Rc::clone(&set);
            Box::pin(async move { set.run_until(std::future::pending::<()>()).await })
        };
        drop(tokio::task::spawn_local(Driver {
            gate: Rc::clone(&gate),
            run,
        }));
        Process {
            name: name.into(),
            set,
            gate,
            seeds: Rc::new(RefCell::new(Rng::new(seed))),
            net: net.clone(),
        }
    }

    /// The process's name, which is its host's.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `future` as a task of this process: its spawns stay in the process, its random draws
    /// come from the process's seed.
    pub fn spawn<F>(&self, future: F) -> JoinHandle<F::Output>
    where
        F: Future + 'static,
        F::Output: 'static,
    {
        let seed = self.seeds.borrow_mut().next_u64();
        self.set
            .spawn_local(lease_core::runtime::local(seed, future))
    }

    /// How this process dials: from its host, on the simulated network.
    pub fn dial(&self) -> SimDial {
        SimDial {
            net: self.net.clone(),
            from: self.name.to_string(),
        }
    }

    /// Stops the process as `SIGSTOP` does: nothing of it runs until [`resume`](Self::resume),
    /// while its timers fire and what is sent to it waits in its connections.
    pub fn freeze(&self) {
        self.gate.frozen.set(true);
    }

    /// Lets a frozen process run again: what became due while it was stopped runs now.
    pub fn resume(&self) {
        self.gate.frozen.set(false);
        self.gate.wake();
    }

    /// Whether it is frozen.
    pub fn is_frozen(&self) -> bool {
        self.gate.frozen.get()
    }

    /// Kills the process as `kill -9` does: nothing of it runs again, and its connections close.
    pub fn kill(&self) {
        self.gate.killed.set(true);
        self.gate.wake();
        self.net.killed(&self.name);
    }

    /// Whether it was killed.
    pub fn is_killed(&self) -> bool {
        self.gate.killed.get()
    }
}

/// Dials on the simulated network from one host: what the simulated clients are built with
/// (`ConsulBuilder::dial`, `EtcdBuilder::dial`).
#[derive(Clone, Debug)]
pub struct SimDial {
    net: Net,
    from: String,
}

impl Dial for SimDial {
    fn dial(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Connection>> {
        let (net, from, host) = (self.net.clone(), self.from.clone(), host.to_owned());
        Box::pin(async move {
            let stream = net.connect(&from, &host, port).await?;
            Ok(Connection::new(stream))
        })
    }
}
