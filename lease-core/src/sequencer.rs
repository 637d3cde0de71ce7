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
//! <backend>:<index>:<holder>:<key>
//! consul:7:4ca8e74b-6350-7587-addf-a18084928f3c:service/leader
//! ```
//!
//! `holder` and `key` are percent-encoded: every byte outside the visible ASCII range `!`..=`~`, and
//! `%` and `:` themselves, is written as `%XX`. The whole text is therefore a valid HTTP header value.

use std::fmt;
use std::str::FromStr;

/// Which kind of backend issued a [`Sequencer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackendKind {
    /// Consul sessions and KV: `key` is the KV key, `index` its LockIndex, `holder` the session ID.
    Consul,
    /// The RabbitMQ persistent semaphore: `key` is the semaphore name, `index` the slot number,
    /// `holder` the exclusive holder queue followed by `#` and a per-acquisition nonce.
    Amqp,
    /// The in-process memory backend, with Consul's semantics.
    Memory,
    /// etcd: `key` is the election name (a leader) or the holder's own key `<prefix>/<lease>` (a
    /// semaphore), `index` the create revision of the holder's key (rises with every write to the
    /// cluster, whatever the key), `holder` the etcd lease ID in hex, as `etcdctl elect` names
    /// its keys.
    Etcd,
}

impl BackendKind {
    /// The name used in the text form.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Consul => "consul",
            BackendKind::Amqp => "amqp",
            BackendKind::Memory => "memory",
            BackendKind::Etcd => "etcd",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "consul" => Some(BackendKind::Consul),
            "amqp" => Some(BackendKind::Amqp),
            "memory" => Some(BackendKind::Memory),
            "etcd" => Some(BackendKind::Etcd),
            _ => None,
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The fencing token of one acquisition: `(key, index, holder)` and the backend that issued it.
///
/// Two sequencers are equal only if they name the same acquisition. For Consul this is exactly
/// Consul's `(Key, LockIndex, Session)`.
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
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Sequencer {
    backend: BackendKind,
    key: String,
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
            index,
            holder: holder.into(),
        }
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

    /// Consul's LockIndex (rises with every acquisition), or the AMQP slot number.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// Consul's session ID, or the AMQP holder queue.
    pub fn holder(&self) -> &str {
        &self.holder
    }
}

impl fmt::Display for Sequencer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:", self.backend, self.index)?;
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
                "expected four ':'-separated parts: <backend>:<index>:<holder>:<key>",
            ));
        };
        let backend = BackendKind::parse(backend).ok_or(err(
            "unknown backend; expected consul, amqp, memory or etcd",
        ))?;
        if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err("the index is not a decimal number"));
        }
        if index.len() > 1 && index.starts_with('0') {
            // `Display` never writes one, and "07" would give the sequencer a second text.
            return Err(err("the index has a leading zero"));
        }
        let index = index
            .parse()
            .map_err(|_| err("the index does not fit in 64 bits"))?;
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
            index,
            holder,
        })
    }
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
mod tests {
    use super::*;

    #[test]
    fn round_trips_awkward_keys() {
        for key in ["a", "a:b", "sp ace/ü/%41", "x%", "semaphores/reports/.lock"] {
            let seq = Sequencer::new(BackendKind::Amqp, key, u64::MAX, "q:1-B");
            let text = seq.to_string();
            assert!(text.bytes().all(|b| (b'!'..=b'~').contains(&b)), "{text}");
            assert_eq!(text.parse::<Sequencer>(), Ok(seq));
        }
    }

    #[test]
    fn rejects_malformed_text() {
        for bad in [
            "",
            "consul",
            "consul:1:s",
            "zookeeper:1:s:k",
            "consul:-1:s:k",
            "consul:+1:s:k",
            "consul::s:k",
            "consul:00:s:k",
            "consul:07:s:k",
            "consul:99999999999999999999:s:k",
            "consul:1::k",
            "consul:1:s:",
            "consul:1:s:%4",
            "consul:1:s:%zz",
            "consul:1:s:a b",
            "consul:1:s:%FF",
            "consul:1:s:%+A",
            "consul:1:s:%3a",
            "consul:1:s:%21",
            "consul:1:%73:k",
        ] {
            assert!(bad.parse::<Sequencer>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn error_truncates_long_input() {
        let long = "x".repeat(10_000);
        let err = long.parse::<Sequencer>().unwrap_err();
        assert!(err.to_string().len() < 300);
    }

    mod props {
        use proptest::prelude::*;

        use super::super::*;

        fn backend() -> impl Strategy<Value = BackendKind> {
            prop_oneof![
                Just(BackendKind::Consul),
                Just(BackendKind::Amqp),
                Just(BackendKind::Memory),
                Just(BackendKind::Etcd),
            ]
        }

        /// Non-empty text of any chars, weighted towards the ones the encoding treats specially.
        fn part() -> impl Strategy<Value = String> {
            let special = prop::sample::select(vec![
                '/',
                ':',
                '%',
                ' ',
                '\0',
                '\n',
                '\t',
                '\u{7f}',
                '\u{80}',
                '#',
                '~',
                '!',
                'A',
                'f',
                'ü',
                '\u{2028}',
                '\u{feff}',
                '\u{10ffff}',
            ]);
            prop::collection::vec(prop_oneof![any::<char>(), special], 1..40)
                .prop_map(String::from_iter)
        }

        /// Text shaped like a sequencer, so the parser gets past its first checks.
        fn near_miss() -> impl Strategy<Value = String> {
            concat!(
                "(consul|amqp|memory|etcd|)",
                ":(0[0-9]?|[1-9][0-9]{0,3}|[0-9+-]{0,22})",
                ":[!-9;-~]{0,6}(%[0-9A-F]{2}|%[0-9A-Fa-f+]{0,2}| |é)?[!-9;-~]{0,6}",
                ":[!-9;-~]{0,6}(%[0-9A-F]{2}|%[0-9A-Fa-f+]{0,2}| |é|:)?[!-9;-~]{0,6}",
            )
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            #[test]
            fn parsing_any_text_never_panics(s in any::<String>()) {
                let _ = s.parse::<Sequencer>();
            }

            #[test]
            fn parsing_near_misses_never_panics_and_accepts_only_canonical_text(s in near_miss()) {
                if let Ok(seq) = s.parse::<Sequencer>() {
                    prop_assert_eq!(seq.to_string(), s);
                }
            }

            #[test]
            fn round_trips_any_parts(
                backend in backend(),
                key in part(),
                index in any::<u64>(),
                holder in part(),
            ) {
                let seq = Sequencer::new(backend, key, index, holder);
                let text = seq.to_string();
                prop_assert!(text.bytes().all(|b| (b'!'..=b'~').contains(&b)), "{}", text);
                prop_assert_eq!(text.parse::<Sequencer>(), Ok(seq));
            }
        }
    }
}
