//! The lessor: etcd's leases (`lease/lessor.go`), their IDs, TTLs and expiry.
//!
//! A lease expires its TTL after it was granted or last kept alive. etcd's lessor looks for
//! expired leases every 500 ms and revokes them through raft, so a revocation lands after the
//! expiry, by up to about half a second: here by [`Config::revoke_late`](super::config::Config), which
//! the simulation draws. Until then the lease still exists: its keys are there, a put may still
//! attach a key to it, its time-to-live reads 0 (or less), and a keep-alive waits for the
//! revocation and then answers TTL 0 (`Renew` waits on the lease's `revokec`).
//!
//! A new leader (etcd restarted, or another member elected) extends every lease to its full TTL
//! plus the election timeout (`Promote`, as lease checkpoints are off by default in 3.4).
//!
//! IDs are etcd's `idutil` shape: a 16-bit member prefix over a 48-bit counter that starts at a
//! timestamp, so a member's IDs rise and share one hex length (key names ordered by lease hex
//! sort as the leases were granted), here both drawn from the seed.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::error;
use crate::rng::Rng;

/// etcd's `MaxLeaseTTL`.
const MAX_LEASE_TTL: i64 = 9_000_000_000;

#[derive(Clone, Debug)]
pub(crate) struct Lease {
    pub(crate) ttl: i64,
    pub(crate) expiry: Instant,
}

impl Lease {
    /// The whole seconds left, as etcd's `int64(Remaining().Seconds())` (truncated towards zero,
    /// so a lease a fraction of a second past its expiry reads 0).
    pub(crate) fn seconds_left(&self, now: Instant) -> i64 {
        let nanos = if self.expiry >= now {
            i128::try_from(self.expiry.duration_since(now).as_nanos()).unwrap_or(i128::MAX)
        } else {
            -i128::try_from(now.duration_since(self.expiry).as_nanos()).unwrap_or(i128::MAX)
        };
        i64::try_from(nanos / 1_000_000_000).unwrap_or(i64::MAX)
    }
}

/// What a keep-alive finds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// Kept alive: the lease's TTL.
    Renewed(i64),
    /// No such lease: TTL 0.
    Gone,
    /// Expired and not revoked yet: the keep-alive waits for the revocation.
    Expired,
}

#[derive(Debug)]
pub(crate) struct Lessor {
    leases: BTreeMap<i64, Lease>,
    /// The member's prefix, in the top 16 bits.
    prefix: u64,
    /// The counter under it (48 bits).
    suffix: u64,
    min_ttl: i64,
}

impl Lessor {
    pub(crate) fn new(rng: &mut Rng, min_ttl: i64) -> Lessor {
        // A member ID's low 16 bits, kept below 0x8000 so IDs are positive, and at least 0x1000
        // so every ID has 16 hex digits.
        let member = 0x1000 + rng.below(0x7000);
        // Milliseconds since the epoch, as a start in 2025 or so, shifted over the counter byte.
        let millis = 1_735_689_600_000 + rng.below(86_400_000 * 365);
        Lessor {
            leases: BTreeMap::new(),
            prefix: member << 48,
            suffix: (millis & ((1 << 40) - 1)) << 8,
            min_ttl,
        }
    }

    fn next_id(&mut self) -> i64 {
        self.suffix = self.suffix.wrapping_add(1);
        let id = (self.prefix | (self.suffix & ((1 << 48) - 1))) & (u64::MAX >> 1);
        i64::try_from(id).unwrap_or(i64::MAX)
    }

    pub(crate) fn get(&self, id: i64) -> Option<&Lease> {
        self.leases.get(&id)
    }

    pub(crate) fn leases(&self) -> impl Iterator<Item = (i64, &Lease)> {
        self.leases.iter().map(|(id, lease)| (*id, lease))
    }

    /// Grants a lease of `ttl` seconds (raised to the minimum TTL) with the ID `id`, or one of
    /// the server's if 0: etcd's `LeaseGrant` and its errors. Returns the ID and the TTL.
    pub(crate) fn grant(
        &mut self,
        id: i64,
        ttl: i64,
        now: Instant,
    ) -> Result<(i64, i64), tonic::Status> {
        let id = if id == 0 { self.next_id() } else { id };
        if ttl > MAX_LEASE_TTL {
            return Err(error::lease_ttl_too_large());
        }
        if self.leases.contains_key(&id) {
            return Err(error::lease_exists());
        }
        let ttl = ttl.max(self.min_ttl);
        let lease = Lease {
            ttl,
            expiry: after(now, ttl, Duration::ZERO),
        };
        self.leases.insert(id, lease);
        Ok((id, ttl))
    }

    /// A keep-alive of lease `id` at `now`.
    pub(crate) fn renew(&mut self, id: i64, now: Instant) -> Renewal {
        let Some(lease) = self.leases.get_mut(&id) else {
            return Renewal::Gone;
        };
        if lease.expiry <= now {
            return Renewal::Expired;
        }
        lease.expiry = after(now, lease.ttl, Duration::ZERO);
        Renewal::Renewed(lease.ttl)
    }

    /// Forgets lease `id` (its keys are the caller's to delete); whether it existed.
    pub(crate) fn remove(&mut self, id: i64) -> bool {
        self.leases.remove(&id).is_some()
    }

    /// A new leader's lessor: every lease's expiry its TTL plus `extend` from now.
    pub(crate) fn promote(&mut self, now: Instant, extend: Duration) {
        for lease in self.leases.values_mut() {
            lease.expiry = after(now, lease.ttl, extend);
        }
    }
}

/// `now` plus `ttl` seconds and `extend`, saturating far in the future.
fn after(now: Instant, ttl: i64, extend: Duration) -> Instant {
    let ttl = Duration::from_secs(u64::try_from(ttl).unwrap_or_default());
    now.checked_add(ttl.saturating_add(extend))
        .or_else(|| now.checked_add(Duration::from_secs(86_400 * 365 * 30)))
        .unwrap_or(now)
}
