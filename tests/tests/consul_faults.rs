//! The Consul leader lease under faults, interoperating with `consul lock`, and on bad input.

use std::time::Duration;

use lease_consul::Consul;
use lease_core::{Backend, Error, LeaseSpec, LostReason, Wait};
use lease_tests::consul::{Agent, AgentOptions};
use lease_tests::proxy::Proxy;
use lease_tests::{init_tracing, release_lost, within};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::Instant;

const T: Duration = Duration::from_secs(30);
const TTL: Duration = Duration::from_secs(10);

fn spec(key: &str) -> LeaseSpec {
    LeaseSpec::leader(key).lock_delay(Duration::ZERO).ttl(TTL)
}

#[tokio::test]
async fn consul_lock_and_our_lease_exclude_each_other() {
    init_tracing();
    let agent = Agent::start().await;
    let backend = agent.backend();

    // consul lock PREFIX holds PREFIX/.lock: while its child runs, we are busy.
    let mut holder = agent
        .command()
        .args(["lock", "interop", "echo held; exec sleep 30"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    within(T, "consul lock to run its child", async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line == "held" {
                return;
            }
        }
        panic!("consul lock exited without running its child");
    })
    .await;
    let err = backend
        .acquire(&spec("interop/.lock").wait(Wait::UpTo(Duration::from_millis(500))))
        .await
        .unwrap_err();
    assert!(err.is_busy(), "{err}");
    // Interrupted, consul lock stops its child and releases the lock (no lock-delay).
    let pid = holder.id().unwrap().to_string();
    let killed = tokio::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .await
        .unwrap();
    assert!(killed.success());
    within(T, "consul lock to exit", holder.wait())
        .await
        .unwrap();

    // We hold it: consul lock does not run its child.
    let lease = backend
        .acquire(&spec("interop/.lock").wait(Wait::UpTo(Duration::from_secs(20))))
        .await
        .unwrap();
    let marker = std::env::temp_dir().join(format!("lease-interop-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let status = agent
        .command()
        .args(["lock", "-timeout", "1s", "interop"])
        .arg("touch")
        .arg(&marker)
        .status()
        .await
        .unwrap();
    assert!(
        !status.success(),
        "consul lock claims to have run its child"
    );
    assert!(
        !marker.exists(),
        "consul lock ran its child while we held the lock"
    );
    assert!(lease.is_held());
    lease.check().await.unwrap();
    lease.release().await.unwrap();
}

#[tokio::test]
async fn lock_delay_zero_and_two_seconds_are_honoured_after_invalidation() {
    init_tracing();
    let agent = Agent::start().await;
    let backend = agent.backend();

    // Zero really means zero: the key can be taken again at once.
    let lease = backend.acquire(&spec("delay/zero")).await.unwrap();
    agent.destroy_session(lease.sequencer().holder()).await;
    within(T, "loss", lease.lost()).await;
    let again = backend
        .acquire(&spec("delay/zero").wait(Wait::Never))
        .await
        .unwrap();
    again.release().await.unwrap();

    // Two seconds: refused at once, granted after the delay, not before.
    let lease = backend
        .acquire(&spec("delay/two").lock_delay(Duration::from_secs(2)))
        .await
        .unwrap();
    agent.destroy_session(lease.sequencer().holder()).await;
    let invalidated = Instant::now();
    within(T, "loss", lease.lost()).await;
    let err = backend
        .acquire(&spec("delay/two").wait(Wait::Never))
        .await
        .unwrap_err();
    assert!(err.is_busy(), "{err}");
    let again = within(
        T,
        "acquire after lock-delay",
        backend.acquire(&spec("delay/two")),
    )
    .await
    .unwrap();
    assert!(
        invalidated.elapsed() >= Duration::from_millis(1900),
        "acquired {:?} after invalidation, inside the 2 s lock-delay",
        invalidated.elapsed()
    );
    again.release().await.unwrap();
}

#[tokio::test]
async fn partition_self_fences_before_the_ttl() {
    init_tracing();
    let agent = Agent::start().await;
    let proxy = Proxy::start(agent.addr()).await.unwrap();
    let backend = Consul::builder().address(proxy.url()).build().unwrap();
    let lease = backend.acquire(&spec("fence/leader")).await.unwrap();
    let session = lease.sequencer().holder().to_owned();

    proxy.set_blackhole(true);
    let cut_off = Instant::now();
    let reason = within(T, "self-fencing", lease.lost()).await;
    let lost_after = cut_off.elapsed();
    let LostReason::SelfFenced { unconfirmed_for } = reason else {
        panic!("expected SelfFenced, got {reason:?}");
    };
    assert!(
        unconfirmed_for < TTL,
        "fenced {unconfirmed_for:?} after the last confirmation"
    );
    assert!(
        lost_after < TTL,
        "fenced {lost_after:?} after the partition began"
    );
    // Consul had not invalidated the session yet: we gave up before it could hand the lease over.
    assert!(
        agent.sessions().await.contains(&session),
        "Consul expired the session first"
    );
    proxy.set_blackhole(false);
    release_lost(lease).await;
}

#[tokio::test]
async fn a_burst_of_500s_does_not_lose_the_lease() {
    init_tracing();
    let agent = Agent::start().await;
    let proxy = Proxy::start(agent.addr()).await.unwrap();
    let backend = Consul::builder().address(proxy.url()).build().unwrap();
    let lease = backend.acquire(&spec("burst/leader")).await.unwrap();

    proxy.set_http_500(true);
    // Hold the fault until both the watch and a heartbeat have been refused.
    within(
        T,
        "a watch request to meet the fault",
        proxy.answered_500("/v1/kv/burst/"),
    )
    .await;
    within(
        T,
        "a heartbeat to meet the fault",
        proxy.answered_500("/v1/agent/check/pass/"),
    )
    .await;
    proxy.set_http_500(false);

    assert!(
        lease.is_held(),
        "lost on a brief fault: {:?}",
        lease.lost_reason()
    );
    lease.check().await.unwrap();
    assert!(lease.is_held());
    lease.release().await.unwrap();
}

/// An agent with ACLs on (default deny), a token with these `rules`, and a client that uses it.
async fn with_token(rules: &str) -> (Agent, String, Consul) {
    let agent = Agent::start_with(AgentOptions {
        acl_master_token: Some("root-token-for-tests".into()),
        ..AgentOptions::default()
    })
    .await;
    let token = agent.create_token(rules).await;
    let backend = Consul::builder()
        .address(agent.url())
        .token(&token)
        .build()
        .unwrap();
    (agent, token, backend)
}

/// A token that may not read where the other kind of lock would be (`<key>/.lock` for a leader,
/// the prefix's own key for a semaphore) cannot have Consul check that key, and still acquires,
/// unchecked, as before the check existed.
#[tokio::test]
async fn a_token_that_may_not_read_the_other_kinds_key_still_acquires() {
    init_tracing();
    let (agent, _, backend) = with_token(
        r#"session_prefix "" { policy = "write" } key "exact/leader" { policy = "write" }
           key_prefix "jobs/" { policy = "write" }"#,
    )
    .await;
    for _ in 0..2 {
        let lease = backend.acquire(&spec("exact/leader")).await.unwrap();
        lease.release().await.unwrap();
        let slot = LeaseSpec::semaphore("jobs", 2)
            .lock_delay(Duration::ZERO)
            .ttl(TTL);
        let lease = backend.acquire(&slot).await.unwrap();
        lease.release().await.unwrap();
    }
    assert!(agent.sessions().await.is_empty(), "sessions left behind");
}

#[tokio::test]
async fn a_token_without_write_on_the_key_gets_a_permission_error_naming_it() {
    init_tracing();
    let (agent, token, backend) = with_token(
        r#"session_prefix "" { policy = "write" } key_prefix "open/" { policy = "write" }"#,
    )
    .await;

    let lease = backend.acquire(&spec("open/leader")).await.unwrap();
    lease.release().await.unwrap();

    // The same token from a file (CONSUL_HTTP_TOKEN_FILE), trailing newline and all.
    let token_file = std::env::temp_dir().join(format!("lease-token-{}", std::process::id()));
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let from_file = Consul::builder()
        .address(agent.url())
        .token_file(&token_file)
        .build()
        .unwrap();
    let lease = from_file.acquire(&spec("open/leader")).await.unwrap();
    lease.release().await.unwrap();
    std::fs::remove_file(&token_file).unwrap();
    let missing = Consul::builder()
        .token_file(&token_file)
        .build()
        .unwrap_err();
    assert!(
        matches!(&missing, Error::Config { message: m, .. } if m.contains("CONSUL_HTTP_TOKEN_FILE")),
        "{missing}"
    );

    let err = backend.acquire(&spec("closed/leader")).await.unwrap_err();
    match &err {
        Error::PermissionDenied { operation, .. } => {
            assert!(operation.contains("closed/leader"), "{err}")
        }
        other => panic!("expected PermissionDenied, got {other:?}"),
    }
    assert!(
        !err.to_string().contains(&token),
        "the token leaked into an error"
    );
    assert!(
        !format!("{backend:?}").contains(&token),
        "the token leaked into Debug"
    );
    assert!(
        agent.sessions().await.is_empty(),
        "the refused attempt left a session"
    );
}

#[tokio::test]
async fn bad_input_gives_typed_errors() {
    init_tracing();
    let agent = Agent::start().await;
    let backend = agent.backend();
    let cases = [
        (LeaseSpec::leader(""), "empty key"),
        (LeaseSpec::leader("/abs/key"), "leading slash"),
        (spec("k").ttl(Duration::from_secs(5)), "ttl 5s"),
        (
            spec("k").lock_delay(Duration::from_secs(61)),
            "lock-delay 61s",
        ),
    ];
    for (spec, what) in cases {
        let err = backend.acquire(&spec).await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidKey { .. }
                    | Error::InvalidTtl { .. }
                    | Error::InvalidLockDelay { .. }
            ),
            "{what}: {err:?}"
        );
    }
    assert!(agent.sessions().await.is_empty());

    // A key that already carries something else is never taken over.
    agent.put_key("plain/key", b"data", 0).await;
    let err = backend
        .acquire(&spec("plain/key").wait(Wait::Never))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::FlagsConflict { found: 0, .. }),
        "{err:?}"
    );
    assert_eq!(agent.key("plain/key").await["Value"], "ZGF0YQ==");

    // Nothing listens on this port.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let nowhere = Consul::builder()
        .address(closed.to_string())
        .build()
        .unwrap();
    let err = nowhere
        .acquire(&spec("k").wait(Wait::Never))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unreachable { .. }), "{err:?}");
    // The address came from the builder: the hint names the builder call, not the variable.
    assert!(!err.to_string().contains("CONSUL_HTTP_ADDR"), "{err}");
    assert!(err.to_string().contains("ConsulBuilder::address"), "{err}");
    assert!(err.to_string().contains("is it running?"), "{err}");

    assert!(Consul::builder().address("ftp://x").build().is_err());
}
