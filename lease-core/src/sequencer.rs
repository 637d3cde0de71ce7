//! The fencing token: which acquisition of which lease a holder is acting under.
//!
//! A [`Sequencer`] names one acquisition of a lease. Consul's sessions make the tuple
//! `(Key, LockIndex, Session)` unique per acquisition: the LockIndex rises on every acquire, and a
//! released or invalidated lock no longer carries the session. Downstream systems that receive work
//! from a holder compare the sequencer they were handed with the current one and refuse stale work.
//!
//! The text form travels in HTTP headers and job payloads and parses back to an equal value:
//!
//! ```text
//! <backend>:[<generation>.]<index>:<holder>:<key>
//! consul:7:4ca8e74b-6350-7587-addf-a18084928f3c:service/leader
//! consul:41.7:4ca8e74b-6350-7587-addf-a18084928f3c:service/leader
//! ```
//!
//! The optional generation orders sequencers before the index does (see
//! [`Sequencer::generation`]): Consul's is the key's `CreateIndex`, because a key deleted and
//! re-created restarts its LockIndex at 1. A text without one (every other backend's, and
//! Consul's written before sequencers had one) has generation 0, so it orders below any text with one.
//!
//! `holder` and `key` are percent-encoded: every byte outside the visible ASCII range `!`..=`~`, and
//! `%` and `:` themselves, is written as `%XX`. The whole text is therefore a valid HTTP header value.

use std::fmt;
use std::str::FromStr;

/// Which kind of backend issued a [`Sequencer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackendKind {
    /// Consul sessions and KV: `key` is the KV key, `index` its LockIndex, `holder` the session ID,
    /// and (a leader key's) `generation` the key's `CreateIndex`, which rises when the key is
    /// deleted and re-created while the LockIndex restarts at 1.
    Consul,
    /// The RabbitMQ persistent semaphore: `key` is the semaphore name, `index` the slot number,
    /// `holder` the exclusive holder queue followed by `#` and a per-acquisition nonce.
    Amqp,
    /// The in-process memory backend, with Consul's semantics.
    Memory,
    /// etcd: `key` is the election name (a leader) or the holder's own key `<prefix>/<lease>` (a
    /// semaphore), `index` the create revision of the holder's key (rises with every write to the
    /// cluster, whatever the key), `holder` the etcd lease ID in hex, as `etcdctl elect` names
    /// its keys, followed by `_<n>` for the second and later contenders of one process on one name
    /// and lease.
    Etcd,
    /// PostgreSQL (lease-postgres): `key` is the leader key, or the holder's own key
    /// `<prefix>/<holder>` (a semaphore), `index` a value of the database's lease sequence, drawn
    /// for every acquisition (rises across every key of the database), `holder` the
    /// acquisition's random ID.
    Postgres,
    /// Redis or Valkey (lease-redis): `key` is the leader key, or the holder's own key
    /// `<prefix>/<holder>` (a semaphore), `index` the name's fencing token (drawn by the acquire
    /// script: above the name's previous token and at least the server's clock in microseconds,
    /// so it rises with every acquisition of the name), `holder` the acquisition's random ID.
    Redis,
    /// A backend outside this repository: see [`BackendKind::custom`].
    Custom(CustomKind),
}

/// The name of a backend outside this repository, from [`BackendKind::custom`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CustomKind(&'static str);

impl CustomKind {
    /// The name, as in the text form of its sequencers and in the metrics' `backend` label.
    pub fn name(self) -> &'static str {
        self.0
    }
}

/// The custom names this process knows, so that their sequencers parse back.
static CUSTOM: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());

impl BackendKind {
    const BUILT_IN: [BackendKind; 6] = [
        BackendKind::Consul,
        BackendKind::Amqp,
        BackendKind::Memory,
        BackendKind::Etcd,
        BackendKind::Postgres,
        BackendKind::Redis,
    ];

    /// The kind of a backend of your own, named `name`: what its sequencers and metrics say.
    /// It also makes the name known to this process, so that [`Sequencer`]s of this kind parse
    /// back from their text (a process that only checks them, with the backend, knows the name
    /// once the backend is built). Call it where the backend is built, or keep it in a `static`
    /// initialized once.
    ///
    /// # Panics
    ///
    /// If `name` is empty, longer than 32 bytes, has a byte outside `a`–`z`, `0`–`9`, `-` and
    /// `_`, or is the name of a built-in kind (`consul`, `amqp`, `memory`, `etcd`, `postgres`, `redis`): a programming
    /// error, found the first time the code runs.
    ///
    /// ```
    /// use lease_core::{BackendKind, Sequencer};
    ///
    /// let kind = BackendKind::custom("file");
    /// let seq = Sequencer::new(kind, "jobs/nightly", 3, "host-a:4242");
    /// assert_eq!(seq.to_string(), "file:3:host-a%3A4242:jobs/nightly");
    /// assert_eq!(seq.to_string().parse::<Sequencer>().unwrap().backend(), kind);
    /// ```
    pub fn custom(name: &'static str) -> BackendKind {
        let valid = (1..=32).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        assert!(
            valid,
            "BackendKind::custom({name:?}): a name is 1 to 32 of a-z, 0-9, '-' and '_'"
        );
        assert!(
            !Self::BUILT_IN.iter().any(|kind| kind.as_str() == name),
            "BackendKind::custom({name:?}): that is a built-in kind; use BackendKind's variant"
        );
        let mut known = CUSTOM
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !known.contains(&name) {
            known.push(name);
        }
        BackendKind::Custom(CustomKind(name))
    }

    /// The name used in the text form.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Consul => "consul",
            BackendKind::Amqp => "amqp",
            BackendKind::Memory => "memory",
            BackendKind::Etcd => "etcd",
            BackendKind::Postgres => "postgres",
            BackendKind::Redis => "redis",
            BackendKind::Custom(custom) => custom.name(),
        }
    }

    fn parse(s: &str) -> Option<Self> {
        if let Some(kind) = Self::BUILT_IN.into_iter().find(|kind| kind.as_str() == s) {
            return Some(kind);
        }
        let known = CUSTOM
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (known.iter().find(|name| **name == s)).map(|name| BackendKind::Custom(CustomKind(name)))
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The fencing token of one acquisition: `(key, generation, index, holder)` and the backend that
/// issued it.
///
/// Two sequencers are equal only if they name the same acquisition. For Consul this is
/// Consul's `(Key, LockIndex, Session)`, with the key's `CreateIndex` as its generation.
/// Acquisitions of one key are ordered by [`order`](Sequencer::order): the generation, then the
/// index.
///
/// # Examples
///
/// ```
/// use lease_core::{BackendKind, Sequencer};
///
/// let seq = Sequencer::new(BackendKind::Consul, "service/leader", 7, "4ca8e74b-6350-7587-addf-a18084928f3c");
/// let text = seq.to_string();
/// assert_eq!(text, "consul:7:4ca8e74b-6350-7587-addf-a18084928f3c:service/leader");
/// assert_eq!(text.parse::<Sequencer>().unwrap(), seq);
///
/// // Consul's leader keys carry the key's CreateIndex: a re-created key is newer.
/// let recreated = Sequencer::new(BackendKind::Consul, "service/leader", 1, "9d0c").with_generation(88);
/// assert_eq!(recreated.to_string(), "consul:88.1:9d0c:service/leader");
/// assert!(recreated.order() > seq.order());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Sequencer {
    backend: BackendKind,
    key: String,
    generation: u64,
    index: u64,
    holder: String,
}

impl Sequencer {
    /// A sequencer from its parts.
    pub fn new(
        backend: BackendKind,
        key: impl Into<String>,
        index: u64,
        holder: impl Into<String>,
    ) -> Self {
        Sequencer {
            backend,
            key: key.into(),
            generation: 0,
            index,
            holder: holder.into(),
        }
    }

    /// This sequencer with `generation`: what orders the acquisitions of the key before the index
    /// does ([`order`](Sequencer::order)). Consul's is the key's `CreateIndex`. A backend whose
    /// index alone rises with every acquisition of a key leaves it 0.
    #[must_use]
    pub fn with_generation(mut self, generation: u64) -> Self {
        self.generation = generation;
        self
    }

    /// The backend that issued this sequencer.
    pub fn backend(&self) -> BackendKind {
        self.backend
    }

    /// The lease's key: Consul's KV key (for a semaphore, the holder's contender key), or the
    /// AMQP semaphore's name.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Consul's LockIndex (rises with every acquisition of the key while the key lives), or the
    /// AMQP slot number.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// What orders acquisitions of the key before the index: Consul's key `CreateIndex` (a raft
    /// index, higher every time the key is re-created), 0 for every other backend and for a
    /// Consul sequencer written before sequencers had one (whose text has none).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The order of this acquisition among the acquisitions of its key: `(generation, index)`,
    /// compared as a tuple. Of two sequencers of one key (and one backend whose index rises),
    /// the greater is the newer. A sequencer without a generation (0) orders below every one
    /// with one: an old holder's text, or one written before sequencers had a generation, is the older.
    pub fn order(&self) -> (u64, u64) {
        (self.generation, self.index)
    }

    /// Consul's session ID, or the AMQP holder queue.
    pub fn holder(&self) -> &str {
        &self.holder
    }
}

impl fmt::Display for Sequencer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.generation == 0 {
            write!(f, "{}:{}:", self.backend, self.index)?;
        } else {
            write!(f, "{}:{}.{}:", self.backend, self.generation, self.index)?;
        }
        write_encoded(f, &self.holder)?;
        f.write_str(":")?;
        write_encoded(f, &self.key)
    }
}

impl FromStr for Sequencer {
    type Err = ParseSequencerError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| ParseSequencerError::new(s, reason);
        let mut parts = s.splitn(4, ':');
        let (Some(backend), Some(index), Some(holder), Some(key)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(err(
                "expected four ':'-separated parts: <backend>:[<generation>.]<index>:<holder>:<key>",
            ));
        };
        let backend = BackendKind::parse(backend).ok_or(err(
            "unknown backend; expected consul, amqp, memory, etcd, postgres, redis or a name this process made known \
             with BackendKind::custom",
        ))?;
        let (generation, index) = match index.split_once('.') {
            Some((generation, index)) => {
                let generation = parse_number(generation, true).map_err(err)?;
                if generation == 0 {
                    // `Display` writes no generation when it is 0.
                    return Err(err("the generation is 0; write the index alone"));
                }
                (generation, index)
            }
            None => (0, index),
        };
        let index = parse_number(index, false).map_err(err)?;
        let holder = decode(holder).ok_or(err("the holder is not validly percent-encoded"))?;
        let key = decode(key).ok_or(err("the key is not validly percent-encoded"))?;
        if holder.is_empty() {
            return Err(err("the holder is empty"));
        }
        if key.is_empty() {
            return Err(err("the key is empty"));
        }
        Ok(Sequencer {
            backend,
            key,
            generation,
            index,
            holder,
        })
    }
}

/// A decimal `u64` in its one canonical text (no sign, no leading zero).
fn parse_number(text: &str, generation: bool) -> Result<u64, &'static str> {
    let pick = |index, of_generation| if generation { of_generation } else { index };
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(pick(
            "the index is not a decimal number",
            "the generation (before the '.') is not a decimal number",
        ));
    }
    if text.len() > 1 && text.starts_with('0') {
        // `Display` never writes one, and "07" would give the sequencer a second text.
        return Err(pick(
            "the index has a leading zero",
            "the generation has a leading zero",
        ));
    }
    text.parse().map_err(|_| {
        pick(
            "the index does not fit in 64 bits",
            "the generation does not fit in 64 bits",
        )
    })
}

/// The text given to [`Sequencer::from_str`](str::parse) is not a sequencer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed sequencer {input:?}: {reason}")]
pub struct ParseSequencerError {
    input: String,
    reason: &'static str,
}

impl ParseSequencerError {
    fn new(input: &str, reason: &'static str) -> Self {
        // The input may come from an untrusted header: keep the error (and logs) small.
        const MAX: usize = 120;
        let mut end = input.len().min(MAX);
        while !input.is_char_boundary(end) {
            end -= 1;
        }
        ParseSequencerError {
            input: input[..end].to_owned(),
            reason,
        }
    }

    /// Why the text was rejected.
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

fn needs_escape(b: u8) -> bool {
    !(b'!'..=b'~').contains(&b) || b == b'%' || b == b':'
}

fn write_encoded(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    for &b in s.as_bytes() {
        if needs_escape(b) {
            write!(f, "%{b:02X}")?;
        } else {
            f.write_str(std::str::from_utf8(&[b]).map_err(|_| fmt::Error)?)?;
        }
    }
    Ok(())
}

fn decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            // Exactly two upper-case hex digits, as `write_encoded` writes them: `from_str_radix`
            // alone would also take "+A" or "a1", giving one sequencer several texts.
            let hex = bytes.get(i + 1..i + 3)?;
            if !hex
                .iter()
                .all(|d| d.is_ascii_digit() || (b'A'..=b'F').contains(d))
            {
                return None;
            }
            let hex = std::str::from_utf8(hex).ok()?;
            let byte = u8::from_str_radix(hex, 16).ok()?;
            // "%21" for '!' would give the sequencer a second text.
            if !needs_escape(byte) {
                return None;
            }
            out.push(byte);
            i += 3;
        } else if needs_escape(b) {
            // Only the canonical form is accepted, so every sequencer has exactly one text.
            return None;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests;
