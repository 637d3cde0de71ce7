//! The fence with leases on PostgreSQL itself (`Postgres`, feature `backend`) in the database of
//! the data: the advance in the acquiring transaction (`PostgresBuilder::advance_fence`), and the
//! fence on the holder's own lease row (`fence_held`). Against a real PostgreSQL, a database per
//! test; every wait bounded and on an event (a call blocked on a lock, an answer).
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use lease_core::{Backend, LeaseSpec, Sequencer, Wait};
use lease_postgres::Postgres;
use lease_postgres::fence::{self, Error};
use lease_tests::postgres::{TestDb, backend_pid, wait_until_blocked};
use lease_tests::within;
use tokio_postgres::Client;

const KEY: &str = "jobs/ledger";
const STEP: Duration = Duration::from_secs(10);

async fn setup(test: &str) -> (TestDb, Client) {
    let db = TestDb::create(test).await;
    let client = db.connect().await;
    fence::tokio_postgres::install(&client).await.unwrap();
    client
        .batch_execute("CREATE TABLE protected (id bigserial PRIMARY KEY, holder text NOT NULL)")
        .await
        .unwrap();
    (db, client)
}

fn backend(db: &TestDb, advance: bool) -> Postgres {
    Postgres::builder()
        .url(db.url())
        .advance_fence(advance)
        .build()
        .unwrap()
}

enum Via {
    Index,
    Held,
}

async fn fenced_write(client: &mut Client, seq: &Sequencer, via: Via) -> Result<(), Error> {
    let tx = client.transaction().await.unwrap();
    match via {
        Via::Index => fence::tokio_postgres::fence(&tx, seq).await?,
        Via::Held => fence::tokio_postgres::fence_held(&tx, seq).await?,
    }
    tx.execute(
        "INSERT INTO protected (holder) VALUES ($1)",
        &[&seq.holder()],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    Ok(())
}

#[tokio::test]
async fn the_acquiring_transaction_advances_the_fence() {
    let (db, mut client) = setup("advance_in_acquire").await;
    for advance in [false, true] {
        let key = format!("{KEY}/{advance}");
        let old_backend = backend(&db, false);
        let old = old_backend.acquire(&LeaseSpec::leader(&key)).await.unwrap();
        let stale = old.sequencer().clone();
        fenced_write(&mut client, &stale, Via::Index).await.unwrap();
        old.release().await.unwrap();
        let new_backend = backend(&db, advance);
        let new = new_backend.acquire(&LeaseSpec::leader(&key)).await.unwrap();
        // The new holder has not written: only the advance can refuse the old one now.
        let old_write = fenced_write(&mut client, &stale, Via::Index).await;
        if advance {
            let err = old_write.unwrap_err();
            assert!(matches!(err, Error::Stale { .. }), "{err:?}");
            let recorded: String = client
                .query_one(
                    "SELECT holder FROM lease_fence.fences WHERE lease_key = $1",
                    &[&key],
                )
                .await
                .unwrap()
                .get(0);
            assert_eq!(recorded, new.sequencer().holder());
        } else {
            old_write.expect("without the advance, the old holder writes until the new one has");
        }
        fenced_write(&mut client, new.sequencer(), Via::Index)
            .await
            .unwrap();
        new.release().await.unwrap();
        old_backend.shutdown().await;
        new_backend.shutdown().await;
    }
}

#[tokio::test]
async fn an_advance_fence_without_the_fence_installed_fails_the_acquisition() {
    let db = TestDb::create("advance_not_installed").await;
    let err = backend(&db, true)
        .acquire(&LeaseSpec::leader(KEY).wait(Wait::Never))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("lease_fence"), "{err}");
}

#[tokio::test]
async fn the_row_fence_refuses_a_holder_whose_row_is_gone_before_anyone_acquires() {
    let (db, mut client) = setup("held_refuses").await;
    let postgres = backend(&db, false);
    let lease = postgres.acquire(&LeaseSpec::leader(KEY)).await.unwrap();
    let seq = lease.sequencer().clone();
    fenced_write(&mut client, &seq, Via::Held).await.unwrap();
    // Expired by the database's clock (an operator's clock jump stands in for a frozen holder
    // that stopped renewing): refused, with nobody else holding the key.
    client
        .execute(
            "UPDATE lease.leases SET expires_at = clock_timestamp() - interval '1 second' \
             WHERE holder = $1",
            &[&seq.holder()],
        )
        .await
        .unwrap();
    let err = fenced_write(&mut client, &seq, Via::Held)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Stale { .. }), "{err:?}");
    assert!(err.to_string().contains("stale"), "{err}");
    drop(lease);
    postgres.shutdown().await;
    let err = fenced_write(&mut client, &seq, Via::Held)
        .await
        .unwrap_err();
    assert!(err.is_refused(), "{err:?}");
    let rows: i64 = client
        .query_one("SELECT count(*) FROM protected", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 1);
    // Another backend's sequencer has no row to check.
    let consul = Sequencer::new(lease_core::BackendKind::Consul, KEY, 1, "s");
    assert!(matches!(
        fenced_write(&mut client, &consul, Via::Held).await,
        Err(Error::Unsupported { .. })
    ));
}

#[tokio::test]
async fn nothing_removes_the_row_while_a_row_fenced_transaction_is_open() {
    let (db, mut client) = setup("held_locks").await;
    let postgres = backend(&db, false);
    let lease = postgres.acquire(&LeaseSpec::leader(KEY)).await.unwrap();
    let seq = lease.sequencer().clone();
    let operator = db.connect().await;
    let operator_pid = backend_pid(&operator).await;
    let observer = db.connect().await;
    let tx = client.transaction().await.unwrap();
    fence::tokio_postgres::fence_held(&tx, &seq).await.unwrap();
    let holder = seq.holder().to_owned();
    let delete = tokio::spawn(async move {
        operator
            .execute("DELETE FROM lease.leases WHERE holder = $1", &[&holder])
            .await
    });
    wait_until_blocked(&observer, operator_pid, STEP).await;
    tx.execute(
        "INSERT INTO protected (holder) VALUES ($1)",
        &[&seq.holder()],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let deleted = within(STEP, "the operator's delete", delete)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(deleted, 1);
    drop(lease);
    postgres.shutdown().await;
}
