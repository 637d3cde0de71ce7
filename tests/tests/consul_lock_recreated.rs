//! Consul keys deleted and re-created by an operator.
//!
//! - A semaphore's `.lock` deleted while `consul lock -n` shares it with us.
//! - A leader key deleted under its holder and re-created by the next holder: its LockIndex
//!   restarts at 1, its CreateIndex rises, and the fence (lease-postgres, with the advance at
//!   acquisition) accepts the new holder's writes and refuses the old one's.
//!
//! A holder whose `.lock` was deleted may still be stopping its work: our contenders wait the
//! settle time (the lock-delay, for a deletion) before anyone of ours is admitted. `consul lock -n`
//! does not wait: it re-creates `.lock` at once. That must not end our settle early. Worker
//! processes of ours and `consul lock -n` loops share one semaphore; an operator deletes `.lock`
//! 20 times; judged from the processes' histories and the holder sets `.lock` recorded.

use std::collections::BTreeSet;
use std::time::Duration;

use base64::Engine;
use lease_tests::chaos::spawn_consul_lock_loop;
use lease_tests::consul::Agent;
use lease_tests::history::Kind;
use lease_tests::init_tracing;
use lease_tests::overlap::now_ns;
use lease_tests::workers::{Run, wait_for_async};
use tokio::time::Instant;

const PREFIX: &str = "settle/mixed";
const LIMIT: u32 = 3;
const DELETIONS: usize = 20;
/// Our lock-delay, and so our settle after a deletion.
const SETTLE: Duration = Duration::from_millis(600);

/// `.lock`'s ModifyIndex and the sessions its `Holders` names, if it exists.
async fn lock_holders(agent: &Agent) -> Option<(u64, BTreeSet<String>)> {
    let entry = agent.key(&format!("{PREFIX}/.lock")).await;
    let index = entry["ModifyIndex"].as_u64()?;
    let value = base64::engine::general_purpose::STANDARD
        .decode(entry["Value"].as_str().unwrap_or_default())
        .unwrap_or_default();
    let value: serde_json::Value = serde_json::from_slice(&value).unwrap_or_default();
    let holders = match &value["Holders"] {
        serde_json::Value::Object(map) => map.keys().cloned().collect(),
        serde_json::Value::Array(list) => list
            .iter()
            .filter_map(|h| h.as_str().map(str::to_owned))
            .collect(),
        _ => BTreeSet::new(),
    };
    Some((index, holders))
}

#[tokio::test]
async fn a_lock_recreated_by_consul_lock_does_not_end_our_settle() {
    init_tracing();
    let agent = Agent::start().await;
    let mut run = Run::new(
        "consul-lock-recreated",
        "settle",
        env!("CARGO_BIN_EXE_lease-worker").as_ref(),
    );
    let ours: Vec<usize> = (0..3)
        .map(|i| {
            let args = [
                "--consul",
                &agent.url(),
                "--key",
                PREFIX,
                "--limit",
                &LIMIT.to_string(),
                "--lock-delay",
                &SETTLE.as_millis().to_string(),
                "--hold-ms",
                "300",
            ]
            .map(str::to_owned);
            run.spawn(&format!("ours-{i}"), &args)
        })
        .collect();
    for i in 0..2 {
        spawn_consul_lock_loop(
            &mut run,
            &format!("consul-lock-{i}"),
            agent.addr(),
            PREFIX,
            Some(LIMIT),
            300,
        );
    }

    // Each deletion: `.lock` as it stood (its holders), deleted with a compare-and-set so no
    // admission slips in between the read and the delete.
    let mut deletions: Vec<(u128, BTreeSet<String>)> = Vec::new();
    let mut last = Instant::now();
    while deletions.len() < DELETIONS {
        let (index, holders) = wait_for_async(
            Duration::from_secs(30),
            || format!("`.lock` to be written again; {}", run.files()),
            || async { lock_holders(&agent).await.filter(|(_, h)| !h.is_empty()) },
        )
        .await;
        if last.elapsed() < SETTLE + Duration::from_millis(300) {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        let at = now_ns();
        if agent
            .delete_key_cas(&format!("{PREFIX}/.lock"), index)
            .await
        {
            deletions.push((at, holders));
            last = Instant::now();
        }
        run.assert_alive();
    }
    run.terminate_all().await.unwrap();

    let history = run.all();
    let our_pids: BTreeSet<u32> = ours.iter().map(|&i| run.pid(i)).collect();
    let settle_ns = SETTLE.as_nanos();
    let mut early = Vec::new();
    let mut admitted_after = 0;
    for line in history.lines() {
        if line.kind != Kind::Acquired || !our_pids.contains(&line.pid) {
            continue;
        }
        let Ok(seq) = line.seq.parse::<lease_core::Sequencer>() else {
            continue;
        };
        for (at, holders) in &deletions {
            // Admitted after the deletion (every earlier admission is in the holders it deleted)
            // and before the settle could have passed.
            if line.t > *at && !holders.contains(seq.holder()) {
                admitted_after += 1;
                if line.t < at + settle_ns {
                    early.push(format!(
                        "{} admitted {:.1} ms after a deletion",
                        line.seq,
                        (line.t - at) as f64 / 1e6
                    ));
                }
            }
        }
    }
    assert!(
        early.is_empty(),
        "ours were admitted within the {SETTLE:?} settle after a deletion:\n{}\n{}",
        early.join("\n"),
        run.files()
    );
    assert!(
        admitted_after > 0,
        "none of ours was admitted after a deletion"
    );
    let overlap = history.max_concurrent_writers(LIMIT as usize);
    eprintln!(
        "{DELETIONS} deletions; at most {} writers at once (ours and consul lock's)",
        overlap.count
    );
}

/// The fence stays live after an operator deletes a leader key: the next holder's sequencer
/// (the re-created key's CreateIndex, then its LockIndex, restarted at 1) orders after the old
/// one's, so the new holder's advance and writes pass and the old holder's are refused. Takes
/// about a second.
#[tokio::test]
async fn a_leader_key_recreated_after_an_operator_deletes_it_fences_the_old_holder() {
    use lease_core::{Backend, LeaseSpec, LostReason};
    use lease_postgres::fence;

    init_tracing();
    let agent = Agent::start().await;
    let db = lease_tests::postgres::TestDb::create("consul_recreated_fence").await;
    let mut client = db.connect().await;
    fence::tokio_postgres::install(&client).await.unwrap();
    let backend = fence::tokio_postgres::advance_on_acquire(
        agent.backend(),
        std::sync::Arc::new(db.connect().await),
    );
    let key = "fence/recreated";
    let spec = LeaseSpec::leader(key).lock_delay(Duration::ZERO);
    // A few acquisitions first, so the old key's LockIndex is well above 1.
    for _ in 0..3 {
        backend
            .acquire(&spec)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let old = backend.acquire(&spec).await.unwrap();
    let old_seq = old.sequencer().clone();
    write(&mut client, &old_seq).await.unwrap();

    agent.delete_key(key).await;
    let reason = tokio::time::timeout(Duration::from_secs(10), old.lost())
        .await
        .expect("the old holder learns that its key was deleted");
    assert_eq!(reason, LostReason::KeyDeleted);
    let new = backend
        .acquire(&spec)
        .await
        .expect("the fence lets the next holder acquire");
    let new_seq = new.sequencer().clone();
    assert!(
        new_seq.index() < old_seq.index() && new_seq.generation() > old_seq.generation(),
        "the re-created key restarts its LockIndex and raises its CreateIndex: {old_seq} then {new_seq}"
    );
    assert!(new_seq.order() > old_seq.order());
    write(&mut client, &new_seq)
        .await
        .expect("the new holder's write passes");
    let refused = write(&mut client, &old_seq).await.unwrap_err();
    assert!(
        matches!(refused, fence::Error::Stale { .. }),
        "the old holder's write: {refused:?}"
    );
    eprintln!("old {old_seq}, new {new_seq}: the old holder is refused, the new one writes");
    new.release().await.unwrap();
    drop(old);
}

/// One fenced transaction of `seq`.
async fn write(
    client: &mut tokio_postgres::Client,
    seq: &lease_core::Sequencer,
) -> Result<(), lease_postgres::fence::Error> {
    let tx = client.transaction().await.unwrap();
    lease_postgres::fence::tokio_postgres::fence(&tx, seq).await?;
    tx.commit().await.unwrap();
    Ok(())
}
