//! A backend's shutdown, and leases given back at a set time across it.

use std::time::Duration;

use lease_core::{Error, LeaseSpec, LostReason, Wait};

use super::common::{EVENT, leader};
use crate::support::within;
use crate::{Capability, Harness, Outcome};

/// `Backend::shutdown` releases the leases still held, so the next holder gets them at once.
pub async fn shutdown_releases_every_lease(h: &Harness) -> Outcome {
    let key = h.key("shutdown");
    let lease = h.backend().acquire(&leader(&key)).await.unwrap();
    within(EVENT, "Backend::shutdown to finish", h.backend().shutdown()).await;
    assert!(!lease.is_held());
    assert_eq!(lease.lost_reason(), Some(LostReason::Released));
    // Lock-delay and TTL are 15 s: acquiring at once proves the lease was given back.
    let next = within(
        Duration::from_secs(5),
        "acquire after shutdown",
        h.backend().acquire(&leader(&key).wait(Wait::Never)),
    )
    .await
    .unwrap();
    next.release().await.unwrap();
    Outcome::Passed
}

/// A lease given back at a set time (`Lease::release_at`, what `min_hold` uses) stays held on the
/// server until then, although its holder's backend shuts down first; then it is free again,
/// within two TTLs.
///
/// Needs [`KeepsPastHolder`](Capability::KeepsPastHolder).
pub async fn release_at_outlives_the_holders_shutdown(h: &Harness) -> Outcome {
    if let Some(outcome) = h.not_applicable(&[Capability::KeepsPastHolder]).await {
        return outcome;
    }
    const KEPT: Duration = Duration::from_secs(3);
    let key = h.key("release-at");
    let spec = LeaseSpec::leader(&key)
        .ttl(Duration::from_secs(10))
        .lock_delay(Duration::ZERO);
    let lease = h.backend().acquire(&spec).await.unwrap();
    let until = tokio::time::Instant::now() + KEPT;
    let watcher = lease.watcher();
    lease.release_at(until);
    within(EVENT, "Backend::shutdown to finish", h.backend().shutdown()).await;
    assert_eq!(watcher.lost_reason(), Some(LostReason::Released));
    // Held until `until`: a contender that waits until shortly before it is refused.
    let short_of_it = until.saturating_duration_since(tokio::time::Instant::now());
    let refused = h
        .backend()
        .acquire(&spec.clone().wait(Wait::UpTo(
            short_of_it.saturating_sub(Duration::from_millis(300)),
        )))
        .await;
    assert!(
        refused.as_ref().is_err_and(Error::is_busy),
        "the lease was given back before its release time: {refused:?}"
    );
    // Then free again without anyone releasing it: within two TTLs (a TTL is at least that long
    // on the servers that bound it from below, Consul).
    let next = within(
        KEPT + Duration::from_secs(25),
        "the lease to be free after its release time",
        h.backend()
            .acquire(&spec.clone().wait(Wait::UpTo(Duration::from_secs(24)))),
    )
    .await
    .unwrap();
    assert!(
        tokio::time::Instant::now() >= until,
        "acquired before the release time"
    );
    next.release().await.unwrap();
    Outcome::Passed
}
