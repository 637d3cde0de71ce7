//! The invariants every schedule is judged by, from its history and from what the simulation saw
//! of the server (the oracle):
//!
//! - **safety**: never more holders of a key writing at one instant than its limit (leader: one),
//!   except where the documented bound allows it: an operator took the older holder's lease away
//!   while that holder was cut off (partitioned, slowed down, frozen, its answers lost, the
//!   server down) or still reconnecting after it, so it could not hear of it; it must stop
//!   within [`NOTICE`] of being able to again; or the newer holder began to ask for the lock only
//!   after the action, when the line it joined no longer showed the old holder. A loss the
//!   server decided by itself (a TTL run out) is never excused: the self-fence covers it;
//! - **sequencers rise**: the holders of a key, in the order they first wrote, carry ever greater
//!   sequencers;
//! - **acquires end within their bound**: `Wait::UpTo(d)` answers within `d` plus
//!   [`ACQUIRE_SLACK`], `Wait::Never` within [`ONE_ATTEMPT`], unless the process was frozen
//!   meanwhile;
//! - **losses are noticed within the fence interval** and **recovery** (the run's own checks,
//!   [`crate::run`]), **no panic**, **nothing left behind**.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::history::{History, Kind, Line, Span};
use lease_core::Sequencer;

use crate::schedule::{CRON, LEADER, QUIET, SEMAPHORE, SEMAPHORE_LIMIT};

/// How soon a holder that could not hear of its loss must stop once it can: the longest pause of
/// a client's outage gate (Consul's, 2 s: its first request after a heal may wait that long) and
/// half a second for the listing that tells it. (1 s was too short: seed 1225 of Consul, a
/// holder that heard 1.6 s after the server came back.)
pub const NOTICE: Duration = Duration::from_millis(2_500);

/// Where a server's lines name only holders (Consul's), how soon before an operator's action a
/// contender may have begun to ask and still not have read the lock held: its session's creation
/// and its first read, two round trips of at most 4 ms.
pub const NEWCOMER_WINDOW: Duration = Duration::from_millis(10);

/// How much longer than its bound an acquire may take: lease-core's slack (the last attempt's
/// answer on its way), and a millisecond for the timer's tick.
pub const ACQUIRE_SLACK: Duration =
    lease_core::backend::ACQUIRE_SLACK.saturating_add(Duration::from_millis(1));

/// How long a `Wait::Never` acquire may take: its one attempt, which lease-core ends at
/// [`lease_core::backend::ATTEMPT_BOUND`] (seed 4543 of etcd: 17.5 s over a link 776 ms slower
/// each way, before it did), and a millisecond for the timer's tick.
pub const ONE_ATTEMPT: Duration =
    lease_core::backend::ATTEMPT_BOUND.saturating_add(Duration::from_millis(1));

/// A span of time in which a process could not hear from the server (or did not run).
#[derive(Clone, Copy, Debug)]
pub struct CutOff {
    /// The process, or `None` for all of them.
    pub pid: Option<u32>,
    /// From (ns since the start).
    pub from: u128,
    /// To.
    pub to: u128,
    /// Whether the process was frozen (it did not run at all).
    pub frozen: bool,
}

/// An operator's action.
#[derive(Clone, Debug)]
pub struct Action {
    /// When (ns).
    pub at: u128,
    /// The sequencers whose leases it took away: the holders at that moment, and those the
    /// server had granted before it whose holders learned of the grant only after it (the
    /// answer was on its way; the oracle adds them when it first sees them).
    pub took: Vec<String>,
    /// What it removed from the lines of the workload's locks (see
    /// [`crate::server::Server::line`]): each key and the index of its turn, granted or not,
    /// known to its process or not (seed 1703 of etcd: a grant on its way to a frozen process).
    pub removed: Vec<(String, u64)>,
    /// Who stood in the lines of the workload's locks just before it (as `removed`).
    pub lined: Vec<(String, u64)>,
    /// The server's index just before it (see [`crate::server::Server::index`]).
    pub index: u64,
}

impl Action {
    /// Whether it took the lease of `seq`: one of the leases held when it came, or the turn in
    /// line the sequencer names (its key, or its contender key under it, and its index).
    pub fn took_lease(&self, seq: &str) -> bool {
        if self.took.iter().any(|t| t == seq) {
            return true;
        }
        let Ok(seq) = seq.parse::<Sequencer>() else {
            return false;
        };
        self.removed.iter().any(|(key, index)| {
            let turn =
                *index == seq.index() || (seq.generation() != 0 && *index == seq.generation());
            let under = key == seq.key()
                || key
                    .strip_prefix(seq.key())
                    .is_some_and(|rest| rest.starts_with('/'));
            turn && under
        })
    }
}

/// What the run saw besides the history.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    /// Who was cut off when.
    pub cut_offs: Vec<CutOff>,
    /// What operators did.
    pub actions: Vec<Action>,
    /// Whether the server's lines name waiting contenders
    /// ([`crate::server::Server::line_shows_waiters`]).
    pub lines_show_waiters: bool,
}

fn ns(d: Duration) -> u128 {
    d.as_nanos()
}

fn key_of(line: &Line) -> &str {
    line.detail.split(' ').next().unwrap_or("")
}

/// Every key of the workload and its limit (the quiet keys whether a schedule has them or not:
/// one it does not has no lines for them).
pub fn keys() -> Vec<(&'static str, usize)> {
    let quiet = QUIET.iter().map(|key| (*key, 1));
    [
        (LEADER, 1),
        (CRON, 1),
        (SEMAPHORE, SEMAPHORE_LIMIT as usize),
    ]
    .into_iter()
    .chain(quiet)
    .collect()
}

/// The safety violations of `history`.
pub fn safety(history: &History, seen: &Seen) -> Vec<String> {
    let mut broken = Vec::new();
    for (key, limit) in keys() {
        let lines: Vec<Line> = (history.lines().iter())
            .filter(|l| l.kind == Kind::Write && key_of(l) == key)
            .cloned()
            .collect();
        let spans = History::from_lines(lines).spans();
        for (at, open) in over_limit(&spans, limit) {
            let Some(newest) = newest_granted(&open) else {
                continue;
            };
            let asked = asked_since(history, newest, key);
            let excused = (open.iter())
                .filter(|s| excused(s, newest.first, seen) || newcomer(s, newest, asked, key, seen))
                .count();
            if open.len() - excused > limit {
                let told: Vec<String> = (open.iter())
                    .map(|s| format!("pid {} {} wrote {}..{} ns", s.pid, s.seq, s.first, s.last))
                    .collect();
                broken.push(format!(
                    "safety: {} holders of {key} (limit {limit}) wrote at {:.3} s: {}\n{}",
                    open.len(),
                    at as f64 / 1e9,
                    told.join("; "),
                    history.around(at, 12)
                ));
            }
        }
    }
    broken
}

/// The holder of `open` the server granted last: of holders of one key, the greatest sequencer
/// (a grant whose answer reached its holder late may first write after its successor did: seed
/// 9771 of etcd, read at the head of the line 1 ms before an operator deleted its key, first
/// writing 19 ms after a newcomer took the emptied line); otherwise the last to begin writing.
fn newest_granted(open: &[Span]) -> Option<&Span> {
    let seqs: Option<Vec<Sequencer>> = open.iter().map(|s| s.seq.parse().ok()).collect();
    match seqs {
        Some(seqs) if seqs.windows(2).all(|w| w[0].key() == w[1].key()) => (open.iter())
            .zip(&seqs)
            .max_by_key(|(s, seq)| (seq.order(), s.first))
            .map(|(s, _)| s),
        _ => open.iter().max_by_key(|s| s.first),
    }
}

/// Each instant at which more than `limit` spans were open, with the spans open then (the first
/// such instant of each stretch).
fn over_limit(spans: &[Span], limit: usize) -> Vec<(u128, Vec<Span>)> {
    let mut events: Vec<(u128, i8, usize)> = Vec::new();
    for (i, s) in spans.iter().enumerate() {
        events.push((s.first, 1, i));
        events.push((s.last, -1, i));
    }
    // A span that ends at an instant another begins does not overlap it.
    events.sort_by_key(|&(t, delta, i)| (t, delta, i));
    let mut open: Vec<usize> = Vec::new();
    let mut found = Vec::new();
    let mut over = false;
    for (t, delta, i) in events {
        if delta > 0 {
            open.push(i);
            if open.len() > limit && !over {
                found.push((t, open.iter().map(|&j| spans[j].clone()).collect()));
                over = true;
            }
            // A single write opens and closes at its instant (its end sorted before it).
            if spans[i].first == spans[i].last {
                open.retain(|&j| j != i);
                over = open.len() > limit;
            }
        } else if spans[i].first == spans[i].last {
            continue;
        } else {
            open.retain(|&j| j != i);
            over = open.len() > limit;
        }
    }
    found
}

/// Whether span `s`, open when the newest of the holders then began at `newest`, is the
/// documented exception: an operator took its lease before `newest` while it was cut off, or
/// within [`NOTICE`] of the cut-off's end (its connections and watches are still being opened
/// again then: seed 422 of Consul, a key deleted 50 ms after the server came back, heard of
/// 660 ms later), and it stopped within [`NOTICE`] of that cut-off's end. `s` may be the newest
/// itself: a process frozen while its grant was on its way, its lease deleted meanwhile, writes
/// first on the stale grant when it resumes (seed 1703 of etcd).
fn excused(s: &Span, newest: u128, seen: &Seen) -> bool {
    seen.actions
        .iter()
        .filter(|a| a.at <= newest && a.took_lease(&s.seq))
        .any(|a| {
            seen.cut_offs.iter().any(|c| {
                c.pid.is_none_or(|pid| pid == s.pid)
                    && c.from <= s.last
                    && c.to + ns(NOTICE) >= a.at
                    && s.last <= c.to + ns(NOTICE)
            })
        })
}

/// When the acquire that gave `span` its lease began: its process's last `waiting` line for
/// `key` before its first write; `None` where none is written (a campaign's attempts).
fn asked_since(history: &History, span: &Span, key: &str) -> Option<u128> {
    (history.of_pid(span.pid))
        .filter(|l| l.kind == Kind::Waiting && key_of(l) == key && l.t <= span.first)
        .map(|l| l.t)
        .last()
}

/// Whether span `s` overlaps a newer holder, `newest`, that was not in line for `key` when an
/// operator took `s`'s lease, while `s` stopped within [`NOTICE`] of the action: a contender
/// that joins after the holder's key went cannot see that it went (the key is simply free), so
/// it does not settle, and only fencing covers the old holder's last milliseconds. Our
/// contenders in line at the moment settle, and the checks excuse nothing for them. In line:
/// its contender key among the server's line before the action (etcd), or, where the lines name
/// only holders (Consul), its acquire begun [`NEWCOMER_WINDOW`] or more before the action
/// (`asked`; seed 2246 of Consul: begun 5 ms before, its first read after).
fn newcomer(s: &Span, newest: &Span, asked: Option<u128>, key: &str, seen: &Seen) -> bool {
    let Ok(seq) = newest.seq.parse::<Sequencer>() else {
        return false;
    };
    // An etcd contender key names its lease, which every acquire of the process reuses: its
    // create revision tells one turn from another.
    let contender = format!("{key}/{}", seq.holder());
    (seen.actions.iter())
        .filter(|a| a.took_lease(&s.seq) && s.last <= a.at + ns(NOTICE))
        .any(|a| {
            if seen.lines_show_waiters {
                !(a.lined.iter()).any(|(k, index)| *k == contender && *index == seq.index())
            } else {
                asked.is_some_and(|asked| asked + ns(NEWCOMER_WINDOW) >= a.at)
            }
        })
}

/// The holders of each leader key, in the order they first wrote, must carry rising sequencers.
///
/// But for the documented exception (see [`safety`]): a holder whose lease an operator took
/// while it was cut off may write first only after its successor did, on a grant that reached
/// it late; fencing refuses those writes, as the sequencer is older (seed 1233 of etcd: a grant
/// on its way over a link 400 ms slow, its key deleted by an armed action meanwhile), or, cut
/// off or not, on a grant whose answer was on its way when the action came, within [`NOTICE`]
/// of it (seed 9771 of etcd: 37 ms).
pub fn sequencers_rise(history: &History, seen: &Seen) -> Vec<String> {
    let mut by_key: BTreeMap<String, Vec<(u128, Sequencer)>> = BTreeMap::new();
    let stale_grant = |s: &Span| {
        (seen.actions.iter())
            .any(|a| a.at <= s.first && s.first <= a.at + ns(NOTICE) && a.took_lease(&s.seq))
    };
    for span in
        (history.spans().into_iter()).filter(|s| !excused(s, s.first, seen) && !stale_grant(s))
    {
        if let Ok(seq) = span.seq.parse::<Sequencer>() {
            by_key
                .entry(seq.key().to_owned())
                .or_default()
                .push((span.first, seq));
        }
    }
    let mut broken = Vec::new();
    for (key, mut holders) in by_key {
        holders.sort_by_key(|(first, _)| *first);
        for pair in holders.windows(2) {
            if pair[1].1.order() <= pair[0].1.order() {
                broken.push(format!(
                    "sequencer: {key}: {} first wrote at {:.3} s after {}, which is not older",
                    pair[1].1,
                    pair[1].0 as f64 / 1e9,
                    pair[0].1
                ));
            }
        }
    }
    broken
}

/// Every acquire answered within its bound and the slack, unless its process was frozen while it
/// waited (or was killed before it answered).
pub fn acquires_within_bounds(history: &History, seen: &Seen) -> Vec<String> {
    let mut broken = Vec::new();
    let mut waiting: BTreeMap<(u32, String), (u128, Duration)> = BTreeMap::new();
    for line in history.lines() {
        let key = key_of(line).to_owned();
        match &line.kind {
            Kind::Waiting => {
                let bound = (line.detail.split("bound_ms=").nth(1))
                    .and_then(|ms| ms.parse().ok())
                    .map_or(Duration::ZERO, Duration::from_millis);
                waiting.insert((line.pid, key), (line.t, bound));
            }
            Kind::Acquired | Kind::Other(_) => {
                let Some((started, bound)) = waiting.remove(&(line.pid, key.clone())) else {
                    continue;
                };
                let took = line.t - started;
                let frozen = seen.cut_offs.iter().any(|c| {
                    c.frozen && c.pid == Some(line.pid) && c.from <= line.t && c.to >= started
                });
                let allowed = if bound.is_zero() {
                    ONE_ATTEMPT
                } else {
                    bound + ACQUIRE_SLACK
                };
                if took > ns(allowed) && !frozen {
                    broken.push(format!(
                        "acquire: pid {} waited {:.3} s for {key} (bound {bound:?}) at {:.3} s: {} {}",
                        line.pid,
                        took as f64 / 1e9,
                        line.t as f64 / 1e9,
                        line.kind,
                        line.detail
                    ));
                }
            }
            _ => {}
        }
    }
    broken
}
