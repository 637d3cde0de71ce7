//! What operators do with a semaphore: read who holds it ([`SemaphoreState`]) and remove it.

use std::time::Duration;

use super::value::{directory, read_snapshot};
use crate::wire::{ApiError, ConsulHttp};
use lease_core::semaphore::{contender_key, lock_key};
use lease_core::{Error, Sequencer};
use lease_http::{retry_transient, within};

/// A Consul semaphore as one read found it ([`Consul::semaphore_state`](crate::Consul::semaphore_state)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SemaphoreState {
    /// The limit stored in its `.lock` key; `None` if there is no `.lock` key.
    pub limit: Option<u64>,
    /// The holders recorded in `.lock` whose sessions are alive.
    pub holders: Vec<SemaphoreHolder>,
}

/// One live holder of a Consul semaphore.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SemaphoreHolder {
    /// Its session.
    pub session: String,
    /// The value it advertises in its contender key.
    pub value: Vec<u8>,
    /// Its sequencer (contender key, that key's LockIndex, session).
    pub sequencer: Sequencer,
}

/// What one consistent read of the semaphore at `prefix` says: its limit and live holders.
pub(crate) async fn state(http: &ConsulHttp, prefix: &str) -> Result<SemaphoreState, Error> {
    let (entries, index) = http
        .kv_list(&directory(prefix))
        .await
        .map_err(|e| e.into_error(http, format_args!("read semaphore {prefix:?}")))?;
    let snapshot = read_snapshot(prefix, &entries, index);
    if let Err(unreadable) = &snapshot.lock {
        return Err(unreadable.to_error(prefix));
    }
    let holders = snapshot
        .live_holders()
        .into_iter()
        .map(|session| {
            let key = contender_key(prefix, &session);
            let entry = entries.iter().find(|e| e.key == key);
            SemaphoreHolder {
                sequencer: Sequencer::new(
                    lease_core::BackendKind::Consul,
                    key.as_str(),
                    entry.map_or(0, |e| e.lock_index),
                    session.as_str(),
                ),
                value: entry
                    .and_then(|e| e.decoded_value().ok())
                    .unwrap_or_default(),
                session,
            }
        })
        .collect();
    Ok(SemaphoreState {
        limit: snapshot.limit(),
        holders,
    })
}

/// Removes the semaphore at `prefix` if no live holder remains.
pub(crate) async fn destroy(http: &ConsulHttp, prefix: &str) -> Result<(), Error> {
    let fail = |e: ApiError| e.into_error(http, format_args!("destroy semaphore {prefix:?}"));
    let directory = directory(prefix);
    loop {
        let (entries, index) =
            retry_transient(within(Duration::from_secs(5)), || http.kv_list(&directory))
                .await
                .map_err(fail)?;
        let snapshot = read_snapshot(prefix, &entries, index);
        let modify_index = match &snapshot.lock {
            Err(unreadable) => return Err(unreadable.to_error(prefix)),
            Ok(None) => return Ok(()),
            Ok(Some((modify_index, _))) => *modify_index,
        };
        let live = snapshot.live_holders();
        if !live.is_empty() {
            return Err(Error::SemaphoreInUse {
                key: prefix.to_owned(),
                holders: live.len(),
            });
        }
        if http
            .kv_delete(&lock_key(prefix), Some(modify_index))
            .await
            .map_err(fail)?
        {
            return Ok(());
        }
    }
}
