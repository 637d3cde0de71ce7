use std::rc::Rc;

use lease_core::memory::Memory;
use lease_core::{leader_only, semaphore};

#[leader_only(key = "jobs/a", backend = 5)]
async fn number() {}

#[semaphore("reports", 3, backend = "consul")]
async fn string() {}

struct Service {
    backend: String,
}

impl Service {
    #[leader_only(key = "jobs/a", backend = &self.backend)]
    async fn field(&self) {}
}

// Another smart pointer is not looked through: the message says to borrow the backend itself.
#[leader_only(key = "jobs/a", backend = backend)]
async fn rc(backend: Rc<Memory>) {}

#[leader_only(key = "jobs/a", backend = backend)]
async fn unbounded<B>(backend: &B) {}

fn main() {}
