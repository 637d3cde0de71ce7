//! An example lease backend for backend authors: leases on one host, kept as lock files under a
//! directory, written only against `lease_core`'s public backend contract
//! ([`lease_core::backend`]) and held to the public conformance suite (`lease-conformance`).
//!
//! ```text
//! cargo test -p lease-file-lock     # its unit tests and the conformance suite
//! ```
//!
//! It is small on purpose; read it in this order:
//!
//! - [`FileLock`]'s [`Backend`] impl: `acquire` validates the spec, tries to take a lock file,
//!   and polls until the spec's [`Wait`](lease_core::Wait) runs out; a taken file becomes a
//!   [`Lease`] through [`Keepers::start`]. `check_sequencer` reads the file a sequencer names;
//!   `observe_leader` polls a leader's file; `shutdown` is [`Keepers::shutdown`].
//! - `hold.rs`: the [`Hold`](lease_core::backend::Hold) that the holder task drives: watch the
//!   file, delete it on release, delete it without a runtime when the process ends first.
//! - `lock_file.rs`: the files themselves.
//!
//! # Layout
//!
//! Under the directory given to [`FileLock::new`]:
//!
//! - a leader key `k` is the lock file `k.lock`, created with `create_new` and holding its
//!   holder's record (holder, index, advertised value); `k.index` numbers its acquisitions;
//! - a semaphore `p` of limit N is the directory `p/`: `.limit` holds N (contenders asking for
//!   another limit get [`Error::LimitMismatch`]), and `.slot-0.lock` … `.slot-<N-1>.lock` are N
//!   lock files like a leader's. A holder's sequencer key is `p/<holder>`.
//!
//! Key parts may not start with `.`, so a key never names one of these files, or leaves the
//! directory.
//!
//! # One kind of lock per name
//!
//! A leader key `k` and a semaphore `k` would use different files (`k.lock`, `k/.slot-*.lock`),
//! so each looks for the other: a leader lock is refused while the semaphore `k` has a slot file,
//! a semaphore while `k.lock` exists, with [`Error::FlagsConflict`] at once, whatever the spec's
//! [`Wait`](lease_core::Wait). It looks before taking its file (one directory listing for a
//! leader lock, one read for a semaphore) and again after, giving the file back if the other kind
//! turned up meanwhile: of two first acquisitions of both kinds at the same moment, one or both
//! are refused, never both granted. A name is the other kind's only while that kind holds a lock
//! file: a semaphore's `.limit` stays, but is no lock.
//!
//! # Built as the backend crates are
//!
//! It uses only lease-core's public backend contract, exactly as lease-consul, lease-etcd and
//! lease-amqp do: [`Keepers`] and a [`Hold`](lease_core::backend::Hold) for each lease,
//! [`instrument_acquire`] around `acquire` (the `lease.acquire` span and the acquisition metrics),
//! and a kind of its own, `file` ([`BackendKind::custom`]), which its sequencers and metric labels
//! carry: `file:3:<holder>:reports/leader`.
//!
//! # What it does not do
//!
//! - **Sessions, TTLs, lock-delay.** A lease lives as long as its file. A holder that dies
//!   without giving it back (a crash, `SIGKILL`) leaves the file behind, and the lease stays
//!   held until an operator deletes it ([`FileLock::delete_key`]). A process that ends normally
//!   gives its leases back, even at the end of `main`.
//! - **More than one host.** Lock files on a network file system are only as exclusive as its
//!   `O_EXCL`.
//!
//! # Example
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lease_core::Error> {
//! use lease_core::{Backend, LeaseSpec, Wait};
//! use lease_file_lock::FileLock;
//!
//! let dir = std::env::temp_dir().join(format!("lease-file-lock-doc-{}", std::process::id()));
//! let files = FileLock::new(&dir);
//! let lease = files.acquire(&LeaseSpec::leader("reports/leader")).await?;
//! assert!(dir.join("reports/leader.lock").exists());
//!
//! let busy = files.acquire(&LeaseSpec::leader("reports/leader").wait(Wait::Never)).await;
//! assert!(busy.unwrap_err().is_busy());
//!
//! lease.release().await?;
//! assert!(!dir.join("reports/leader.lock").exists());
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok(())
//! # }
//! ```

mod hold;
mod lock_file;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lease_core::backend::{Fence, Keepers, instrument_acquire};
use lease_core::leader::{Leader, LeaderObserver};
use lease_core::{
    Backend, BackendKind, BoxFuture, Error, Lease, LeaseSpec, LostReason, Sequencer, Target,
};
use tokio::sync::watch;
use tokio::time::Instant;

use hold::FileHold;
use lock_file::{Lock, Record, io_error};

/// The kind its sequencers and metrics name: `file`.
static KIND: LazyLock<BackendKind> = LazyLock::new(|| BackendKind::custom("file"));

/// Leases kept as lock files under one directory. Clones share their holder tasks.
#[derive(Clone, Debug)]
pub struct FileLock {
    dir: Arc<Path>,
    poll_every: Duration,
    keepers: Keepers,
}

impl FileLock {
    /// How often a holder, a waiting contender and an observer look at a file, by default.
    pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(25);

    /// Leases under `dir` (created when first needed).
    pub fn new(dir: impl Into<PathBuf>) -> FileLock {
        // Known from here on, so that this process parses `file:` sequencers back.
        LazyLock::force(&KIND);
        FileLock {
            dir: dir.into().into(),
            poll_every: Self::DEFAULT_POLL_INTERVAL,
            keepers: Keepers::new(),
        }
    }

    /// Looks at files every `every` instead: a loss is noticed, and a free lock taken, within
    /// about that long.
    #[must_use]
    pub fn poll_every(mut self, every: Duration) -> FileLock {
        self.poll_every = every;
        self
    }

    /// The directory the lock files are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Operator action: deletes the lock file of `key` (a leader key, or a semaphore holder's
    /// key `<prefix>/<holder>`), taking the lease from its holder, which loses it with
    /// [`LostReason::KeyDeleted`]. Whether there was one.
    pub fn delete_key(&self, key: &str) -> Result<bool, Error> {
        check_key(key)?;
        let Some(path) = self.lock_file_of(key)? else {
            return Ok(false);
        };
        lock_file::remove(&path).map_err(|error| io_error("delete", &path, &error))
    }

    async fn acquire_inner(&self, spec: &LeaseSpec) -> Result<Lease, Error> {
        spec.validate()?;
        check_key(spec.key())?;
        let started = Instant::now();
        let deadline = spec.wait_policy().deadline(started);
        let holder = new_holder();
        loop {
            // Nothing awaits between taking a lock file and handing it to `Keepers::start`, so a
            // dropped acquire never owns a file: cancel safety needs no clean-up here.
            if let Some(lease) = self.try_take(spec, &holder)? {
                return Ok(lease);
            }
            let now = Instant::now();
            let pause = match deadline {
                Some(deadline) if now >= deadline => {
                    return Err(Error::Busy {
                        key: spec.key().to_owned(),
                        waited: now - started,
                    });
                }
                Some(deadline) => self.poll_every.min(deadline - now),
                None => self.poll_every,
            };
            tokio::time::sleep(pause).await;
        }
    }

    /// One attempt: the lease, or `None` while it is held elsewhere.
    ///
    /// A lock of the other kind on the name is refused (see "One kind of lock per name"), looked
    /// for before taking a file, so a plain refusal leaves nothing behind, and again after, so two
    /// first acquisitions of both kinds never both hold.
    fn try_take(&self, spec: &LeaseSpec, holder: &str) -> Result<Option<Lease>, Error> {
        let value = spec.advertised_value();
        match spec.target() {
            Target::Leader { key } => {
                self.refuse_if_a_semaphore_holds(key)?;
                let path = self.leader_file(key);
                let taken = lock_file::take(&path, &path.with_extension("index"), holder, value)
                    .map_err(|error| io_error("create", &path, &error))?;
                let Some(record) = taken else {
                    return Ok(None);
                };
                if let Err(refused) = self.refuse_if_a_semaphore_holds(key) {
                    give_back(&path, &record);
                    return Err(refused);
                }
                Ok(Some(self.start(key.clone(), path, record)))
            }
            Target::Semaphore { prefix, limit } => {
                self.refuse_if_a_leader_holds(prefix)?;
                if !self.agree_on_limit(prefix, *limit)? {
                    return Ok(None);
                }
                for slot in 0..*limit {
                    let path = self.slot_file(prefix, slot);
                    let taken =
                        lock_file::take(&path, &path.with_extension("index"), holder, value)
                            .map_err(|error| io_error("create", &path, &error))?;
                    if let Some(record) = taken {
                        if let Err(refused) = self.refuse_if_a_leader_holds(prefix) {
                            give_back(&path, &record);
                            return Err(refused);
                        }
                        return Ok(Some(self.start(format!("{prefix}/{holder}"), path, record)));
                    }
                }
                Ok(None)
            }
            other => Err(other.unsupported("file lock")),
        }
    }

    /// Hands a taken lock file to a holder task: the only way to build a [`Lease`].
    fn start(&self, key: String, path: PathBuf, record: Record) -> Lease {
        let sequencer = Sequencer::new(*KIND, key, record.index, &record.holder);
        let hold = FileHold {
            path,
            record: record.encode(),
            poll_every: self.poll_every,
        };
        // A lock file cannot be taken away behind our back without the watch seeing it, and
        // does not expire: nothing to self-fence against.
        let fence = Fence::unbounded();
        self.keepers
            .start(sequencer, fence, Arc::new(self.clone()), hold)
    }

    /// Refuses a leader lock on `key` while the semaphore `key` has a slot file (held, or being
    /// taken): one directory listing. Its `.limit`, which outlives the holders, is no lock.
    fn refuse_if_a_semaphore_holds(&self, key: &str) -> Result<(), Error> {
        let dir = self.dir.join(key);
        match lock_file::any_slot_file(&dir) {
            Ok(false) => Ok(()),
            Ok(true) => Err(Error::semaphore_in_the_way(key)),
            Err(error) => Err(io_error("list", &dir, &error)),
        }
    }

    /// Refuses a semaphore on `prefix` while the leader key `prefix` has its lock file (held, or
    /// being taken): one read.
    fn refuse_if_a_leader_holds(&self, prefix: &str) -> Result<(), Error> {
        let path = self.leader_file(prefix);
        match lock_file::look(&path) {
            Ok(Lock::Free) => Ok(()),
            Ok(Lock::Held(_) | Lock::BeingWritten) => Err(Error::leader_lock_in_the_way(prefix)),
            Err(error) => Err(io_error("read", &path, &error)),
        }
    }

    /// Creates the semaphore's `.limit`, or checks that it says `limit`. `false` while another
    /// contender is still writing it.
    fn agree_on_limit(&self, prefix: &str, limit: u32) -> Result<bool, Error> {
        let path = self.dir.join(prefix).join(".limit");
        let created = lock_file::create_with(&path, &limit.to_string())
            .map_err(|error| io_error("create", &path, &error))?;
        if created {
            return Ok(true);
        }
        let stored =
            std::fs::read_to_string(&path).map_err(|error| io_error("read", &path, &error))?;
        match stored.parse::<u32>() {
            Ok(stored) if stored == limit => Ok(true),
            Ok(stored) => Err(Error::LimitMismatch {
                key: prefix.to_owned(),
                stored: u64::from(stored),
                requested: u64::from(limit),
            }),
            Err(_) => Ok(false),
        }
    }

    fn leader_file(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.lock"))
    }

    fn slot_file(&self, prefix: &str, slot: u32) -> PathBuf {
        self.dir.join(prefix).join(format!(".slot-{slot}.lock"))
    }

    /// The lock file that holds `key`: a leader key's own, or, for a semaphore holder's key
    /// `<prefix>/<holder>`, the slot whose record names that holder. `None` if there is none.
    fn lock_file_of(&self, key: &str) -> Result<Option<PathBuf>, Error> {
        let leader = self.leader_file(key);
        if leader.exists() {
            return Ok(Some(leader));
        }
        let Some((prefix, holder)) = key.rsplit_once('/') else {
            return Ok(None);
        };
        let limit_file = self.dir.join(prefix).join(".limit");
        let Ok(limit) = std::fs::read_to_string(&limit_file) else {
            return Ok(None);
        };
        for slot in 0..limit.parse::<u32>().unwrap_or(0) {
            let path = self.slot_file(prefix, slot);
            match lock_file::look(&path) {
                Ok(Lock::Held(record)) if record.holder == holder => return Ok(Some(path)),
                Ok(_) => {}
                Err(error) => return Err(io_error("read", &path, &error)),
            }
        }
        Ok(None)
    }

    fn check(&self, sequencer: &Sequencer) -> Result<(), Error> {
        check_key(sequencer.key())?;
        let current = match self.lock_file_of(sequencer.key())? {
            Some(path) => {
                lock_file::look(&path).map_err(|error| io_error("read", &path, &error))?
            }
            None => Lock::Free,
        };
        match current {
            Lock::Held(record)
                if record.holder == sequencer.holder() && record.index == sequencer.index() =>
            {
                Ok(())
            }
            Lock::Held(record) => Err(Error::Lost(LostReason::KeyTaken {
                lock_index: record.index,
                session: record.holder,
            })),
            Lock::Free | Lock::BeingWritten => Err(Error::Lost(LostReason::KeyDeleted)),
        }
    }

    /// Polls the leader file of `key` until every observer is dropped.
    fn observe(&self, key: &str) -> Result<LeaderObserver, Error> {
        check_key(key)?;
        let path = self.leader_file(key);
        let leader_of = move |key: &str| match lock_file::look(&path) {
            Ok(Lock::Free) => Some(None),
            Ok(Lock::Held(record)) => Some(Some(Leader::new(
                Sequencer::new(*KIND, key, record.index, record.holder),
                record.value,
            ))),
            // Being written, or unreadable for now: no news.
            Ok(Lock::BeingWritten) | Err(_) => None,
        };
        let (tx, rx) = watch::channel(leader_of(key).flatten());
        let (owned_key, poll_every) = (key.to_owned(), self.poll_every);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = tx.closed() => return,
                    () = tokio::time::sleep(poll_every) => {}
                }
                if let Some(leader) = leader_of(&owned_key) {
                    tx.send_if_modified(|seen| {
                        let changed = *seen != leader;
                        *seen = leader;
                        changed
                    });
                }
            }
        });
        Ok(LeaderObserver::new(key, rx))
    }
}

impl Backend for FileLock {
    fn acquire<'a>(&'a self, spec: &'a LeaseSpec) -> BoxFuture<'a, Result<Lease, Error>> {
        instrument_acquire(*KIND, spec, self.acquire_inner(spec))
    }

    fn observe_leader<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<LeaderObserver, Error>> {
        Box::pin(std::future::ready(self.observe(key)))
    }

    fn check_sequencer<'a>(&'a self, sequencer: &'a Sequencer) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(std::future::ready(self.check(sequencer)))
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.keepers.shutdown())
    }
}

/// The key rule of [`LeaseSpec::validate`], plus this backend's own: no part starts with `.`, so
/// a key names neither `..` nor one of the files beside the locks. Sequencers and observed keys
/// come from elsewhere, so they are checked too before they name a file.
fn check_key(key: &str) -> Result<(), Error> {
    LeaseSpec::leader(key).validate()?;
    if key.split('/').any(|part| part.starts_with('.')) {
        return Err(Error::InvalidKey {
            key: key.to_owned(),
            reason: "a file-lock key's parts may not start with '.'",
        });
    }
    Ok(())
}

/// Gives back a lock file just taken, for a lock of another kind that turned out to hold the name.
/// A failure leaves the file for an operator, as a crash would: the refusal stands either way.
fn give_back(path: &Path, record: &Record) {
    let _ = lock_file::remove_if_held_by(path, &record.encode());
}

/// A name for one acquisition, unique across processes and runs: process id, start time, count.
fn new_holder() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    format!(
        "{}-{nanos:x}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_stay_inside_the_directory() {
        for key in [
            "../etc/passwd",
            "a/../../b",
            "a/.limit",
            ".hidden",
            "/abs",
            "a//b",
        ] {
            assert!(check_key(key).is_err(), "{key}");
        }
        assert!(check_key("service/leader").is_ok());
    }

    fn scratch(what: &str) -> PathBuf {
        std::env::temp_dir().join(format!("lease-file-lock-{what}-{}", new_holder()))
    }

    fn refused_for(
        answer: Result<Lease, Error>,
        at: &str,
        found: u64,
        expected: u64,
    ) -> Result<(), String> {
        match answer {
            Err(Error::FlagsConflict {
                key,
                found: f,
                expected: e,
            }) if key == at && f == found && e == expected => Ok(()),
            other => Err(format!("{other:?}")),
        }
    }

    #[tokio::test]
    async fn a_name_held_as_one_kind_of_lock_refuses_the_other_at_once() {
        let dir = scratch("kinds");
        let files = FileLock::new(&dir).poll_every(Duration::from_millis(10));
        let patient = lease_core::Wait::UpTo(Duration::from_secs(30));
        let (leader_flags, semaphore_flags) = (Error::LEADER_FLAGS, Error::SEMAPHORE_FLAGS);

        let leader = files.acquire(&LeaseSpec::leader("k")).await.unwrap();
        let started = Instant::now();
        let answer = files
            .acquire(&LeaseSpec::semaphore("k", 2).wait(patient))
            .await;
        refused_for(answer, "k", leader_flags, semaphore_flags).unwrap();
        assert!(started.elapsed() < Duration::from_secs(1), "waited");
        assert!(!dir.join("k").exists(), "a refused semaphore wrote");
        leader.release().await.unwrap();

        let slot = files.acquire(&LeaseSpec::semaphore("k", 2)).await.unwrap();
        let answer = files.acquire(&LeaseSpec::leader("k").wait(patient)).await;
        refused_for(answer, "k", semaphore_flags, leader_flags).unwrap();
        assert!(started.elapsed() < Duration::from_secs(1), "waited");
        assert!(
            !dir.join("k.lock").exists(),
            "a refused leader lock kept its file"
        );
        slot.release().await.unwrap();
        // The semaphore's `.limit` stays, but no slot is held: the name is free again.
        let leader = files
            .acquire(&LeaseSpec::leader("k").wait(lease_core::Wait::Never))
            .await
            .unwrap();
        leader.release().await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Both kinds asked for at the same moment on fresh names, from two threads, each holding
    /// what it got until both have answers: never both granted.
    #[test]
    fn both_kinds_at_once_are_never_both_granted() {
        let dir = scratch("kinds-race");
        let files = FileLock::new(&dir);
        for i in 0..50 {
            let name = format!("race/{i}");
            let (start, answered) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
            let granted = std::thread::scope(|scope| {
                let attempts =
                    [LeaseSpec::leader(&name), LeaseSpec::semaphore(&name, 2)].map(|spec| {
                        let (files, start, answered) = (&files, &start, &answered);
                        scope.spawn(move || {
                            let runtime = tokio::runtime::Builder::new_current_thread()
                                .enable_all()
                                .build()
                                .unwrap();
                            runtime.block_on(async {
                                start.wait();
                                let spec = spec.wait(lease_core::Wait::Never);
                                let answer = files.acquire(&spec).await;
                                answered.wait();
                                match answer {
                                    Ok(lease) => {
                                        lease.release().await.unwrap();
                                        true
                                    }
                                    Err(Error::FlagsConflict { .. }) => false,
                                    Err(other) => panic!("{other:?}"),
                                }
                            })
                        })
                    });
                attempts.map(|attempt| attempt.join().unwrap())
            });
            assert_ne!(granted, [true, true], "{name}: both kinds held it");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_lease_held_when_the_runtime_ends_is_given_back() {
        let dir = std::env::temp_dir().join(format!("lease-file-lock-end-{}", new_holder()));
        let files = FileLock::new(&dir);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let lease = runtime
            .block_on(files.acquire(&LeaseSpec::leader("jobs/leader")))
            .expect("a free lock");
        assert!(dir.join("jobs/leader.lock").exists());
        // The holder task is dropped unfinished, as at the end of `main`: `Hold::abandon` runs.
        drop(runtime);
        assert!(!dir.join("jobs/leader.lock").exists());
        drop(lease);
        std::fs::remove_dir_all(&dir).expect("the test directory");
    }
}
