//! What an AMQP acquire logs: lapin's `WARN … NO_ROUTE` for the probes the broker returns, and
//! the documented directive that mutes exactly those. In a binary of its own: lapin logs from its
//! I/O thread, so the capture is the process's global subscriber.

use lease_amqp::QUIET_PROBE_RETURNS;
use lease_core::{Backend, LeaseSpec, Wait};
use lease_tests::amqp::{backend, require_broker, unique};
use lease_tests::capture::{Capture, EventRecord};
use tracing::Level;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{EnvFilter, Layer};

fn no_route_warnings(events: &[EventRecord]) -> Vec<&EventRecord> {
    events
        .iter()
        .filter(|e| e.level == Level::WARN && e.text.contains("NO_ROUTE"))
        .collect()
}

#[tokio::test]
async fn acquire_and_release_log_no_no_route_warning_under_the_documented_directive() {
    // Everything, and everything the directive lets through, side by side.
    let raw = Capture::default();
    let quiet = Capture::default();
    let subscriber = tracing_subscriber::registry().with(raw.layer()).with(
        quiet
            .layer()
            .with_filter(EnvFilter::new(format!("trace,{QUIET_PROBE_RETURNS}"))),
    );
    tracing::subscriber::set_global_default(subscriber)
        .expect("this test binary installs the only global subscriber");
    require_broker().await;
    let name = unique("quiet-probes");
    let (amqp, _) = backend();
    let spec = LeaseSpec::semaphore(&name, 2).wait(Wait::Never);
    // Creates the semaphore, then takes both slots of the existing one.
    let first = amqp.acquire(&spec).await.unwrap();
    let second = amqp.acquire(&spec).await.unwrap();
    assert!(amqp.acquire(&spec).await.unwrap_err().is_busy());
    second.release().await.unwrap();
    first.release().await.unwrap();
    amqp.admin().destroy(&name).await.unwrap();

    let quiet_events = quiet.events();
    let leaked = no_route_warnings(&quiet_events);
    assert!(
        leaked.is_empty(),
        "{QUIET_PROBE_RETURNS} let NO_ROUTE warnings through: {leaked:#?}"
    );
    assert!(
        quiet_events
            .iter()
            .any(|e| e.target.starts_with("lease_amqp") && e.text.contains("slot acquired")),
        "the directive must not mute the library's own events"
    );
    // The holder tasks' spans follow from the acquires, as on every backend.
    let acquires: Vec<u64> = raw
        .spans_named("lease.acquire")
        .iter()
        .map(|s| s.serial)
        .collect();
    let holds = raw.spans_named("lease.hold");
    assert_eq!(holds.len(), 2, "{holds:#?}");
    for hold in &holds {
        assert_eq!(hold.parent, None, "{hold:?}");
        assert!(
            hold.follows_from.len() == 1 && acquires.contains(&hold.follows_from[0]),
            "{hold:?} does not follow from one of {acquires:?}"
        );
    }
    let raw_events = raw.events();
    let warned = no_route_warnings(&raw_events);
    assert!(
        warned
            .iter()
            .all(|e| e.target == "lapin::returned_messages"),
        "a NO_ROUTE warning from another target than the directive's: {warned:#?}"
    );
    assert!(
        !warned.is_empty(),
        "lapin no longer warns about returned probes: QUIET_PROBE_RETURNS and its docs can go"
    );
}
