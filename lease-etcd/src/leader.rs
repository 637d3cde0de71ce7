//! The leader recipe: etcd's election, on the shared queue (the `queue` module).
//!
//! A **leader** (etcd's `concurrency.Election`, the recipe `etcdctl elect` uses): the oldest key
//! leads. A waiter watches only the key just before its own, so a hand-over wakes one waiter,
//! not all of them. The key's value is the advertised value, as `etcdctl elect` writes its
//! proposal, so the two interoperate on the same name.

use std::convert::Infallible;

use super::queue::{Count, KeptWatch, Recipe, Removal, Turn};
use super::semaphore::SemaphoreValue;
use super::wire::proto::{Event, KeyValue, RangeRequest};
use lease_core::{Error, LeaseSpec};

/// The leader recipe: the oldest key holds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Leader;

impl Recipe for Leader {
    type Count = Infallible;

    fn value(self, spec: &LeaseSpec) -> Vec<u8> {
        spec.advertised_value().to_vec()
    }

    fn ahead(self, key: &str, created: i64) -> RangeRequest {
        // The newest key older than ours: the one to wait for.
        RangeRequest::under(key)
            .by_creation(false)
            .limit(1)
            .created_by(created - 1)
    }

    fn holding(self, key: &str, created: i64) -> RangeRequest {
        // The oldest key: the holder, whom the key just ahead may be waiting behind.
        RangeRequest::under(key)
            .by_creation(true)
            .limit(1)
            .created_by(created - 1)
    }

    fn older(self, _: &str, _: i64) -> Option<RangeRequest> {
        None
    }

    fn judge(self, key: &str, _: &str, ahead: &[KeyValue]) -> Result<Turn, Error> {
        match ahead.first() {
            None => Ok(Turn::Mine),
            Some(previous) if SemaphoreValue::parse(previous).is_some() => {
                Err(Error::semaphore_in_the_way(key))
            }
            Some(previous) => Ok(Turn::WaitFor(RangeRequest::key(&previous.key_str()))),
        }
    }

    fn count(self, _: &str, _: i64, _: (&[KeyValue], &[KeyValue]), _: i64) -> Option<Infallible> {
        None
    }

    fn sequencer_key(self, key: &str, _: &str) -> String {
        key.to_owned()
    }
}

/// A leader's waiter counts nothing: it waits for the deletion of the one key just ahead of it.
impl Count for Infallible {
    fn deleted(&mut self, _: &Event) -> bool {
        match *self {}
    }

    fn turn_at(&self) -> Option<i64> {
        match *self {}
    }

    fn take_worst(&mut self) -> Removal {
        match *self {}
    }

    async fn catch_up(self, _: &mut Option<KeptWatch>, _: i64, _: usize) -> Removal {
        match self {}
    }
}
