//! Placeholder, replaced by the AMQP semaphore benchmark.
fn main() {}
