//! Who leads a key: the [`Leader`], and one backend observation of it ([`LeaderObserver`]), as
//! [`Backend::observe_leader`](crate::Backend::observe_leader) returns it. Re-exported by
//! [`leader`](crate::leader), beside the [`LeaderWatch`](crate::leader::LeaderWatch) that keeps
//! observing; a module of its own so that the backend contract, which returns these, and the
//! campaign, which uses the contract, do not depend on each other.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::{Error, Sequencer};

/// The holder of a leader key, as followers see it.
///
/// Its `Debug` shows the value as text when it is UTF-8 (an address, as values usually are),
/// and as bytes otherwise.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's fencing token (key, LockIndex, session).
    pub sequencer: Sequencer,
    /// The value the leader advertises in the key (e.g. its address).
    pub value: Vec<u8>,
}

impl std::fmt::Debug for Leader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut leader = f.debug_struct("Leader");
        leader.field("sequencer", &self.sequencer);
        match self.value_str() {
            Some(text) => leader.field("value", &text),
            None => leader.field("value", &self.value),
        };
        leader.finish()
    }
}

impl Leader {
    /// A leader from its parts (for backends).
    pub fn new(sequencer: Sequencer, value: Vec<u8>) -> Self {
        Leader { sequencer, value }
    }

    /// The advertised value as text, if it is UTF-8.
    pub fn value_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.value).ok()
    }
}

/// Who holds a leader key now, kept fresh by the backend's watch until dropped.
///
/// One observation: it ends (its methods answer [`Error::ObserverClosed`], and
/// [`leader`](Self::leader) `None`) when the backend can no longer confirm the key. To follow a
/// key for the life of a process, use [`LeaderWatch`](crate::leader::LeaderWatch), which observes again.
///
/// Cloning gives another view of the same observation.
#[derive(Clone, Debug)]
pub struct LeaderObserver {
    key: String,
    rx: watch::Receiver<Option<Leader>>,
}

impl LeaderObserver {
    /// An observer of `key` fed by a backend's watch task through `rx`. The task should stop when
    /// every receiver is gone (`watch::Sender::closed`), and drop its sender when it can no
    /// longer confirm the key.
    pub fn new(key: impl Into<String>, rx: watch::Receiver<Option<Leader>>) -> Self {
        LeaderObserver {
            key: key.into(),
            rx,
        }
    }

    /// The observed key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The leader as last seen (no I/O), or `None` while nobody holds the key, and once the
    /// observation has ended (the backend could no longer confirm the key; observe again).
    pub fn leader(&self) -> Option<Leader> {
        if self.rx.has_changed().is_err() {
            return None;
        }
        self.rx.borrow().clone()
    }

    /// Waits until the leader changes (a new holder, the key released, or a new advertised value)
    /// and returns the new one.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a change that arrives while nobody waits is reported by the next call.
    pub async fn changed(&mut self) -> Result<Option<Leader>, Error> {
        self.rx.changed().await.map_err(|_| Error::ObserverClosed {
            key: self.key.clone(),
        })?;
        Ok(self.rx.borrow_and_update().clone())
    }

    /// Waits until the leader satisfies `condition` (checked on the current value first).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn wait_for(
        &mut self,
        mut condition: impl FnMut(Option<&Leader>) -> bool,
    ) -> Result<Option<Leader>, Error> {
        let key = &self.key;
        let leader = self
            .rx
            .wait_for(|leader| condition(leader.as_ref()))
            .await
            .map_err(|_| Error::ObserverClosed { key: key.clone() })?;
        Ok(leader.clone())
    }
}

/// What a [`LeaderWatch`](crate::leader::LeaderWatch) knows about its key.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Observation {
    /// Nothing confirmed: the watch has not started or not answered yet, or its observation
    /// ended (the backend is away) and it is observing again.
    Unknown,
    /// The backend's watch answered.
    Known {
        /// The key's holder, `None` while nobody holds it.
        leader: Option<Leader>,
        /// When this process received that answer (tokio's clock). A backend's watch reports
        /// changes, not silence: on a quiet key this does not move, so it bounds how old the
        /// answer may be only together with a fresh read.
        received: Instant,
    },
    /// The backend cannot observe this key, and retrying will not change that (it does not
    /// support observation, or answered with an error such as an invalid key). The watch has
    /// stopped.
    Failed(Arc<Error>),
}

impl Observation {
    /// The leader if the watch has confirmed one; `None` while nobody leads or nothing is known.
    pub fn leader(&self) -> Option<&Leader> {
        match self {
            Observation::Known { leader, .. } => leader.as_ref(),
            Observation::Unknown | Observation::Failed(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BackendKind;

    #[test]
    fn a_leader_shows_its_value_as_text_when_it_is() {
        let sequencer = Sequencer::new(BackendKind::Memory, "k", 1, "s");
        let text = Leader::new(sequencer.clone(), b"http://10.0.0.7:8080".to_vec());
        assert!(format!("{text:?}").contains(r#"value: "http://10.0.0.7:8080""#));
        let bytes = Leader::new(sequencer, vec![0xff, 0]);
        assert!(format!("{bytes:?}").contains("value: [255, 0]"));
    }
}
