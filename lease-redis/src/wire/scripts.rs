//! The Lua scripts that are the protocol (`lua/`), and where a name's keys are.
//!
//! Every change to a lease is one script, so it is atomic on the server and compares the holder
//! before it writes: `acquire`, `renew` (many leases in one call), `release`, `keep` (a release
//! that leaves the lease held until its `min_hold` ends), `leave` (a waiter gives up its place),
//! `check` and `leader` (reads). Each is `lua/common.lua` followed by its own body, sent by
//! `EVALSHA` (and once by `EVAL` where the server has not cached it yet). Scripts take the time
//! from the server (`TIME`): every expiry, bar and waiter's place is on the server's clock.
//!
//! A name's keys share its Redis Cluster hash tag, `{<name>}`, so one script can touch them all
//! ([`Keys`]); a name containing `}` would split that tag, and is refused.

use lease_core::Error;

/// One script: its text and its SHA-1, as the server caches it.
#[derive(Debug)]
pub(crate) struct Script {
    pub(crate) name: &'static str,
    pub(crate) source: &'static str,
    hash: std::sync::OnceLock<String>,
}

impl Script {
    const fn new(name: &'static str, source: &'static str) -> Script {
        Script {
            name,
            source,
            hash: std::sync::OnceLock::new(),
        }
    }

    /// The SHA-1 the server knows the script by (`EVALSHA`).
    pub(crate) fn hash(&self) -> &str {
        self.hash
            .get_or_init(|| redis::Script::new(self.source).get_hash().to_owned())
    }
}

macro_rules! script {
    ($name:literal) => {
        Script::new(
            $name,
            concat!(
                include_str!("lua/common.lua"),
                "\n",
                include_str!(concat!("lua/", $name, ".lua"))
            ),
        )
    };
}

pub(crate) static ACQUIRE: Script = script!("acquire");
pub(crate) static RENEW: Script = script!("renew");
pub(crate) static RELEASE: Script = script!("release");
pub(crate) static KEEP: Script = script!("keep");
pub(crate) static LEAVE: Script = script!("leave");
pub(crate) static CHECK: Script = script!("check");
pub(crate) static LEADER: Script = script!("leader");

/// The default prefix of every key and channel.
pub const DEFAULT_PREFIX: &str = "lease:";

/// Refuses a name whose keys could not share one hash tag, and a prefix that would break it.
pub(crate) fn check_name(name: &str) -> Result<(), Error> {
    lease_core::validate_key(name)?;
    if name.contains('}') {
        return Err(Error::InvalidKey {
            key: name.chars().take(64).collect(),
            reason: "contains '}', which would split the Redis Cluster hash tag its keys share",
        });
    }
    Ok(())
}

/// The keys of one name under a prefix: its base key (the leader key itself) and what the
/// scripts derive from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Keys {
    /// `<prefix>{<name>}`.
    pub(crate) base: String,
}

impl Keys {
    pub(crate) fn of(prefix: &str, name: &str) -> Keys {
        Keys {
            base: format!("{prefix}{{{name}}}"),
        }
    }

    /// A semaphore holder's own key, `<base>:s:<holder>`.
    pub(crate) fn holder(&self, holder: &str) -> String {
        format!("{}:s:{holder}", self.base)
    }

    /// The channel a name's waiters are woken on.
    pub(crate) fn wake(&self) -> String {
        format!("{}:wake", self.base)
    }

    /// Every key of the name, for an operator's clean-up.
    pub(crate) fn bookkeeping(&self) -> [String; 6] {
        let b = &self.base;
        [
            b.clone(),
            format!("{b}:meta"),
            format!("{b}:slots"),
            format!("{b}:held"),
            format!("{b}:queue"),
            format!("{b}:waiting"),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_names_keys_share_its_hash_tag_and_a_brace_that_would_split_it_is_refused() {
        let keys = Keys::of(DEFAULT_PREFIX, "jobs/{a");
        assert_eq!(keys.base, "lease:{jobs/{a}");
        assert_eq!(keys.holder("h1"), "lease:{jobs/{a}:s:h1");
        assert_eq!(keys.wake(), "lease:{jobs/{a}:wake");
        assert!(check_name("jobs/a}b").is_err());
        assert!(check_name("jobs/{a").is_ok());
    }

    #[test]
    fn every_script_starts_with_the_shared_prelude() {
        for script in [&ACQUIRE, &RENEW, &RELEASE, &KEEP, &LEAVE, &CHECK, &LEADER] {
            assert!(
                script.source.starts_with("-- lease-redis"),
                "{}",
                script.name
            );
            assert_eq!(script.hash().len(), 40);
        }
    }
}
