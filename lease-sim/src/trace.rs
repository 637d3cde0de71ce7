//! The history of one run, as every simulated process writes it and the checks read it: lines in
//! the format of the process tests' histories (`lease_tests::history`), timed in nanoseconds of
//! simulated time since the run began, so the same verdicts judge both.
//!
//! Besides the processes' own lines (`waiting`, `acquired`, `write`, `lost`, `released`), the
//! simulation writes what it did (`fault`, `healed`, `operator`), so a history tells the whole run
//! and its hash tells one run from another.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

use lease_tests::history::{History, Kind, Line};
use tokio::time::Instant;

/// The process number the simulation's own lines carry.
pub const SIMULATION: u32 = u32::MAX;

/// One run's history. Clones append to the same one.
#[derive(Clone, Debug)]
pub struct Trace(Arc<Mutex<Inner>>);

#[derive(Debug)]
struct Inner {
    start: Instant,
    lines: Vec<Line>,
    /// The last write under each key (its first word of detail), ns.
    last_write: std::collections::BTreeMap<String, u128>,
}

impl Trace {
    /// An empty history whose times count from now.
    pub fn new() -> Trace {
        Trace(Arc::new(Mutex::new(Inner {
            start: Instant::now(),
            lines: Vec::new(),
            last_write: std::collections::BTreeMap::new(),
        })))
    }

    /// Appends a line for process `pid`, timed now.
    pub fn log(&self, pid: u32, kind: Kind, seq: &str, detail: impl Into<String>) {
        let mut inner = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let t = inner.start.elapsed().as_nanos();
        let detail = detail.into();
        if kind == Kind::Write {
            let key = detail.split(' ').next().unwrap_or("").to_owned();
            inner.last_write.insert(key, t);
        }
        inner.lines.push(Line {
            t,
            pid,
            kind,
            seq: if seq.is_empty() {
                "-".into()
            } else {
                seq.into()
            },
            detail,
        });
    }

    /// A line of the simulation's own (a fault, a heal, an operator's action).
    pub fn note(&self, kind: &str, detail: impl Into<String>) {
        self.log(SIMULATION, Kind::Other(kind.to_owned()), "-", detail);
    }

    /// When the last write under `key` was (ns since the start).
    pub fn last_write(&self, key: &str) -> Option<u128> {
        let inner = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        inner.last_write.get(key).copied()
    }

    /// Nanoseconds since the run began.
    pub fn now(&self) -> u128 {
        let inner = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        inner.start.elapsed().as_nanos()
    }

    /// The lines so far, as a history.
    pub fn history(&self) -> History {
        let inner = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        History::from_lines(inner.lines.clone())
    }

    /// A hash of every line: two runs of one seed must give the same.
    pub fn hash(&self) -> u64 {
        let inner = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let mut hasher = DefaultHasher::new();
        for line in &inner.lines {
            line.to_string().hash(&mut hasher);
        }
        hasher.finish()
    }
}

impl Default for Trace {
    fn default() -> Self {
        Trace::new()
    }
}
