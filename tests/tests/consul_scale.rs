//! Consul at scale: hundreds of leases per process on a bounded connection budget, loss that stays
//! where it happened, and an agent that refuses connections.
//!
//! Connections and requests are counted by a proxy between the client and the agent (or by the
//! agent's own connection limit), not by the client under test.

use std::process::Stdio;
use std::time::Duration;

use lease_consul::Consul;
use lease_core::{Backend, Error, Lease, LeaseSpec, LostReason, Wait};
use lease_tests::consul::{Agent, AgentOptions};
use lease_tests::proxy::{Mode, Proxy};
use lease_tests::workers::Run;
use lease_tests::{init_tracing, within};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::task::JoinSet;
use tokio::time::Instant;

const T: Duration = Duration::from_secs(60);
const TTL: Duration = Duration::from_secs(10);
/// The default connection budget of a client.
const BUDGET: usize = 8;
const WORKER: &str = env!("CARGO_BIN_EXE_lease-worker");

/// `leaders` leader keys under `<base>/leader/`, and `slots` slots spread over semaphores of
/// `limit` under `<base>/sem/<n>`.
fn specs(base: &str, leaders: usize, slots: usize, limit: u32) -> Vec<LeaseSpec> {
    let leader = (0..leaders).map(|i| LeaseSpec::leader(format!("{base}/leader/{i}")));
    let per = limit as usize;
    let slot = (0..slots).map(|i| LeaseSpec::semaphore(format!("{base}/sem/{}", i / per), limit));
    leader
        .chain(slot)
        .map(|s| s.ttl(TTL).lock_delay(Duration::ZERO).wait(Wait::Never))
        .collect()
}

/// Acquires every spec at once; all must succeed.
async fn acquire_all(consul: &Consul, specs: Vec<LeaseSpec>) -> Vec<Lease> {
    let mut acquiring = JoinSet::new();
    for spec in specs {
        let consul = consul.clone();
        acquiring.spawn(async move { consul.acquire(&spec).await });
    }
    let mut leases = Vec::new();
    while let Some(acquired) = acquiring.join_next().await {
        leases.push(acquired.unwrap().unwrap());
    }
    leases
}

/// An agent, a counting proxy in front of it, and a client with the default budget behind that.
async fn proxied() -> (Agent, Proxy, Consul) {
    init_tracing();
    let agent = Agent::start().await;
    let proxy = Proxy::start(agent.addr()).await.unwrap();
    let consul = Consul::builder().address(proxy.url()).build().unwrap();
    (agent, proxy, consul)
}

/// The first loss among `leases`, with its lease's index.
async fn first_loss(leases: &[Lease]) -> (usize, LostReason) {
    let mut losses = JoinSet::new();
    for (i, lease) in leases.iter().enumerate() {
        let lost = lease.lost();
        losses.spawn(async move { (i, lost.await) });
    }
    losses.join_next().await.unwrap().unwrap()
}

async fn release_all(leases: Vec<Lease>) {
    for lease in leases {
        lease.release().await.unwrap();
    }
}

#[tokio::test]
async fn three_hundred_leases_outlive_two_ttls_on_eight_connections() {
    let (_agent, proxy, consul) = proxied().await;

    let leases = acquire_all(&consul, specs("many", 150, 150, 15)).await;
    assert_eq!(leases.len(), 300);
    assert!(consul.prefix_watches() <= BUDGET - 2);

    let idle_from = proxy.requests();
    let held_for = 2 * TTL + Duration::from_secs(1);
    let lost = tokio::time::timeout(held_for, first_loss(&leases)).await;
    assert!(lost.is_err(), "a lease was lost while held: {lost:?}");
    assert!(leases.iter().all(Lease::is_held));

    let peak = proxy.peak_connections();
    assert!(peak <= BUDGET, "{peak} connections open at once");
    // One heartbeat per TTL/2 and a few watch renewals, not one renewal per lease per TTL/2
    // (which would be 300 × 21 s / 5 s = 1,260 requests).
    let idle_requests = proxy.requests() - idle_from;
    assert!(
        idle_requests <= 40,
        "{idle_requests} requests in {held_for:?} of holding"
    );
    release_all(leases).await;
}

#[tokio::test]
async fn an_agent_that_allows_twenty_connections_per_client_still_holds_a_hundred_leases() {
    init_tracing();
    let agent = Agent::start_with(AgentOptions {
        extra_hcl: Some("limits { http_max_conns_per_client = 20 }".into()),
        ..AgentOptions::default()
    })
    .await;
    // Two clients, as two processes on one host would have: 16 connections in all.
    let (a, b) = (agent.backend(), agent.backend());
    let mut leases = acquire_all(&a, specs("limited-a", 50, 0, 1)).await;
    leases.extend(acquire_all(&b, specs("limited-b", 0, 50, 10)).await);
    assert_eq!(leases.len(), 100);

    let lost = tokio::time::timeout(TTL + Duration::from_secs(1), first_loss(&leases)).await;
    assert!(lost.is_err(), "a lease was lost while held: {lost:?}");
    release_all(leases).await;
}

/// Widening the watches (quiet single-key watches absorbed into one, then new ones) must never
/// take the connections kept for requests that answer at once. Once, absorbed reads went on
/// blocking beside the watches that replaced them and held all seven request slots: acquisitions
/// hung, and the heartbeat check went critical one TTL later, losing every lease of the process.
/// (Absorbed reads now stop at once, and each watch holds a slot of its own.)
#[tokio::test]
async fn widening_the_watches_never_starves_other_requests() {
    init_tracing();
    let agent = Agent::start().await;
    let consul = agent.backend();
    let spec = |key: &str| {
        LeaseSpec::leader(key)
            .ttl(TTL)
            .lock_delay(Duration::ZERO)
            .wait(Wait::Never)
    };
    let mut held = Vec::new();
    let budget = BUDGET - 2;
    for i in 0..budget {
        held.push(
            consul
                .acquire(&spec(&format!("quiet/a/{i}")))
                .await
                .unwrap(),
        );
    }
    assert_eq!(
        consul.prefix_watches(),
        budget,
        "each quiet key is watched alone"
    );
    // Widens one watch to `quiet/a/`, absorbing the others, whose reads stop.
    held.push(consul.acquire(&spec("quiet/a/x")).await.unwrap());
    for key in ["quiet/b/0", "quiet/c/0", "quiet/c/1", "quiet/d/0"] {
        let lease = within(
            Duration::from_secs(5),
            "an acquisition while absorbed watches block",
            consul.acquire(&spec(key)),
        )
        .await
        .unwrap();
        held.push(lease);
    }
    for lease in &held {
        within(
            Duration::from_secs(5),
            "a check while absorbed watches block",
            lease.check(),
        )
        .await
        .unwrap();
    }
    // Past the heartbeat's TTL: the check was passed meanwhile.
    let lost = tokio::time::timeout(TTL + Duration::from_secs(2), first_loss(&held)).await;
    assert!(
        lost.is_err(),
        "a lease was lost while absorbed watches blocked: {lost:?}"
    );
    release_all(held).await;
}

#[tokio::test]
async fn an_operator_fault_on_one_lease_among_many_loses_exactly_that_lease() {
    init_tracing();
    let agent = Agent::start().await;
    let consul = agent.backend();
    let mut leases = acquire_all(&consul, specs("one", 100, 100, 10)).await;
    let mut observer = consul.observe_leader("one/leader/marker").await.unwrap();

    // An operator destroys a leader's session, deletes a leader key, releases a slot's
    // contender key, and destroys a slot's session.
    for (victim, fault) in [
        (37, "destroy"),
        (60, "delete"),
        (120, "release"),
        (150, "destroy"),
    ] {
        let sequencer = leases[victim].sequencer().clone();
        let session = sequencer.holder().to_owned();
        match fault {
            "destroy" => agent.destroy_session(&session).await,
            "delete" => agent.delete_key(sequencer.key()).await,
            _ => assert!(agent.release_key(sequencer.key(), &session).await),
        }
        let (lost, reason) = within(T, "the loss", first_loss(&leases)).await;
        assert_eq!(lost, victim, "the wrong lease was lost: {reason}");
        let lease = leases.remove(victim);
        assert!(!lease.is_held());

        // A later change under the same prefix, seen through the same watches: every other
        // lease has been shown the destruction by then, and is still held.
        let marker = format!("after-{fault}-{victim}");
        let spec = LeaseSpec::leader("one/leader/marker").value(marker.clone());
        let marking = consul.acquire(&spec).await.unwrap();
        within(
            T,
            "the marker",
            observer.wait_for(|l| l.is_some_and(|l| l.value_str() == Some(marker.as_str()))),
        )
        .await
        .unwrap();
        marking.release().await.unwrap();
        let still = leases.iter().filter(|l| l.is_held()).count();
        assert_eq!(still, leases.len(), "other leases were lost too");
    }
    release_all(leases).await;
}

#[tokio::test]
async fn a_refusing_agent_gets_at_most_twenty_requests_a_second_and_leases_self_fence_in_time() {
    let (_agent, proxy, consul) = proxied().await;
    let leases = acquire_all(&consul, specs("refused", 50, 50, 10)).await;

    let refused_at = Instant::now();
    let from = proxy.requests();
    proxy.set_mode(Mode::Refuse);
    // The last confirmation was sent before the fault: every fence deadline is within
    // TTL − 1 s of it.
    let fence_after = TTL - Duration::from_secs(1);
    let mut losses = JoinSet::new();
    for lease in &leases {
        let lost = lease.lost();
        losses.spawn(async move { (lost.await, Instant::now()) });
    }
    while let Some(lost) = within(T, "every lease to self-fence", losses.join_next()).await {
        let (reason, at) = lost.unwrap();
        assert!(
            matches!(reason, LostReason::SelfFenced { .. }),
            "lost for another reason: {reason}"
        );
        let late = at.saturating_duration_since(refused_at + fence_after);
        assert!(
            late < Duration::from_millis(500),
            "lost {late:?} after the fence deadline"
        );
    }
    let outage = refused_at.elapsed();
    let sent = proxy.requests() - from;
    let rate = sent as f64 / outage.as_secs_f64();
    assert!(
        rate <= 20.0,
        "{sent} requests in {outage:?} of outage ({rate:.1}/s)"
    );

    // What a new acquire says meanwhile names the agent's connection limit, whether the agent
    // drops connections or answers 429.
    for mode in [Mode::Refuse, Mode::Http429] {
        proxy.set_mode(mode);
        let error = consul
            .acquire(&specs("refused/new", 1, 0, 1).remove(0))
            .await
            .unwrap_err();
        assert!(
            error.to_string().contains("http_max_conns_per_client"),
            "{mode:?}: {error}"
        );
    }
    for lease in leases {
        assert!(matches!(lease.release().await, Err(Error::Lost(_))));
    }
}

/// (A stopped agent's "is it running?" is checked by `consul_faults::bad_input_gives_typed_errors`.)
#[tokio::test]
async fn an_error_names_dns_for_a_name_that_does_not_resolve() {
    init_tracing();
    let unresolvable = Consul::builder()
        .address("consul.does-not-exist.invalid:8500")
        .build()
        .unwrap();
    let error = unresolvable
        .acquire(&specs("errors", 1, 0, 1).remove(0))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("DNS"), "{error}");
    assert!(!error.to_string().contains("is it running?"), "{error}");
}

#[tokio::test]
async fn two_processes_on_one_agent_hold_a_hundred_and_fifty_leases_each() {
    init_tracing();
    let agent = Agent::start().await;
    // The workers are started without the run, for their stdout; the run's directory takes their
    // panic records, and dropping the run fails the test on one.
    let run = Run::new("consul-scale", "two_processes", WORKER.as_ref());
    let mut workers = Vec::new();
    for (name, limit) in [("procs-a", None), ("procs-b", Some("10"))] {
        let mut command = Command::new(WORKER);
        command.env(lease_tests::panics::DIR_ENV, &run.dir);
        command.args([
            "--consul",
            &agent.url(),
            "--key",
            name,
            "--mode",
            "hold-many",
        ]);
        command.args(["--count", "150", "--ttl", "10", "--history", "/dev/null"]);
        if let Some(limit) = limit {
            command.args(["--limit", limit]);
        }
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        workers.push((child, lines));
    }
    for (_, lines) in &mut workers {
        let line = within(T, "a worker to hold its leases", lines.next_line()).await;
        assert_eq!(line.unwrap().as_deref(), Some("held 150"));
    }
    // Held past a TTL, then asked to stop: each still holds all of its leases.
    let idle = tokio::time::timeout(TTL + Duration::from_secs(1), async {
        for (child, _) in &mut workers {
            let _ = child.wait().await;
        }
    })
    .await;
    assert!(idle.is_err(), "a worker exited on its own");
    for (child, lines) in &mut workers {
        let pid = child.id().unwrap().to_string();
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .await
            .unwrap();
        let line = within(T, "a worker to report", lines.next_line()).await;
        assert_eq!(line.unwrap().as_deref(), Some("still held 150"));
        within(T, "a worker to exit", child.wait()).await.unwrap();
    }
}
