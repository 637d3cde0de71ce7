//! A schedule: everything one simulated run does, drawn from its seed — how many processes, the
//! leases' TTL and lock-delay, the server's knobs, and the faults, each with when it starts and
//! how long it lasts.

use std::fmt;
use std::time::Duration;

use crate::rng::Rng;

/// The leader key every process campaigns for, its worker writing while it leads.
pub const LEADER: &str = "svc/leader";
/// A leader key taken and given back in turn (a cron-style job).
pub const CRON: &str = "jobs/cron";
/// A semaphore of [`SEMAPHORE_LIMIT`] slots, its jobs churning.
pub const SEMAPHORE: &str = "jobs/sem";
/// Its limit.
pub const SEMAPHORE_LIMIT: u32 = 2;

/// Leader keys that stay quiet (no churn writes them), each process campaigning for the first
/// [`Schedule::quiet`] of them: a client with many quiet blocking reads, one per key while its
/// budget has room, whose groups then widen into `quiet/` while their reads wait on Consul for up
/// to 30 s (what the Consul watch groups' blind spot needed, which the churning keys alone never
/// showed: their reads end within milliseconds).
pub const QUIET: [&str; 8] = [
    "quiet/a", "quiet/b", "quiet/c", "quiet/d", "quiet/e", "quiet/f", "quiet/g", "quiet/h",
];

/// When faults may start, after the processes start.
const FAULTS_FROM: Duration = Duration::from_secs(3);
/// The last moment a fault may start.
const FAULTS_UNTIL: Duration = Duration::from_secs(40);

/// One run.
#[derive(Clone, Debug)]
pub struct Schedule {
    /// The seed it was drawn from (and that seeds the network, the processes and the server).
    pub seed: u64,
    /// How many processes hold leases (3–8).
    pub processes: usize,
    /// Every lease's TTL.
    pub ttl: Duration,
    /// Every lease's lock-delay (Consul; etcd has none).
    pub lock_delay: Duration,
    /// The server's knob: Consul's TTL multiplier (invalidation between 1 and 2 TTLs after the
    /// last renewal), in percent; etcd's lessor lateness in milliseconds (0–500).
    pub server_knob: u64,
    /// The connection budget of every process's client where the schedule draws one (a quarter
    /// of them, 4–7: Consul's `max_connections`, which etcd has no counterpart of). Fewer watch
    /// slots than a process has interests make its watch groups share, widen and reshape as
    /// leases come and go.
    pub client_connections: Option<usize>,
    /// How many of the [`QUIET`] keys every process campaigns for (0 in most schedules; 3 to 8
    /// in half of those with a connection budget), their new holders' keys deleted by armed
    /// actions and an operator.
    pub quiet: usize,
    /// The faults, by start.
    pub faults: Vec<Planned>,
}

/// A fault and when it starts.
#[derive(Clone, Debug)]
pub struct Planned {
    /// Since the processes started.
    pub at: Duration,
    /// What.
    pub fault: Fault,
}

/// One fault. Processes are numbered from 0; `pick` chooses among what exists when the fault
/// starts (a live lease, a holder's key).
#[derive(Clone, Debug)]
pub enum Fault {
    /// Whatever the process and the server send each other is held (both ways, or only what the
    /// process sends, or only what it receives) for `lasting`, then delivered.
    Partition {
        /// Which process.
        process: usize,
        /// Which way: both, or only from the process, or only to it.
        way: Way,
        /// How long.
        lasting: Duration,
    },
    /// Every process cut off from the server (both ways).
    PartitionAll {
        /// How long.
        lasting: Duration,
    },
    /// Extra latency both ways between a process and the server.
    Delay {
        /// Which process.
        process: usize,
        /// How much more.
        extra: Duration,
        /// How long.
        lasting: Duration,
    },
    /// The server's next answers to a process are lost, each with its connection, after the
    /// server applied the request.
    LoseAnswers {
        /// Which process.
        process: usize,
        /// How many.
        count: u32,
    },
    /// The process's connections to the server are reset.
    Reset {
        /// Which process.
        process: usize,
    },
    /// The server stops (connections reset, connects refused, its clock stopped) and restarts.
    ServerRestart {
        /// How long it is down.
        down_for: Duration,
    },
    /// An operator takes a live lease away (Consul: destroys its session; etcd: revokes it).
    Revoke {
        /// Which of the live leases.
        pick: u64,
    },
    /// An operator deletes a leader key.
    DeleteKey {
        /// Which key.
        key: &'static str,
    },
    /// An operator deletes a semaphore key: its `.lock` (Consul) or a holder's key.
    DeleteSemaphoreKey {
        /// Which of the holders (Consul: the `.lock` itself when 0).
        pick: u64,
    },
    /// The process is stopped (`SIGSTOP`) for `lasting`.
    Freeze {
        /// Which process.
        process: usize,
        /// How long.
        lasting: Duration,
    },
    /// The process is killed (`kill -9`), and a new one started in its place after `restart_after`.
    Kill {
        /// Which process.
        process: usize,
        /// When its replacement starts.
        restart_after: Duration,
    },
    /// An operator's action that waits for a moment of the protocol rather than a time: armed
    /// at its start for [`ARMED_FOR`], it fires at the first write of the server that makes the
    /// moment, at that instant, before the write's answer reaches anyone.
    Armed {
        /// The moment, and what is done then.
        trap: Trap,
        /// How much later than the network's latency the processes whose leases it takes hear
        /// from the server, for [`SLOW_FOR`] after it: a loaded machine's delay between a loss
        /// arriving and the work it cancels stopping. Under the settle, so not a cut-off: our
        /// contenders' settle exists to cover it, and the checks excuse nothing for it.
        slow: Duration,
    },
}

/// How long an [`Fault::Armed`] action waits for its moment.
pub const ARMED_FOR: Duration = Duration::from_secs(5);

/// How long the holders an armed action takes hear late ([`Fault::Armed`]'s `slow`).
pub const SLOW_FOR: Duration = Duration::from_secs(1);

/// The range of [`Fault::Armed`]'s `slow`: up to 60 ms, well under the default settle (100 ms)
/// with the network's latency both ways added.
pub const SLOW: (Duration, Duration) = (Duration::from_millis(5), Duration::from_millis(60));

/// The moment an armed action waits for, and what it does then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trap {
    /// A contender joins the line for `key` behind its holder (etcd: a new key under `<key>/`;
    /// a Consul semaphore: a new contender key): the holder's key is deleted at once, before the
    /// newcomer has read the line. A Consul leader key has no line: it never fires there.
    DeleteHolderOnJoin {
        /// Which lock.
        key: &'static str,
    },
    /// A new holder takes `key` (or the head of its line): its key is deleted `after` later,
    /// while the lease is new (a client's watches still settling around it).
    DeleteNewHolder {
        /// Which lock.
        key: &'static str,
        /// How long after the grant.
        after: Duration,
    },
    /// The Consul semaphore's `.lock` is deleted under its holders and written again `after`
    /// later by a writer that does not settle: as it was (a copy restored), or `afresh`, with no
    /// holders, as `consul lock -n` re-creates it before taking a slot. etcd's semaphore has no
    /// `.lock`: it never fires there.
    RecreateLock {
        /// How long it is gone.
        after: Duration,
        /// Written without its holders.
        afresh: bool,
    },
}

impl Trap {
    /// How long after it fires it has done all it does.
    pub fn after(&self) -> Duration {
        match *self {
            Trap::DeleteHolderOnJoin { .. } => Duration::ZERO,
            Trap::DeleteNewHolder { after, .. } | Trap::RecreateLock { after, .. } => after,
        }
    }
}

/// Which way a partition holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// Both ways.
    Both,
    /// What the process sends.
    FromProcess,
    /// What it is sent.
    ToProcess,
}

impl Fault {
    /// How long after its start it is healed (zero for an instant fault).
    pub fn lasting(&self) -> Duration {
        match *self {
            Fault::Partition { lasting, .. }
            | Fault::PartitionAll { lasting }
            | Fault::Delay { lasting, .. }
            | Fault::Freeze { lasting, .. } => lasting,
            Fault::ServerRestart { down_for } => down_for,
            Fault::Kill { restart_after, .. } => restart_after,
            Fault::LoseAnswers { .. }
            | Fault::Reset { .. }
            | Fault::Revoke { .. }
            | Fault::DeleteKey { .. }
            | Fault::DeleteSemaphoreKey { .. } => Duration::ZERO,
            Fault::Armed { trap, .. } => ARMED_FOR + trap.after().max(SLOW_FOR),
        }
    }
}

impl Schedule {
    /// The schedule of `seed`.
    pub fn draw(seed: u64) -> Schedule {
        let mut rng = Rng::new(seed).fork("schedule");
        let processes = rng.between(3, 8) as usize;
        let ttl = Duration::from_secs(rng.between(10, 15));
        let lock_delay = *rng
            .pick(&[
                Duration::ZERO,
                Duration::from_secs(1),
                Duration::from_secs(3),
            ])
            .unwrap_or(&Duration::ZERO);
        let server_knob = rng.between(0, 100);
        let count = rng.between(1, 6);
        let mut faults: Vec<Planned> = (0..count)
            .map(|_| Planned {
                at: rng.duration(FAULTS_FROM, FAULTS_UNTIL),
                fault: draw_fault(&mut rng, processes, ttl),
            })
            .collect();
        // The armed actions from a stream of their own too (in a third of the schedules, one or
        // two), so that the schedules drawn before them keep every other fault; how late their
        // victims hear, from another.
        let mut armed = Rng::new(seed).fork("armed");
        let mut slow = Rng::new(seed).fork("slow");
        if armed.below(3) == 0 {
            for _ in 0..armed.between(1, 2) {
                faults.push(Planned {
                    // From the start on: the first grants come while every client's watch
                    // groups are still forming (and, with four connections, widening).
                    at: armed.duration(Duration::ZERO, FAULTS_UNTIL),
                    fault: Fault::Armed {
                        trap: draw_trap(&mut armed),
                        slow: slow.duration(SLOW.0, SLOW.1),
                    },
                });
            }
        }
        faults.sort_by_key(|p| p.at);
        // A stream of its own, so that every other draw is what it was before budgets were.
        let mut budget = Rng::new(seed).fork("connections");
        // Four (the least: two watch slots for a process's three locks, so its groups widen and
        // reshape as its leases come and go) in half of them; five to seven (no widening, but
        // watches that share connections with requests) in the rest.
        let client_connections =
            (budget.below(4) == 0).then(|| *budget.pick(&[4, 4, 4, 5, 6, 7]).unwrap_or(&4));
        // The quiet keys, and their faults, from a stream of their own too.
        let mut quiet_draws = Rng::new(seed).fork("quiet-campaigns");
        let quiet = match client_connections {
            Some(_) if quiet_draws.below(2) == 0 => quiet_draws.between(3, QUIET.len() as u64),
            _ => 0,
        } as usize;
        if quiet > 0 {
            faults.extend(draw_quiet_faults(&mut quiet_draws, &QUIET[..quiet]));
            faults.sort_by_key(|p| p.at);
        }
        Schedule {
            seed,
            processes,
            ttl,
            lock_delay,
            server_knob,
            client_connections,
            quiet,
            faults,
        }
    }

    /// When the last fault is healed, since the start.
    pub fn healed_at(&self) -> Duration {
        (self.faults.iter())
            .map(|p| p.at + p.fault.lasting())
            .max()
            .unwrap_or(Duration::ZERO)
    }
}

fn draw_fault(rng: &mut Rng, processes: usize, ttl: Duration) -> Fault {
    let process = rng.below(processes as u64) as usize;
    // Short (under the fence), around it, and well past the TTL.
    let lasting = match rng.below(3) {
        0 => rng.duration(Duration::from_millis(50), Duration::from_secs(2)),
        1 => rng.duration(ttl / 2, ttl + ttl / 2),
        _ => rng.duration(ttl * 2, ttl * 3),
    };
    match rng.below(12) {
        0 | 1 => Fault::Partition {
            process,
            way: *rng
                .pick(&[Way::Both, Way::FromProcess, Way::ToProcess])
                .unwrap_or(&Way::Both),
            lasting,
        },
        2 => Fault::PartitionAll { lasting },
        3 => Fault::Delay {
            process,
            extra: rng.duration(Duration::from_millis(50), Duration::from_millis(800)),
            lasting,
        },
        4 => Fault::LoseAnswers {
            process,
            count: rng.between(1, 3) as u32,
        },
        5 => Fault::Reset { process },
        6 => Fault::ServerRestart {
            down_for: rng.duration(Duration::from_millis(100), Duration::from_secs(5)),
        },
        7 => Fault::Revoke {
            pick: rng.next_u64(),
        },
        8 => Fault::DeleteKey {
            key: rng.pick(&[LEADER, CRON]).unwrap_or(&LEADER),
        },
        9 => Fault::DeleteSemaphoreKey {
            pick: rng.next_u64(),
        },
        10 => Fault::Freeze { process, lasting },
        _ => Fault::Kill {
            process,
            restart_after: rng.duration(Duration::from_millis(100), ttl * 2),
        },
    }
}

/// For the quiet `keys`: one or two armed deletions of a new holder's key, most of them armed
/// for the first grants (while every client's groups form and widen), and an operator's
/// deletion.
fn draw_quiet_faults(rng: &mut Rng, keys: &[&'static str]) -> Vec<Planned> {
    let mut faults: Vec<Planned> = (0..rng.between(1, 2))
        .map(|_| Planned {
            // Most armed before the first grants (a few milliseconds in), the rest any time.
            at: if rng.below(4) == 0 {
                rng.duration(Duration::ZERO, FAULTS_UNTIL)
            } else {
                rng.duration(Duration::ZERO, Duration::from_millis(2))
            },
            fault: Fault::Armed {
                trap: Trap::DeleteNewHolder {
                    key: rng.pick(keys).unwrap_or(&QUIET[0]),
                    after: rng.duration(Duration::ZERO, Duration::from_millis(300)),
                },
                slow: rng.duration(SLOW.0, SLOW.1),
            },
        })
        .collect();
    faults.push(Planned {
        at: rng.duration(FAULTS_FROM, FAULTS_UNTIL),
        fault: Fault::DeleteKey {
            key: rng.pick(keys).unwrap_or(&QUIET[0]),
        },
    });
    faults
}

fn draw_trap(rng: &mut Rng) -> Trap {
    let key = *rng.pick(&[LEADER, CRON, SEMAPHORE]).unwrap_or(&LEADER);
    match rng.below(3) {
        0 => Trap::DeleteHolderOnJoin { key },
        // Half of them within 300 ms (the holder's watch groups may be widening around the new
        // lease), the rest up to 3 s.
        1 => Trap::DeleteNewHolder {
            key,
            after: if rng.below(2) == 0 {
                rng.duration(Duration::ZERO, Duration::from_millis(300))
            } else {
                rng.duration(Duration::ZERO, Duration::from_secs(3))
            },
        },
        // Half of them within a round trip or two (gone between two reads of a planner), the
        // rest up to 300 ms.
        _ => Trap::RecreateLock {
            after: if rng.below(2) == 0 {
                rng.duration(Duration::from_micros(100), Duration::from_millis(5))
            } else {
                rng.duration(Duration::from_millis(1), Duration::from_millis(300))
            },
            afresh: rng.below(2) == 0,
        },
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {}: {} processes, TTL {:?}, lock-delay {:?}, server knob {}",
            self.seed, self.processes, self.ttl, self.lock_delay, self.server_knob
        )?;
        if let Some(budget) = self.client_connections {
            write!(f, ", {budget} connections per client")?;
        }
        if self.quiet > 0 {
            write!(f, ", {} quiet keys", self.quiet)?;
        }
        for planned in &self.faults {
            write!(f, "\n  at {:?}: {:?}", planned.at, planned.fault)?;
        }
        Ok(())
    }
}
