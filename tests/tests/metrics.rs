//! The metrics (feature `metrics`) recorded through a recorder of the test's own, after an
//! acquisition, a loss and a release: on the memory backend, and on a real Consul agent, etcd
//! server and RabbitMQ broker whose operator destroys the session, deletes the key or closes the
//! connection.
//!
//! One global recorder serves every test of this binary; each test uses keys of its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use lease_core::CancellationToken;
use lease_core::leader::Campaign;
use lease_core::memory::Memory;
use lease_core::metrics::{self as names, labels};
use lease_core::{Backend, LeaseSpec, LostReason};
use lease_tests::amqp::{self as broker, require_broker, unique};
use lease_tests::consul::Agent;
use lease_tests::etcd::Server;
use lease_tests::{init_tracing, release_lost, within};
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use tokio::sync::watch;

const T: Duration = Duration::from_secs(20);

/// Every value recorded, by `name{label=value,...}` with the labels sorted.
#[derive(Debug)]
struct Store {
    values: Mutex<HashMap<String, Value>>,
    /// Bumped on every update, so a test waits for a value without polling a clock.
    updates: watch::Sender<u64>,
}

#[derive(Clone, Debug)]
enum Value {
    Counter(u64),
    Gauge(f64),
    Histogram(Vec<f64>),
}

impl Store {
    fn update(&self, key: &str, f: impl FnOnce(&mut Option<Value>)) {
        {
            let mut values = self.values.lock().unwrap();
            let mut value = values.remove(key);
            f(&mut value);
            if let Some(value) = value {
                values.insert(key.to_owned(), value);
            }
        }
        self.updates.send_modify(|n| *n += 1);
    }

    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<Value> {
        self.values.lock().unwrap().get(&id(name, labels)).cloned()
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        match self.get(name, labels) {
            Some(Value::Counter(n)) => n,
            _ => 0,
        }
    }

    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        match self.get(name, labels) {
            Some(Value::Gauge(v)) => Some(v),
            _ => None,
        }
    }

    fn samples(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        match self.get(name, labels) {
            Some(Value::Histogram(samples)) => samples,
            _ => Vec::new(),
        }
    }

    /// The sum of a counter over every label set (for the backend counters).
    fn counter_total(&self, name: &str, label: (&str, &str)) -> u64 {
        let wanted = format!("{}={}", label.0, label.1);
        self.values
            .lock()
            .unwrap()
            .iter()
            .filter(|(key, _)| key.starts_with(&format!("{name}{{")) && key.contains(&wanted))
            .map(|(_, value)| match value {
                Value::Counter(n) => *n,
                _ => 0,
            })
            .sum()
    }

    /// Waits (bounded) until `done` holds, re-checking after every update.
    async fn wait_for(&self, what: &str, done: impl Fn(&Store) -> bool) {
        within(T, what, async {
            let mut updates = self.updates.subscribe();
            while !done(self) {
                updates.changed().await.unwrap();
            }
        })
        .await;
    }
}

fn id(name: &str, labels: &[(&str, &str)]) -> String {
    let mut labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    labels.sort();
    format!("{name}{{{}}}", labels.join(","))
}

/// One registered metric: its place in the store.
struct Cell {
    store: Arc<Store>,
    id: String,
}

impl CounterFn for Cell {
    fn increment(&self, n: u64) {
        self.store.update(&self.id, |v| match v {
            Some(Value::Counter(c)) => *c += n,
            _ => *v = Some(Value::Counter(n)),
        });
    }

    fn absolute(&self, n: u64) {
        self.store
            .update(&self.id, |v| *v = Some(Value::Counter(n)));
    }
}

impl GaugeFn for Cell {
    fn increment(&self, d: f64) {
        self.store.update(&self.id, |v| match v {
            Some(Value::Gauge(g)) => *g += d,
            _ => *v = Some(Value::Gauge(d)),
        });
    }

    fn decrement(&self, d: f64) {
        GaugeFn::increment(self, -d);
    }

    fn set(&self, g: f64) {
        self.store.update(&self.id, |v| *v = Some(Value::Gauge(g)));
    }
}

impl HistogramFn for Cell {
    fn record(&self, sample: f64) {
        self.store.update(&self.id, |v| match v {
            Some(Value::Histogram(samples)) => samples.push(sample),
            _ => *v = Some(Value::Histogram(vec![sample])),
        });
    }
}

#[derive(Debug)]
struct TestRecorder(Arc<Store>);

impl TestRecorder {
    fn cell(&self, key: &Key) -> Arc<Cell> {
        let labels: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
        Arc::new(Cell {
            store: Arc::clone(&self.0),
            id: id(key.name(), &labels),
        })
    }
}

impl Recorder for TestRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.cell(key))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.cell(key))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.cell(key))
    }
}

/// The process-wide recorder, installed by the first test that asks.
fn recorded() -> &'static Store {
    static STORE: OnceLock<Arc<Store>> = OnceLock::new();
    STORE.get_or_init(|| {
        let store = Arc::new(Store {
            values: Mutex::new(HashMap::new()),
            updates: watch::channel(0).0,
        });
        metrics::set_global_recorder(TestRecorder(Arc::clone(&store)))
            .expect("no other recorder in this test binary");
        store
    })
}

#[tokio::test]
async fn memory_acquisition_loss_and_release_are_recorded() {
    init_tracing();
    let m = recorded();
    let backend = Memory::new();
    let key = "metrics/memory/leader";
    let lease_labels = [
        (labels::BACKEND, "memory"),
        (labels::KIND, "leader"),
        (labels::KEY, key),
    ];

    let lease = backend.acquire(&LeaseSpec::leader(key)).await.unwrap();
    assert_eq!(m.counter(names::ACQUISITIONS, &lease_labels), 1);
    assert_eq!(m.gauge(names::LEASES_HELD, &lease_labels), Some(1.0));
    assert_eq!(m.samples(names::ACQUIRE_WAIT, &lease_labels).len(), 1);
    assert!(m.counter_total(names::BACKEND_WRITES, (labels::BACKEND, "memory")) > 0);

    // An operator's action takes the lease; the guarded work is dropped.
    backend.invalidate_session(lease.sequencer().holder());
    let cancelled = lease.run(std::future::pending::<()>()).await;
    assert_eq!(cancelled, Err(LostReason::SessionInvalidated));
    let loss_labels = [
        (labels::BACKEND, "memory"),
        (labels::KIND, "leader"),
        (labels::KEY, key),
        (labels::REASON, "session_invalidated"),
    ];
    m.wait_for("the loss to be counted", |m| {
        m.counter(names::LOSSES, &loss_labels) == 1
    })
    .await;
    assert_eq!(m.gauge(names::LEASES_HELD, &lease_labels), Some(0.0));
    assert_eq!(m.samples(names::LOSS_TO_CANCEL, &lease_labels).len(), 1);
    release_lost(lease).await;
    assert_eq!(
        m.counter(names::RELEASES, &lease_labels),
        0,
        "a loss is no release"
    );

    let lease = backend.acquire(&LeaseSpec::leader(key)).await.unwrap();
    assert_eq!(m.gauge(names::LEASES_HELD, &lease_labels), Some(1.0));
    lease.release().await.unwrap();
    assert_eq!(m.counter(names::RELEASES, &lease_labels), 1);
    assert_eq!(m.gauge(names::LEASES_HELD, &lease_labels), Some(0.0));
    assert_eq!(m.counter(names::ACQUISITIONS, &lease_labels), 2);
    assert_eq!(m.counter(names::LOSSES, &loss_labels), 1);
}

#[tokio::test]
async fn memory_semaphore_slots_and_campaign_leadership_are_recorded() {
    init_tracing();
    let m = recorded();
    let backend = Arc::new(Memory::new());
    let prefix = "metrics/memory/semaphore";
    let spec = LeaseSpec::semaphore(prefix, 3);
    let first = backend.acquire(&spec).await.unwrap();
    let second = backend.acquire(&spec).await.unwrap();
    let held = [
        (labels::BACKEND, "memory"),
        (labels::KIND, "semaphore"),
        (labels::KEY, prefix),
    ];
    assert_eq!(m.gauge(names::LEASES_HELD, &held), Some(2.0));
    let slots = [(labels::BACKEND, "memory"), (labels::KEY, prefix)];
    // The second acquisition looked at the semaphore while the first held its slot.
    assert!(m.gauge(names::SEMAPHORE_SLOTS_IN_USE, &slots) >= Some(1.0));
    first.release().await.unwrap();
    second.release().await.unwrap();
    assert_eq!(m.gauge(names::LEASES_HELD, &held), Some(0.0));

    let key = "metrics/memory/campaign";
    let campaign = Campaign::try_new(backend, LeaseSpec::leader(key)).unwrap();
    let handle = campaign.handle();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(campaign.hold_until(shutdown.clone()));
    within(
        T,
        "the campaign to lead",
        handle.terms().wait_for(Option::is_some),
    )
    .await
    .unwrap();
    let leader = [(labels::KEY, key)];
    assert_eq!(m.gauge(names::IS_LEADER, &leader), Some(1.0));
    shutdown.cancel();
    within(T, "the campaign to end", running)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(m.gauge(names::IS_LEADER, &leader), Some(0.0));
}

#[tokio::test]
async fn consul_session_destroyed_by_an_operator_is_counted_as_a_loss() {
    init_tracing();
    let m = recorded();
    let agent = Agent::start().await;
    let backend = agent.backend();
    let key = "metrics/consul/leader";
    let lease_labels = [
        (labels::BACKEND, "consul"),
        (labels::KIND, "leader"),
        (labels::KEY, key),
    ];
    let spec = LeaseSpec::leader(key)
        .lock_delay(Duration::ZERO)
        .ttl(Duration::from_secs(10));
    let lease = backend.acquire(&spec).await.unwrap();
    assert_eq!(m.counter(names::ACQUISITIONS, &lease_labels), 1);
    assert_eq!(m.gauge(names::LEASES_HELD, &lease_labels), Some(1.0));
    assert!(m.counter_total(names::BACKEND_REQUESTS, (labels::BACKEND, "consul")) > 0);
    assert!(m.counter_total(names::BACKEND_WRITES, (labels::BACKEND, "consul")) > 0);

    agent.destroy_session(lease.sequencer().holder()).await;
    let cancelled = within(T, "the loss", lease.run(std::future::pending::<()>())).await;
    assert!(cancelled.is_err(), "the work ran on after the loss");
    let loss_labels = [
        (labels::BACKEND, "consul"),
        (labels::KIND, "leader"),
        (labels::KEY, key),
        (labels::REASON, "session_invalidated"),
    ];
    m.wait_for("the loss to be counted, as a session invalidated", |m| {
        m.counter(names::LOSSES, &loss_labels) == 1
    })
    .await;
    assert_eq!(m.gauge(names::LEASES_HELD, &lease_labels), Some(0.0));
    assert_eq!(m.samples(names::LOSS_TO_CANCEL, &lease_labels).len(), 1);
    release_lost(lease).await;

    let lease = backend.acquire(&spec).await.unwrap();
    lease.release().await.unwrap();
    assert_eq!(m.counter(names::RELEASES, &lease_labels), 1);
    assert_eq!(m.gauge(names::LEASES_HELD, &lease_labels), Some(0.0));
}

#[tokio::test]
async fn etcd_key_deleted_by_an_operator_is_counted_as_a_loss() {
    init_tracing();
    let m = recorded();
    let server = Server::start().await;
    let backend = server.backend();
    let key = "metrics/etcd/leader";
    let lease_labels = [
        (labels::BACKEND, "etcd"),
        (labels::KIND, "leader"),
        (labels::KEY, key),
    ];
    let lease = backend.acquire(&LeaseSpec::leader(key)).await.unwrap();
    assert_eq!(m.counter(names::ACQUISITIONS, &lease_labels), 1);
    assert_eq!(m.gauge(names::LEASES_HELD, &lease_labels), Some(1.0));
    assert!(m.counter_total(names::BACKEND_REQUESTS, (labels::BACKEND, "etcd")) > 0);
    assert!(m.counter_total(names::BACKEND_WRITES, (labels::BACKEND, "etcd")) > 0);

    server.delete_key(key).await;
    let cancelled = within(T, "the loss", lease.run(std::future::pending::<()>())).await;
    assert_eq!(cancelled, Err(LostReason::KeyDeleted));
    let loss_labels = [
        (labels::BACKEND, "etcd"),
        (labels::KIND, "leader"),
        (labels::KEY, key),
        (labels::REASON, "key_deleted"),
    ];
    m.wait_for("the loss to be counted, as a key deleted", |m| {
        m.counter(names::LOSSES, &loss_labels) == 1
    })
    .await;
    assert_eq!(m.gauge(names::LEASES_HELD, &lease_labels), Some(0.0));
    release_lost(lease).await;

    let lease = backend.acquire(&LeaseSpec::leader(key)).await.unwrap();
    lease.release().await.unwrap();
    assert_eq!(m.counter(names::RELEASES, &lease_labels), 1);
    assert_eq!(m.gauge(names::LEASES_HELD, &lease_labels), Some(0.0));
}

#[tokio::test]
async fn amqp_connection_closed_by_an_operator_is_counted_as_a_loss() {
    init_tracing();
    require_broker().await;
    let m = recorded();
    let (backend, connection) = broker::backend();
    let key = unique("metrics-amqp");
    let lease_labels = [
        (labels::BACKEND, "amqp"),
        (labels::KIND, "leader"),
        (labels::KEY, key.as_str()),
    ];
    let lease = backend.acquire(&LeaseSpec::leader(&key)).await.unwrap();
    assert_eq!(m.counter(names::ACQUISITIONS, &lease_labels), 1);
    assert_eq!(m.gauge(names::LEASES_HELD, &lease_labels), Some(1.0));
    assert!(m.counter_total(names::BACKEND_REQUESTS, (labels::BACKEND, "amqp")) > 0);
    assert!(m.counter_total(names::BACKEND_WRITES, (labels::BACKEND, "amqp")) > 0);

    tokio::task::spawn_blocking(move || broker::close_connection(&connection))
        .await
        .unwrap();
    let cancelled = within(T, "the loss", lease.run(std::future::pending::<()>())).await;
    assert_eq!(cancelled, Err(LostReason::ConnectionClosed));
    let loss_labels = [
        (labels::BACKEND, "amqp"),
        (labels::KIND, "leader"),
        (labels::KEY, key.as_str()),
        (labels::REASON, "connection_closed"),
    ];
    m.wait_for("the loss to be counted, as a connection closed", |m| {
        m.counter(names::LOSSES, &loss_labels) == 1
    })
    .await;
    assert_eq!(m.gauge(names::LEASES_HELD, &lease_labels), Some(0.0));
    release_lost(lease).await;

    let lease = backend
        .acquire(&LeaseSpec::leader(&key).wait(lease_core::Wait::UpTo(T)))
        .await
        .unwrap();
    lease.release().await.unwrap();
    assert_eq!(m.counter(names::RELEASES, &lease_labels), 1);
    assert_eq!(m.gauge(names::LEASES_HELD, &lease_labels), Some(0.0));
    backend.admin().destroy(&key).await.unwrap();
}
