//! The specs every scenario takes its leases with, and the bound on every wait.

use std::time::Duration;

use lease_core::LeaseSpec;

/// A bound on every wait for an event; generous, since only a broken lease takes this long.
pub(super) const EVENT: Duration = Duration::from_secs(10);

pub(super) fn leader(key: &str) -> LeaseSpec {
    LeaseSpec::leader(key)
        .ttl(Duration::from_secs(15))
        .lock_delay(Duration::from_secs(15))
}

pub(super) fn semaphore(prefix: &str, limit: u32) -> LeaseSpec {
    LeaseSpec::semaphore(prefix, limit)
        .ttl(Duration::from_secs(15))
        .lock_delay(Duration::from_secs(15))
}
