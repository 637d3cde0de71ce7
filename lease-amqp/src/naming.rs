//! The queue names of a persistent semaphore (amqp-locks'), and the rules a semaphore name obeys.
//!
//! A semaphore `N` is the set of durable slot queues `N-1-A` … `N-C-A` (`A[L]`), the exclusive holder
//! queues `N-L-B` (`B[L]`) of whoever holds slot L, the settle queues `N-L-C` (`C[L]`, ours, not
//! amqp-locks': see `client`) and the administration mutex `N-admin`. The mutex ends in none of
//! `-A`, `-B` or `-C`, so it can never collide with a slot's queue of `N`.

use lease_core::Error;
use lease_core::validate_key;

/// RabbitMQ's limit on a queue name, in bytes.
pub(crate) const MAX_QUEUE_NAME: usize = 255;

/// The names of one semaphore's queues.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SemaphoreNames {
    name: String,
}

impl SemaphoreNames {
    /// Checks `name` for use with slots up to `max_slot` and returns its names.
    pub(crate) fn new(name: &str, max_slot: u32) -> Result<Self, Error> {
        validate_key(name)?;
        let invalid = |reason| Error::InvalidKey {
            key: name.to_owned(),
            reason,
        };
        if name.starts_with("amq.") {
            return Err(invalid(
                "RabbitMQ reserves queue names starting with 'amq.': choose another name",
            ));
        }
        if max_slot == 0 {
            return Err(Error::InvalidLimit {
                key: name.to_owned(),
                limit: 0,
            });
        }
        let names = SemaphoreNames {
            name: name.to_owned(),
        };
        // The longest names the semaphore uses: its highest slot queue and its mutex.
        if !names.fits(max_slot) || names.admin_queue().len() > MAX_QUEUE_NAME {
            return Err(invalid(
                "the queue names derived from it would exceed RabbitMQ's 255-byte limit: use a shorter name",
            ));
        }
        Ok(names)
    }

    /// The semaphore's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// `A[slot]`: the durable queue whose existence makes `slot` part of the semaphore.
    pub(crate) fn slot_queue(&self, slot: u32) -> String {
        format!("{}-{slot}-A", self.name)
    }

    /// `B[slot]`: the exclusive queue whose existence says `slot` is held.
    pub(crate) fn holder_queue(&self, slot: u32) -> String {
        format!("{}-{slot}-B", self.name)
    }

    /// `C[slot]`: the queue that outlives its holder's connection by the holder's settle time
    /// (`x-expires`), unless the holder released the slot cleanly.
    pub(crate) fn settle_queue(&self, slot: u32) -> String {
        format!("{}-{slot}-C", self.name)
    }

    /// The administration mutex.
    pub(crate) fn admin_queue(&self) -> String {
        format!("{}-admin", self.name)
    }

    /// Whether `slot` still gives queue names RabbitMQ accepts (for administrators adding slots).
    pub(crate) fn fits(&self, slot: u32) -> bool {
        self.slot_queue(slot).len() <= MAX_QUEUE_NAME
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_seed() {
        let n = SemaphoreNames::new("jobs/reports", 3).expect("valid in this test");
        assert_eq!(n.slot_queue(2), "jobs/reports-2-A");
        assert_eq!(n.holder_queue(2), "jobs/reports-2-B");
        assert_eq!(n.settle_queue(2), "jobs/reports-2-C");
        assert_eq!(n.admin_queue(), "jobs/reports-admin");
    }

    #[test]
    fn rejects_bad_names() {
        assert!(matches!(
            SemaphoreNames::new("", 1),
            Err(Error::InvalidKey { .. })
        ));
        assert!(matches!(
            SemaphoreNames::new("amq.x", 1),
            Err(Error::InvalidKey { .. })
        ));
        assert!(matches!(
            SemaphoreNames::new("x", 0),
            Err(Error::InvalidLimit { .. })
        ));
        let long = "n".repeat(252);
        assert!(matches!(
            SemaphoreNames::new(&long, 1),
            Err(Error::InvalidKey { .. })
        ));
        let fits = "n".repeat(MAX_QUEUE_NAME - "-admin".len());
        assert!(SemaphoreNames::new(&fits, 1).is_ok());
        assert!(SemaphoreNames::new(&fits, 999).is_ok());
        assert!(SemaphoreNames::new(&fits, 1000).is_err());
        assert!(SemaphoreNames::new(&"n".repeat(250), 1).is_err());
    }
}
