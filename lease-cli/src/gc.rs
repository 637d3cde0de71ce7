//! `lease gc`: removes the Consul leader keys nobody holds under a prefix.
//!
//! Consul keeps a lock's key after its release (lease-consul keeps it on purpose: its LockIndex,
//! the sequencer's index, rises only while the key lives), so a service with a lease per customer
//! or per job leaves a key per name for ever. Consul's KV has no timestamps, so "older than" is
//! a watch: the keys are listed, and after `--older-than` each is deleted with a compare-and-set
//! on the ModifyIndex it was listed at, so a key acquired, released or written meanwhile (or
//! held now) is never deleted.

use lease_consul::{Consul, UnheldKey};
use lease_core::Backend;

use crate::backend;
use crate::cli::{BackendArgs, GcArgs};
use crate::exit::{self, Failure};

pub(crate) async fn run(args: GcArgs) -> Result<u8, Failure> {
    if args.prefix.is_empty() {
        return Err(Failure::usage(
            "give the prefix of the keys to clean, e.g. lease gc jobs/ (every key of the KV is \
             not a clean-up's business)",
        ));
    }
    let consul = backend::consul(&BackendArgs {
        consul: args.consul.clone(),
        amqp: None,
        etcd: None,
        postgres: None,
        redis: None,
    })?;
    let result = clean(&consul, &args).await;
    consul.shutdown().await;
    result
}

async fn clean(consul: &Consul, args: &GcArgs) -> Result<u8, Failure> {
    let failed =
        |e: lease_core::Error| Failure::new(exit::BACKEND, exit::in_cli_terms(&e.to_string()));
    let found = consul
        .unheld_leader_keys(&args.prefix)
        .await
        .map_err(failed)?;
    let listed = found.len();
    if let Some(watch) = args.older_than.filter(|_| listed > 0) {
        eprintln!(
            "lease gc: {listed} leader keys under {:?} are not held; watching them for {watch:?}: \
             only those nobody acquires, releases or writes meanwhile will be removed",
            args.prefix
        );
        tokio::time::sleep(watch).await;
    }
    let mut removed = 0;
    if args.dry_run {
        // What a run would delete: those still as listed.
        let now = consul
            .unheld_leader_keys(&args.prefix)
            .await
            .map_err(failed)?;
        for key in found.iter().filter(|k| now.contains(k)) {
            println!("would remove {}", describe(key));
            removed += 1;
        }
    } else {
        for key in &found {
            if consul
                .remove_unheld_key_as_found(key)
                .await
                .map_err(failed)?
            {
                println!("removed {}", describe(key));
                removed += 1;
            }
        }
    }
    eprintln!(
        "lease gc: {} {removed} of the {listed} leader keys under {:?} nobody held{}",
        if args.dry_run {
            "would remove"
        } else {
            "removed"
        },
        args.prefix,
        match listed - removed {
            0 => String::new(),
            kept => format!("; {kept} were acquired, released or written meanwhile and are kept"),
        }
    );
    Ok(0)
}

fn describe(key: &UnheldKey) -> String {
    format!(
        "{} (lock index {}, create index {})",
        key.key, key.lock_index, key.create_index
    )
}
