//! `lease` on bad input: each mistake gets a message that says what to do, its exit code, and
//! no child is started. Also the unreachable backends (nothing listens on port 1).

// A test that unwraps is a test that fails loudly.
#![allow(clippy::unwrap_used)]

mod support;

use support::*;

/// Runs `lease ARGS` whose command would create a marker file, and returns the code and stderr
/// after checking that the marker was not created.
async fn refused(args: &[&str]) -> (Option<i32>, String) {
    let scratch = Scratch::new("bad-input");
    let marker = scratch.path("started");
    let marker = marker.to_str().unwrap();
    let args: Vec<&str> = args
        .iter()
        .map(|a| if *a == "MARKER" { marker } else { a })
        .collect();
    let mut cmd = lease_cmd();
    cmd.args(&args);
    let out = output(cmd, &format!("lease {args:?}")).await;
    assert!(
        !std::path::Path::new(marker).exists(),
        "lease {args:?} started its child"
    );
    code_and_stderr(&out)
}

#[tokio::test]
async fn bad_input_is_refused_with_a_message_and_its_code() {
    let cases: &[(&[&str], i32, &str)] = &[
        (
            &["lock", "jobs/a", "touch", "MARKER"],
            64,
            "put `--` between KEY and the command",
        ),
        (
            &["lock", "--bogus", "jobs/a", "--", "touch", "MARKER"],
            64,
            "unexpected argument '--bogus'",
        ),
        (
            &["lock", "jobs//a", "--", "touch", "MARKER"],
            64,
            "invalid lease key \"jobs//a\"",
        ),
        (
            &["lock", "/jobs/a", "--", "touch", "MARKER"],
            64,
            "remove the leading '/'",
        ),
        (
            &["lock", "-try", "5 sec", "jobs/a", "--", "touch", "MARKER"],
            64,
            "invalid duration \"5 sec\"",
        ),
        (
            &["lock", "--ttl", "3s", "jobs/a", "--", "touch", "MARKER"],
            64,
            "--ttl 3s",
        ),
        (
            &["lock", "--grace", "10s", "jobs/a", "--", "touch", "MARKER"],
            64,
            "--grace 10s is too long",
        ),
        (
            &["lock", "-n", "0", "jobs/a", "--", "touch", "MARKER"],
            64,
            "0 is not in 1..",
        ),
        (&["lock", "jobs/a", "--"], 64, "no command after `--`"),
        (
            &["lock", "jobs/a", "--", "touch", "MARKER"],
            125,
            "cannot reach Consul at http://127.0.0.1:1",
        ),
        (
            &[
                "lock",
                "--amqp",
                "amqp://guest:guest@127.0.0.1:1/%2f",
                "jobs/a",
                "--",
                "touch",
                "MARKER",
            ],
            125,
            "cannot reach RabbitMQ",
        ),
        (
            &["lock", "--etcd", "", "jobs/a", "--", "touch", "MARKER"],
            64,
            "--etcd: give etcd's client URL",
        ),
        (
            &[
                "lock", "--etcd", "ftp://x", "jobs/a", "--", "touch", "MARKER",
            ],
            64,
            "invalid etcd endpoint \"ftp://x\" (--etcd)",
        ),
        (
            &[
                "lock",
                "--etcd",
                "http://127.0.0.1:1",
                "--consul",
                "127.0.0.1:1",
                "jobs/a",
                "--",
                "touch",
                "MARKER",
            ],
            64,
            "cannot be used with",
        ),
        (
            &[
                "status",
                "-n",
                "2",
                "--etcd",
                "http://127.0.0.1:1",
                "jobs/a",
            ],
            64,
            "-n on etcd",
        ),
        (
            &[
                "check",
                "--etcd",
                "http://127.0.0.1:1",
                "etcd:5:694d:jobs/a",
            ],
            2,
            "cannot reach etcd at http://127.0.0.1:1",
        ),
        (
            &["check", "--consul", "127.0.0.1:1", "etcd:5:694d:jobs/a"],
            2,
            "checked with etcd: drop --consul",
        ),
        (&["status", "jobs/a"], 2, "cannot reach Consul"),
        (
            &["check", "consul:1:abc:jobs/a/.lock"],
            2,
            "cannot reach Consul",
        ),
    ];
    for (args, code, needle) in cases {
        let (got, stderr) = refused(args).await;
        assert_eq!(got, Some(*code), "lease {args:?}: {stderr}");
        assert!(
            stderr.contains(needle),
            "lease {args:?}: expected {needle:?} in:\n{stderr}"
        );
    }
}

#[tokio::test]
async fn help_documents_examples_exit_codes_and_the_single_dash_flags() {
    let out = output(
        {
            let mut c = lease_cmd();
            c.args(["lock", "--help"]);
            c
        },
        "lease lock --help",
    )
    .await;
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "Examples:",
        "Exit codes",
        "124",
        "LEASE_SEQUENCER",
        "SIGKILL after --grace",
        "-try 5s",
        "--etcd <URL>",
        "LEASE_ETCD_ENDPOINTS",
        "etcdctl lock",
        // What --lock-delay does on each backend (it is not Consul's alone).
        "PostgreSQL: how long a holder's row deleted under it",
        "etcd and RabbitMQ have no lock-delay",
        // The grace after a forwarded signal, and the backend passed to the command.
        "a group still running --grace later is killed",
        "--postgres as LEASE_POSTGRES_URL",
        "a database that does not exist",
    ] {
        assert!(
            help.contains(needle),
            "{needle:?} missing from lease lock --help:\n{help}"
        );
    }
    assert!(!help.contains("Consul\n          only"), "{help}");
    assert!(!help.contains("Consul only"), "{help}");
}
