//! `lease amqp …` and `lease lock --amqp` against the real RabbitMQ.

// A test that unwraps is a test that fails loudly.
#![allow(clippy::unwrap_used)]

mod support;

use lease_tests::amqp::{queues, require_broker, unique, url};

use support::*;

fn lease_amqp(args: &[&str]) -> tokio::process::Command {
    let mut c = lease_cmd();
    c.args(args).env("AMQP_URL", url());
    c
}

#[tokio::test]
async fn administers_a_semaphore_and_guards_a_command_on_it() {
    require_broker().await;
    let name = unique("cli");
    let run = |args: &[&str]| output(lease_amqp(args), "lease amqp");

    let out = run(&["amqp", "create", &name, "2"]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = run(&["amqp", "add", &name, "1"]).await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{name}: 3 slots")
    );

    // A guarded command on it gets an AMQP sequencer, and leaves no holder queue.
    let amqp_url = url();
    let out = run(&[
        "lock",
        "--amqp",
        &amqp_url,
        "-n",
        "3",
        &name,
        "--",
        "sh",
        "-c",
        "echo $LEASE_SEQUENCER; exit 3",
    ])
    .await;
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let sequencer: lease_core::Sequencer =
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert_eq!(sequencer.key(), name);
    let out = run(&["status", "--amqp", &amqp_url, "--json", &name]).await;
    assert_eq!(out.status.code(), Some(1), "nobody holds it: {out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["limit"], 3);

    let out = run(&["amqp", "remove", &name, "1"]).await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{name}: 2 slots")
    );
    let out = run(&["amqp", "wait", &name, "3", "--timeout", "5s"]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = run(&["amqp", "destroy", &name]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(queues(&name), Vec::new(), "queues left behind");
    let out = run(&["amqp", "create", &name, "0"]).await;
    assert_eq!(out.status.code(), Some(64), "{out:?}");
}
