//! The simulated network: hosts by name, listeners on their ports, and TCP-like connections
//! between them whose bytes arrive in order after a seeded latency, on the simulation's paused
//! clock.
//!
//! Faults are the network's own: a link held one way or both (what was sent arrives when it is
//! released, as TCP retransmits across a partition that heals; connects across it hang), extra
//! latency on a link, a connection reset, the next answer from a host lost with its connection
//! (the server applied the request; the client sees a reset), a host down (its connections reset,
//! connects to it refused). A process that is killed closes its connections as its kernel would;
//! a process that is frozen keeps them (what arrives waits in its buffers).
//!
//! Everything is behind one lock, taken for a moment by each read, write and fault: the
//! simulation runs in one thread, so it is never contended, and the streams are `Send`, as the
//! clients' connectors require.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::{Instant, Sleep};

use crate::rng::Rng;

mod stream;

/// A host and port.
pub type Addr = (String, u16);

/// The simulated network. Clones share it.
#[derive(Clone)]
pub struct Net(Arc<Mutex<State>>);

impl fmt::Debug for Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Net")
    }
}

/// How the network behaves when nothing is wrong.
#[derive(Clone, Debug)]
pub struct NetConfig {
    /// One-way latency of a segment: drawn per segment in this range.
    pub latency: (Duration, Duration),
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            latency: (Duration::from_micros(200), Duration::from_millis(2)),
        }
    }
}

struct State {
    rng: Rng,
    config: NetConfig,
    listeners: BTreeMap<Addr, Listening>,
    /// Directional: (from, to).
    links: BTreeMap<(String, String), Link>,
    conns: BTreeMap<u64, Conn>,
    next_conn: u64,
    /// Hosts that are down: connects to them are refused.
    down: BTreeMap<String, ()>,
    /// Connects waiting for a held link, woken when a link is released.
    waiting_connects: Vec<Waker>,
    /// Counters, for the reports.
    pub(crate) stats: Stats,
}

/// What the network carried.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    /// Connections opened.
    pub connections: u64,
    /// Segments written.
    pub segments: u64,
}

#[derive(Default)]
struct Link {
    held: bool,
    extra: Duration,
    /// A slow receiver's lateness ([`Net::slow`]), beside `extra`.
    slow: Duration,
    /// Answers (writes) to lose, each with its connection.
    lose: u32,
}

struct Listening {
    backlog: VecDeque<Stream>,
    waker: Option<Waker>,
}

/// A connection: the two hosts and the two directions.
struct Conn {
    hosts: [String; 2],
    /// `pipes[i]` carries what side `i` writes.
    pipes: [Arc<Mutex<Pipe>>; 2],
}

/// One direction of a connection.
#[derive(Default)]
struct Pipe {
    segments: VecDeque<Segment>,
    /// The reader learns of a reset at this time: reads and writes fail from then on, whatever
    /// is left unread.
    reset_at: Option<Instant>,
    reader: Option<Waker>,
}

struct Segment {
    /// When it arrives; `None` while its link is held.
    ready: Option<Instant>,
    what: Carried,
}

enum Carried {
    Data(Bytes),
    /// The writer closed its side.
    Fin,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Net {
    /// A network whose latencies are drawn from `rng`.
    pub fn new(rng: Rng, config: NetConfig) -> Net {
        Net(Arc::new(Mutex::new(State {
            rng,
            config,
            listeners: BTreeMap::new(),
            links: BTreeMap::new(),
            conns: BTreeMap::new(),
            next_conn: 0,
            down: BTreeMap::new(),
            waiting_connects: Vec::new(),
            stats: Stats::default(),
        })))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.0)
    }

    /// Listens on `host:port`. The listener stops listening when dropped.
    pub fn listen(&self, host: &str, port: u16) -> io::Result<Listener> {
        let addr = (host.to_owned(), port);
        let mut state = self.state();
        if state.listeners.contains_key(&addr) {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{host}:{port} is in use"),
            ));
        }
        state.listeners.insert(
            addr.clone(),
            Listening {
                backlog: VecDeque::new(),
                waker: None,
            },
        );
        Ok(Listener {
            net: self.clone(),
            addr,
        })
    }

    /// Connects `from` to `host:port`: refused at once (after a round trip) if nothing listens
    /// there or the host is down; hangs while a link between them is held, as a SYN does across a
    /// partition (the caller's connect timeout ends it).
    pub async fn connect(&self, from: &str, host: &str, port: u16) -> io::Result<Stream> {
        std::future::poll_fn(|cx| {
            let mut state = self.state();
            if state.held(from, host) || state.held(host, from) {
                state.waiting_connects.push(cx.waker().clone());
                return Poll::Pending;
            }
            Poll::Ready(())
        })
        .await;
        let round_trip = {
            let mut state = self.state();
            state.latency(from, host) + state.latency(host, from)
        };
        tokio::time::sleep(round_trip).await;
        let mut state = self.state();
        let addr = (host.to_owned(), port);
        if state.down.contains_key(host) || !state.listeners.contains_key(&addr) {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("connection refused ({host}:{port})"),
            ));
        }
        let id = state.next_conn;
        state.next_conn += 1;
        state.stats.connections += 1;
        let pipes = [Arc::default(), Arc::default()];
        state.conns.insert(
            id,
            Conn {
                hosts: [from.to_owned(), host.to_owned()],
                pipes: pipes.clone(),
            },
        );
        let server = Stream::new(self.clone(), id, 1, &pipes);
        let listening = state
            .listeners
            .get_mut(&addr)
            .expect("checked above, under the same lock");
        listening.backlog.push_back(server);
        if let Some(waker) = listening.waker.take() {
            waker.wake();
        }
        Ok(Stream::new(self.clone(), id, 0, &pipes))
    }

    /// Holds what `from` sends `to` (both ways with `both`) until [`release`](Self::release).
    pub fn hold(&self, from: &str, to: &str) {
        self.state().link(from, to).held = true;
    }

    /// Delivers what the link held (after its latency) and lets new segments through.
    pub fn release(&self, from: &str, to: &str) {
        let mut state = self.state();
        state.link(from, to).held = false;
        let now = Instant::now();
        let ids: Vec<u64> = state.conns.keys().copied().collect();
        for id in ids {
            for side in 0..2 {
                let conn = &state.conns[&id];
                if conn.hosts[side] != from || conn.hosts[1 - side] != to {
                    continue;
                }
                let pipe = Arc::clone(&conn.pipes[side]);
                let mut pipe = lock(&pipe);
                let mut last = now;
                for segment in pipe.segments.iter_mut() {
                    match segment.ready {
                        Some(ready) => last = last.max(ready),
                        None => {
                            last = last.max(now + state.latency(from, to));
                            segment.ready = Some(last);
                        }
                    }
                }
                if let Some(waker) = pipe.reader.take() {
                    waker.wake();
                }
            }
        }
        for waker in state.waiting_connects.drain(..) {
            waker.wake();
        }
    }

    /// Adds `extra` to the latency of what `from` sends `to` (zero: back to normal).
    pub fn delay(&self, from: &str, to: &str, extra: Duration) {
        self.state().link(from, to).extra = extra;
    }

    /// What `from` sends `to` arrives `late` later than its latency (zero: on time again): the
    /// receiver is slow to take it in. Beside [`delay`](Self::delay), which it neither changes
    /// nor is changed by.
    pub fn slow(&self, from: &str, to: &str, late: Duration) {
        self.state().link(from, to).slow = late;
    }

    /// The next `count` writes from `from` to `to` are lost, each with its connection: reset
    /// instead (an answer lost after the server applied its request).
    pub fn lose_next(&self, from: &str, to: &str, count: u32) {
        self.state().link(from, to).lose += count;
    }

    /// Resets every connection between `a` and `b` (both sides learn of it after the latency).
    pub fn reset_between(&self, a: &str, b: &str) {
        let mut state = self.state();
        let ids: Vec<u64> = (state.conns.iter())
            .filter(|(_, c)| {
                (c.hosts[0] == a && c.hosts[1] == b) || (c.hosts[0] == b && c.hosts[1] == a)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            state.reset(id);
        }
    }

    /// `host` is down: its connections reset, connects to it refused, until [`up`](Self::up).
    pub fn down(&self, host: &str) {
        let mut state = self.state();
        state.down.insert(host.to_owned(), ());
        let ids: Vec<u64> = (state.conns.iter())
            .filter(|(_, c)| c.hosts.iter().any(|h| h == host))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            state.reset(id);
        }
    }

    /// `host` accepts connections again.
    pub fn up(&self, host: &str) {
        self.state().down.remove(host);
    }

    /// `host`'s process was killed: its kernel closes its connections (a FIN each, a reset where
    /// it had unread data), and nothing listens on it any more.
    pub fn killed(&self, host: &str) {
        let mut state = self.state();
        state.listeners.retain(|(h, _), _| h != host);
        let ids: Vec<(u64, usize)> = (state.conns.iter())
            .flat_map(|(id, c)| {
                (0..2)
                    .filter(|side| c.hosts[*side] == host)
                    .map(move |side| (*id, side))
            })
            .collect();
        for (id, side) in ids {
            let unread = {
                let conn = &state.conns[&id];
                let incoming = lock(&conn.pipes[1 - side]);
                incoming
                    .segments
                    .iter()
                    .any(|s| matches!(s.what, Carried::Data(_)))
            };
            if unread {
                state.reset(id);
            } else {
                state.send(id, side, Carried::Fin);
            }
        }
    }

    /// Connections open now, and what the network carried.
    pub fn stats(&self) -> (usize, Stats) {
        let state = self.state();
        (state.conns.len(), state.stats)
    }
}

impl State {
    fn link(&mut self, from: &str, to: &str) -> &mut Link {
        self.links
            .entry((from.to_owned(), to.to_owned()))
            .or_default()
    }

    fn held(&self, from: &str, to: &str) -> bool {
        self.links
            .get(&(from.to_owned(), to.to_owned()))
            .is_some_and(|l| l.held)
    }

    fn latency(&mut self, from: &str, to: &str) -> Duration {
        let (low, high) = self.config.latency;
        let extra = (self.links.get(&(from.to_owned(), to.to_owned())))
            .map_or(Duration::ZERO, |l| l.extra + l.slow);
        self.rng.duration(low, high) + extra
    }

    /// Puts `what` on side `side`'s pipe of connection `id`, in order, after the link's latency
    /// (or held); wakes the reader.
    fn send(&mut self, id: u64, side: usize, what: Carried) {
        let Some(conn) = self.conns.get(&id) else {
            return;
        };
        let (from, to) = (conn.hosts[side].clone(), conn.hosts[1 - side].clone());
        let pipe = Arc::clone(&conn.pipes[side]);
        self.stats.segments += 1;
        let ready = if self.held(&from, &to) {
            None
        } else {
            Some(Instant::now() + self.latency(&from, &to))
        };
        let mut pipe = lock(&pipe);
        let ready = match (ready, pipe.segments.back()) {
            (
                Some(ready),
                Some(Segment {
                    ready: Some(last), ..
                }),
            ) => Some(ready.max(*last)),
            // Behind a held segment: held too.
            (Some(_), Some(Segment { ready: None, .. })) => None,
            (ready, _) => ready,
        };
        pipe.segments.push_back(Segment { ready, what });
        if let Some(waker) = pipe.reader.take() {
            waker.wake();
        }
    }

    /// Resets connection `id`: each side learns of it after a latency, and the connection is
    /// forgotten.
    fn reset(&mut self, id: u64) {
        let Some(conn) = self.conns.remove(&id) else {
            return;
        };
        for side in 0..2 {
            let at = Instant::now() + self.latency(&conn.hosts[1 - side], &conn.hosts[side]);
            let mut pipe = lock(&conn.pipes[1 - side]);
            pipe.reset_at = Some(pipe.reset_at.map_or(at, |t| t.min(at)));
            if let Some(waker) = pipe.reader.take() {
                waker.wake();
            }
        }
    }
}

/// Listens on one address.
pub struct Listener {
    net: Net,
    addr: Addr,
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Listener({}:{})", self.addr.0, self.addr.1)
    }
}

impl Listener {
    /// The next connection; pending while none comes, and for ever once its host was killed.
    pub async fn accept(&self) -> Stream {
        std::future::poll_fn(|cx| {
            let mut state = self.net.state();
            match state.listeners.get_mut(&self.addr) {
                Some(listening) => match listening.backlog.pop_front() {
                    Some(stream) => Poll::Ready(stream),
                    None => {
                        listening.waker = Some(cx.waker().clone());
                        Poll::Pending
                    }
                },
                None => Poll::Pending,
            }
        })
        .await
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.net.state().listeners.remove(&self.addr);
    }
}

/// One side of a connection.
pub struct Stream {
    net: Net,
    id: u64,
    side: usize,
    incoming: Arc<Mutex<Pipe>>,
    /// Set to the time the next segment arrives, while it is on its way.
    arrival: Option<Pin<Box<Sleep>>>,
    closed: bool,
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Stream({}:{})", self.id, self.side)
    }
}

impl Stream {
    fn new(net: Net, id: u64, side: usize, pipes: &[Arc<Mutex<Pipe>>; 2]) -> Stream {
        Stream {
            net,
            id,
            side,
            incoming: Arc::clone(&pipes[1 - side]),
            arrival: None,
            closed: false,
        }
    }

    fn reset_error() -> io::Error {
        io::Error::new(io::ErrorKind::ConnectionReset, "connection reset by peer")
    }

    /// Whether this side has learnt that the connection was reset.
    fn is_reset(&self) -> bool {
        lock(&self.incoming)
            .reset_at
            .is_some_and(|at| at <= Instant::now())
    }
}
