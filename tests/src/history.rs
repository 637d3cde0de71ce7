//! Histories that `lease-worker` processes append to, and the verdicts judged from them.
//!
//! Each worker appends one line per event to its own file, with a single `write` on a file opened
//! with `O_APPEND`:
//!
//! ```text
//! <wall_clock_ns> <pid> <event> <sequencer-text> [detail…]
//! ```
//!
//! Events: `acquired`, `write` (one unit of guarded work), `lost <reason…>` (the lease was lost and
//! the work dropped), `released ok` / `released err <error>` (what `Lease::release` answered),
//! `waiting` (an acquire began), `exit` (the process is about to leave `main`) and `panic <message>
//! at <location> (thread <name>)` (written by the hook of [`crate::panics`]). The sequencer is
//! `-` where there is none. Times are wall-clock nanoseconds since the epoch, so the files of every
//! process on one machine merge into one timeline.
//!
//! A worker takes the time just before it writes the line; a `write` line therefore marks an
//! instant at which the work really ran (as late as the timestamp, or at most one write-syscall
//! later). The verdicts only use `write` lines:
//!
//! - [`History::max_concurrent_writers`]: each sequencer's writes, first to last, form an
//!   interval; the most intervals open at one instant.
//! - [`History::stale_writes`]: a write by `S` after another sequencer of the same slot began to
//!   write (S's first write < S'.first < t).
//! - [`History::stale_writes_shared`]: the same for the `limit` shared slots of a Consul
//!   semaphore, whose holders have no slot number.
//! - [`History::handoff_gaps`]: from one sequencer's last write to the next one's first.
//!
//! [`Recorder`] is the writing side, which the worker binaries append with.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

pub use lease_sim::history::*;

/// A worker's history file, appended to: one line per event, each written with one `write` on
/// an `O_APPEND` file. Clones append to the same file.
#[derive(Clone, Debug)]
pub struct Recorder {
    file: Arc<File>,
    pid: u32,
}

impl Recorder {
    /// Opens (creating it if needed) the history at `path`, for this process.
    pub fn open(path: &Path) -> std::io::Result<Recorder> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Recorder {
            file: Arc::new(file),
            pid: std::process::id(),
        })
    }

    /// Appends `<ns> <pid> <event> <seq> [detail]`; the time is taken just before the write.
    /// Whitespace in `seq` becomes `_` and newlines in `detail` spaces, so the line parses back.
    /// Panics if the line cannot be written.
    pub fn log(&self, event: &str, seq: &str, detail: &str) {
        self.try_log(event, seq, detail)
            .unwrap_or_else(|e| panic!("cannot append to the history: {e}"));
    }

    /// [`log`](Recorder::log), returning the error instead of panicking (for the panic hook).
    pub fn try_log(&self, event: &str, seq: &str, detail: &str) -> std::io::Result<()> {
        let seq = if seq.is_empty() { "-" } else { seq };
        let seq: String = seq
            .chars()
            .map(|c| if c.is_whitespace() { '_' } else { c })
            .collect();
        let detail: String = detail
            .chars()
            .map(|c| if c == '\n' { ' ' } else { c })
            .collect();
        let ns = crate::overlap::now_ns();
        let mut line = format!("{ns} {} {event} {seq}", self.pid);
        if !detail.is_empty() {
            line.push(' ');
            line.push_str(&detail);
        }
        line.push('\n');
        // One write(2) per line: with O_APPEND the line lands whole, after every earlier one.
        let written = (&*self.file).write(line.as_bytes())?;
        if written == line.len() {
            Ok(())
        } else {
            Err(std::io::Error::other("short write to the history"))
        }
    }
}

/// The p50 and p99 of the hand-off gaps, in ms.
pub fn gap_percentiles(handoffs: &[Handoff]) -> (f64, f64) {
    let gaps: Vec<f64> = handoffs.iter().map(|h| h.gap_ms).collect();
    (
        crate::stats::percentile(&gaps, 50.0),
        crate::stats::percentile(&gaps, 99.0),
    )
}
