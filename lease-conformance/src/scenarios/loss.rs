//! Losing a leader key to an operator (session destroyed, key deleted or released) or to a
//! revocation, and the work under it cancelled.

use lease_core::{Error, LostReason};

use super::common::{EVENT, leader};
use crate::support::{assert_refined, release_lost, within};
use crate::{Capability, Harness, Outcome};

/// Destroying the holder's session cancels its work with `SessionInvalidated`; `check()` and
/// `release()` report the loss.
///
/// Needs [`DestroySession`](Capability::DestroySession).
pub async fn loss_on_session_destroy_cancels_work(h: &Harness) -> Outcome {
    if let Some(outcome) = h.not_applicable(&[Capability::DestroySession]).await {
        return outcome;
    }
    let key = h.key("destroy");
    let lease = h.backend().acquire(&leader(&key)).await.unwrap();
    lease.check().await.unwrap();
    let holder = lease.sequencer().holder().to_owned();
    let (work, ()) = within(EVENT, "the work to be cancelled after destroy", async {
        tokio::join!(lease.run(std::future::pending::<()>()), async {
            h.operator().destroy_session(&holder).await.unwrap();
        })
    })
    .await;
    assert_refined(&lease, &work.unwrap_err(), LostReason::SessionInvalidated).await;
    assert!(!lease.is_held());
    assert!(matches!(
        lease.check().await,
        Err(Error::Lost(LostReason::SessionInvalidated))
    ));
    // Releasing a lost lease reports the loss.
    release_lost(lease).await;
    Outcome::Passed
}

/// Deleting a held key loses the lease with `KeyDeleted`.
///
/// Needs [`DeleteKey`](Capability::DeleteKey).
pub async fn loss_on_key_delete(h: &Harness) -> Outcome {
    if let Some(outcome) = h.not_applicable(&[Capability::DeleteKey]).await {
        return outcome;
    }
    let key = h.key("delete");
    let lease = h.backend().acquire(&leader(&key)).await.unwrap();
    h.operator().delete_key(&key).await.unwrap();
    let reason = within(EVENT, "loss after the key was deleted", lease.lost()).await;
    assert_eq!(reason, LostReason::KeyDeleted);
    Outcome::Passed
}

/// An operator releasing a held key loses the lease with `KeyReleased`.
///
/// Needs [`ReleaseKey`](Capability::ReleaseKey).
pub async fn loss_on_key_release(h: &Harness) -> Outcome {
    if let Some(outcome) = h.not_applicable(&[Capability::ReleaseKey]).await {
        return outcome;
    }
    let key = h.key("release");
    let lease = h.backend().acquire(&leader(&key)).await.unwrap();
    h.operator()
        .release_key(&key, lease.sequencer().holder())
        .await
        .unwrap();
    let reason = within(EVENT, "loss after the key was released", lease.lost()).await;
    assert_eq!(reason, LostReason::KeyReleased);
    release_lost(lease).await;
    Outcome::Passed
}

/// The operator's [`revoke`](crate::Operator::revoke) cancels the holder's work with a loss other
/// than `Released`.
pub async fn revoke_cancels_work(h: &Harness) -> Outcome {
    let key = h.key("revoke");
    let lease = h.backend().acquire(&leader(&key)).await.unwrap();
    let (work, ()) = within(EVENT, "the work to be cancelled after revoke", async {
        tokio::join!(lease.run(std::future::pending::<()>()), async {
            h.operator().revoke(lease.sequencer()).await.unwrap();
        })
    })
    .await;
    let reason = work.unwrap_err();
    assert_ne!(reason, LostReason::Released, "a revoked lease was not lost");
    assert!(!lease.is_held());
    assert!(matches!(lease.check().await, Err(Error::Lost(_))));
    release_lost(lease).await;
    Outcome::Passed
}
