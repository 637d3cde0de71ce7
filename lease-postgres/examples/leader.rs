//! Leader election on PostgreSQL: run it in two terminals, and the second waits until the first
//! stops (Ctrl-C hands over at once) or loses its lease.
//!
//! ```text
//! LEASE_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/postgres \
//!     cargo run -p lease-postgres --features backend --example leader
//! ```

use lease_core::{Backend, LeaseSpec};
use lease_postgres::Postgres;

#[tokio::main]
async fn main() -> Result<(), lease_core::Error> {
    // LEASE_POSTGRES_URL, else DATABASE_URL. Installs the tables on first use.
    let postgres = Postgres::from_env()?;
    println!("waiting for the lease on {}", postgres.address());
    let lease = postgres
        .acquire(&LeaseSpec::leader("examples/leader").value(std::process::id().to_string()))
        .await?;
    println!("leading as {}; Ctrl-C to hand over", lease.sequencer());
    let work = async {
        let mut ticks = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            ticks.tick().await;
            println!("working under {}", lease.sequencer());
        }
    };
    tokio::select! {
        lost = lease.run(work) => println!("lost the lease: {lost:?}"),
        _ = lease_core::shutdown_signal() => println!("stopping"),
    }
    postgres.shutdown().await;
    Ok(())
}
