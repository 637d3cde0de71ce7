//! Consul over TLS against a real 1.8.7 agent serving HTTPS with `verify_incoming` (clients must
//! present a certificate signed by its CA), with certificates made in the test by `consul tls`;
//! and `CONSUL_NAMESPACE` on an open-source agent, which has no namespaces.
// A failed expectation in a test is a panic by design.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use lease_consul::{Consul, ConsulBuilder};
use lease_core::{Backend, Error, LeaseSpec, Wait};
use lease_tests::capture::Capture;
use lease_tests::consul::{Agent, AgentOptions, AgentTls};
use lease_tests::{init_tracing, within};
use tracing::Level;

const T: Duration = Duration::from_secs(30);

async fn tls_agent() -> (Agent, AgentTls) {
    let tls = AgentTls::create().await;
    let agent = Agent::start_with(AgentOptions {
        tls: Some(tls.clone()),
        ..AgentOptions::default()
    })
    .await;
    (agent, tls)
}

/// A builder for the agent's HTTPS address (as `127.0.0.1`, which its certificate names).
fn https(agent: &Agent) -> ConsulBuilder {
    Consul::builder().address(format!("https://{}", agent.https_addr()))
}

/// Takes and gives back a leader lease: one session, one lock, one release over the wire.
async fn round_trip(consul: &Consul) -> Result<(), Error> {
    let key = format!("test/tls/{}", lease_tests::amqp::unique("k"));
    let lease = within(
        T,
        "an acquire over TLS",
        consul.acquire(&LeaseSpec::leader(key).wait(Wait::Never)),
    )
    .await?;
    lease.release().await
}

#[tokio::test]
async fn mutual_tls_with_the_agents_ca_and_a_client_certificate() {
    init_tracing();
    let (agent, tls) = tls_agent().await;
    let consul = https(&agent)
        .ca_cert(&tls.ca)
        .client_cert(&tls.client_cert, &tls.client_key)
        .build()
        .unwrap();
    round_trip(&consul).await.unwrap();

    // Without a client certificate, the agent refuses the handshake.
    let refused = https(&agent).ca_cert(&tls.ca).build().unwrap();
    let error = round_trip(&refused).await.unwrap_err();
    assert!(error.is_transient(), "{error:?}");
    assert!(error.to_string().contains("CONSUL_CLIENT_CERT"), "{error}");

    // Without the CA, the agent's certificate is not trusted.
    let untrusted = https(&agent)
        .client_cert(&tls.client_cert, &tls.client_key)
        .build()
        .unwrap();
    let error = round_trip(&untrusted).await.unwrap_err();
    let message = error.to_string();
    assert!(message.contains("UnknownIssuer"), "{message}");
    assert!(message.contains("the TLS handshake failed"), "{message}");
    assert!(message.contains("CONSUL_CACERT"), "{message}");
}

#[tokio::test]
async fn the_tls_server_name_is_what_the_certificate_is_checked_against() {
    init_tracing();
    let (agent, tls) = tls_agent().await;
    let with_name = |name: &str| {
        https(&agent)
            .ca_cert(&tls.ca)
            .client_cert(&tls.client_cert, &tls.client_key)
            .tls_server_name(name)
            .build()
            .unwrap()
    };
    // The name the agent's certificate carries; the connection still goes to 127.0.0.1.
    round_trip(&with_name("server.dc1.consul")).await.unwrap();
    // A name it does not carry.
    let error = round_trip(&with_name("other.dc1.consul"))
        .await
        .unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("not valid for name \"other.dc1.consul\""),
        "{message}"
    );
    assert!(message.contains("CONSUL_TLS_SERVER_NAME"), "{message}");

    // A server name needs https.
    let plain = Consul::builder()
        .address(agent.url())
        .tls_server_name("server.dc1.consul")
        .build()
        .unwrap_err();
    assert!(
        plain.to_string().contains("needs an https address"),
        "{plain}"
    );
}

#[tokio::test]
async fn ssl_verify_off_accepts_the_agents_certificate_without_its_ca() {
    init_tracing();
    let (agent, tls) = tls_agent().await;
    let consul = https(&agent)
        .ssl_verify(false)
        .client_cert(&tls.client_cert, &tls.client_key)
        .build()
        .unwrap();
    round_trip(&consul).await.unwrap();
}

#[tokio::test]
async fn an_http_client_of_your_own() {
    init_tracing();
    let (agent, tls) = tls_agent().await;
    let read = |path: &std::path::Path| std::fs::read(path).unwrap();
    let mut identity = read(&tls.client_cert);
    identity.extend(read(&tls.client_key));
    let client = reqwest::Client::builder()
        .tls_backend_rustls()
        .add_root_certificate(reqwest::Certificate::from_pem(&read(&tls.ca)).unwrap())
        .identity(reqwest::Identity::from_pem(&identity).unwrap())
        .connect_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let consul = https(&agent).http_client(client.clone()).build().unwrap();
    round_trip(&consul).await.unwrap();

    // Settings the client itself carries cannot also be given to the builder.
    let both = https(&agent)
        .http_client(client)
        .ca_cert(&tls.ca)
        .build()
        .unwrap_err();
    let message = both.to_string();
    assert!(message.contains("ca_cert (CONSUL_CACERT)"), "{message}");
    assert!(
        message.contains("configure it on that reqwest::Client"),
        "{message}"
    );
}

/// Consul's open-source edition answers `?ns=` with 400: the client drops the namespace after
/// that first answer, says so once at DEBUG, and works in the default namespace.
#[tokio::test(flavor = "current_thread")]
async fn a_namespace_on_an_open_source_agent_is_dropped_once_with_a_debug_event() {
    let (capture, _guard) = Capture::scoped();
    let agent = Agent::start().await;
    let consul = Consul::builder()
        .address(agent.url())
        .namespace("team-a")
        .build()
        .unwrap();
    round_trip(&consul).await.unwrap();
    round_trip(&consul).await.unwrap();
    let dropped = capture.events_containing("refused the namespace");
    assert_eq!(dropped.len(), 1, "{dropped:?}");
    assert_eq!(dropped[0].level, Level::DEBUG);
}
