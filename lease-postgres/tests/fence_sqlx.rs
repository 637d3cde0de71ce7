//! The fence through sqlx against a real PostgreSQL: install, record, refuse a stale holder with
//! its transaction rolled back, refuse RabbitMQ's sequencer, and say when it is not installed.
//! (The SQL's concurrency is tested through tokio-postgres, in `fence_tokio_postgres`.)
#![allow(clippy::unwrap_used)]

use lease_core::{BackendKind, Sequencer};
use lease_postgres::fence::{self, Error};
use lease_tests::postgres::TestDb;
use sqlx::{Connection, PgConnection};

const KEY: &str = "jobs/reports";

fn seq(index: u64, holder: &str) -> Sequencer {
    Sequencer::new(BackendKind::Etcd, KEY, index, holder)
}

async fn connect(db: &TestDb) -> PgConnection {
    PgConnection::connect(db.url())
        .await
        .unwrap_or_else(|e| panic!("sqlx cannot connect to {}: {e}", db.url()))
}

/// One fenced transaction: fence, write a row, commit.
async fn fenced_write(conn: &mut PgConnection, seq: &Sequencer) -> Result<(), Error> {
    let mut tx = conn.begin().await.unwrap();
    fence::sqlx::fence(&mut tx, seq).await?;
    sqlx::query("INSERT INTO protected (lease_index, holder) VALUES ($1, $2)")
        .bind(i64::try_from(seq.index()).unwrap())
        .bind(seq.holder())
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    Ok(())
}

async fn rows(conn: &mut PgConnection) -> Vec<(i64, String)> {
    sqlx::query_as("SELECT lease_index, holder FROM protected ORDER BY id")
        .fetch_all(conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn fences_through_sqlx() {
    // The tokio-postgres client of the test support creates the database; sqlx does the rest.
    let db = TestDb::create("sqlx").await;
    let mut conn = connect(&db).await;

    let err = fenced_write(&mut conn, &seq(1, "a")).await.unwrap_err();
    assert!(matches!(err, Error::NotInstalled { .. }), "{err:?}");

    fence::sqlx::install(&mut conn).await.unwrap();
    fence::sqlx::install(&mut conn).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE protected (id bigserial PRIMARY KEY, lease_index bigint NOT NULL, \
         holder text NOT NULL)",
    )
    .execute(&mut conn)
    .await
    .unwrap();

    fenced_write(&mut conn, &seq(10, "a")).await.unwrap();
    fenced_write(&mut conn, &seq(10, "a")).await.unwrap();
    fenced_write(&mut conn, &seq(12, "b")).await.unwrap();

    // Stale: the write made before the fence call is rolled back with the transaction.
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("INSERT INTO protected (lease_index, holder) VALUES (10, 'a')")
        .execute(&mut *tx)
        .await
        .unwrap();
    let err = fence::sqlx::fence(&mut tx, &seq(10, "a"))
        .await
        .unwrap_err();
    match &err {
        Error::Stale {
            index: 10,
            recorded: Some(12),
            ..
        } => {}
        other => panic!("expected Stale, got {other:?}"),
    }
    let source = std::error::Error::source(&err)
        .and_then(|s| s.downcast_ref::<sqlx::Error>())
        .unwrap();
    assert!(source.to_string().contains("stale holder"), "{source}");
    tx.commit().await.unwrap();
    let err = fenced_write(&mut conn, &seq(12, "c")).await.unwrap_err();
    assert!(matches!(err, Error::IndexReused { .. }), "{err:?}");

    let slot = Sequencer::new(
        BackendKind::Amqp,
        "jobs",
        1,
        "jobs.holder.1#0000000000000001",
    );
    let err = fenced_write(&mut conn, &slot).await.unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err:?}");

    assert_eq!(
        rows(&mut conn).await,
        [(10, "a".into()), (10, "a".into()), (12, "b".into())]
    );
    conn.close().await.unwrap();
}

/// `advance_on_acquire` with a sqlx pool: every leader acquisition registers the new holder, so
/// the old holder's next fenced transaction is refused before the new one writes; a database
/// without the fence fails the acquisition (not retried) and leaves the lease free.
#[tokio::test]
async fn advances_at_acquisition_through_a_pool() {
    use lease_core::memory::Memory;
    use lease_core::{Backend, ErrorKind, LeaseSpec, Wait};

    let db = TestDb::create("sqlx_advance").await;
    let pool = sqlx::PgPool::connect(db.url()).await.unwrap();
    let memory = Memory::new();
    let backend = fence::sqlx::advance_on_acquire(memory.clone(), pool.clone());
    let spec = LeaseSpec::leader(KEY).wait(Wait::Never);

    let err = backend.acquire(&spec).await.unwrap_err();
    assert_eq!(
        (err.kind(), err.is_transient()),
        (ErrorKind::Usage, false),
        "{err}"
    );
    assert!(
        err.backend_error()
            .and_then(|e| e.downcast_ref::<Error>())
            .is_some_and(|e| matches!(e, Error::NotInstalled { .. })),
        "{err:?}"
    );
    // The lease it took was given back.
    memory
        .acquire(&spec)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    let mut conn = connect(&db).await;
    fence::sqlx::install(&mut conn).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE protected (id bigserial PRIMARY KEY, lease_index bigint NOT NULL, \
         holder text NOT NULL)",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let old = backend.acquire(&spec).await.unwrap();
    let stale = old.sequencer().clone();
    fenced_write(&mut conn, &stale).await.unwrap();
    old.release().await.unwrap();
    let new = backend.acquire(&spec).await.unwrap();
    let err = fenced_write(&mut conn, &stale).await.unwrap_err();
    assert!(matches!(err, Error::Stale { .. }), "{err:?}");
    fenced_write(&mut conn, new.sequencer()).await.unwrap();
    new.release().await.unwrap();
}
