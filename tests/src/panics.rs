//! Panic records: no panic in a test process goes unseen (issue 33).
//!
//! A panic in a background task (a lease's keeper, a watch) does not end the process: tokio
//! catches it, the task is gone, and the process runs on, with nothing but a line on stderr to
//! show for it. So every binary the tests start (`lease-worker`, `lease-fenced-writer`) calls
//! [`install`] first thing in `main`, and [`record_in`] once its history is open. From then on a
//! panic anywhere in the process, on any thread, leaves a record:
//!
//! - a `panic` line in its history (`<ns> <pid> panic - <message> at <file:line:col> (thread
//!   <name>)`, see [`crate::history`]), so the interleaving shows it among the other events;
//! - the same line appended to `<dir>/<pid>.panic`, where `dir` is [`DIR_ENV`] (every process a
//!   [`Run`](crate::workers::Run) starts gets its run's directory), so a panic before the history
//!   is open, or in a process whose history is `/dev/null`, is recorded too.
//!
//! The previous hook (the default one prints the message and location on stderr) runs after.
//! A record fails the run: the chaos judge counts each as a violation, and a `Run` dropped with
//! records it has not reported fails its test ([`read_dir`] reads them back).
//!
//! To test the mechanism, [`inject_at`] panics in a spawned task (the shape of the keeper's
//! panic) at a point named by the environment variable [`INJECT_ENV`].

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::history::{Kind, Line, Recorder};

/// The directory a process appends its panic records to (`<dir>/<pid>.panic`), if set.
pub const DIR_ENV: &str = "LEASE_TESTS_PANIC_DIR";
/// Test-only: the point at which [`inject_at`] panics (e.g. `acquired`).
pub const INJECT_ENV: &str = "LEASE_TESTS_PANIC_AT";

/// The history the hook writes to, once [`record_in`] was called.
static HISTORY: OnceLock<Mutex<Option<Recorder>>> = OnceLock::new();

fn history() -> &'static Mutex<Option<Recorder>> {
    HISTORY.get_or_init(|| Mutex::new(None))
}

/// Installs the panic hook that records every panic of this process (see the module docs). Call
/// it first thing in `main`; the hook that was installed before runs after it.
pub fn install() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = (payload.downcast_ref::<&str>().copied())
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(a non-string payload)");
        let at = info
            .location()
            .map_or_else(|| "an unknown place".to_owned(), ToString::to_string);
        let thread = std::thread::current();
        let detail = format!(
            "{message} at {at} (thread {})",
            thread.name().unwrap_or("unnamed")
        );
        record(&detail);
        previous(info);
    }));
}

/// Writes the record of a panic described by `detail` to the history and the panic directory.
/// Never panics itself (a panic in a panic hook aborts): a record that cannot be written is
/// skipped, and the previous hook's stderr line remains.
fn record(detail: &str) {
    // A poisoned lock still holds the recorder: a panic while it was held is what we record.
    let recorder = match history().lock() {
        Ok(guard) => guard.clone(),
        Err(poisoned) => poisoned.into_inner().clone(),
    };
    if let Some(recorder) = recorder {
        let _ = recorder.try_log("panic", "-", detail);
    }
    if let Some(dir) = std::env::var_os(DIR_ENV) {
        let line = Line {
            t: crate::overlap::now_ns(),
            pid: std::process::id(),
            kind: Kind::Panic,
            seq: "-".to_owned(),
            detail: detail.replace('\n', " "),
        };
        let path = PathBuf::from(dir).join(format!("{}.panic", std::process::id()));
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = file.write_all(format!("{line}\n").as_bytes());
        }
    }
}

/// From now on, panics are also recorded as `panic` lines of `history`.
pub fn record_in(recorder: &Recorder) {
    let mut slot = match history().lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    };
    *slot = Some(recorder.clone());
}

/// Test-only: if [`INJECT_ENV`] names `point`, panics in a spawned task, once per process, as
/// lease-core's keeper once did; the process runs on. Call it inside a tokio runtime.
pub fn inject_at(point: &str) {
    static DONE: AtomicBool = AtomicBool::new(false);
    if std::env::var(INJECT_ENV).is_ok_and(|p| p == point) && !DONE.swap(true, Ordering::SeqCst) {
        let point = point.to_owned();
        tokio::spawn(async move {
            panic!("injected panic at {point} ({INJECT_ENV})");
        });
    }
}

/// The panic records in `dir` (every `*.panic` file), in time order. A line that does not parse
/// is returned whole as the detail of a record, so nothing written there is lost.
pub fn read_dir(dir: &Path) -> Vec<Line> {
    let mut records = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return records;
    };
    for path in entries.filter_map(|e| e.ok().map(|e| e.path())) {
        if path.extension().is_none_or(|x| x != "panic") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for raw in text.lines().filter(|l| !l.trim().is_empty()) {
            records.push(Line::parse(raw).unwrap_or_else(|| Line {
                t: 0,
                pid: 0,
                kind: Kind::Panic,
                seq: "-".to_owned(),
                detail: format!("{}: {raw}", path.display()),
            }));
        }
    }
    records.sort_by_key(|l| l.t);
    records
}

/// One paragraph naming each record: its process, its message and location.
pub fn describe(records: &[Line]) -> String {
    records
        .iter()
        .map(|r| format!("pid {} panicked: {}", r.pid, r.detail))
        .collect::<Vec<_>>()
        .join("\n")
}
