//! `lease status` (who holds a lock or semaphore) and `lease check` (is a sequencer current).

use lease_amqp::Amqp;
use lease_core::{Backend, BackendKind, Error, Sequencer};
use serde_json::{Value, json};

use crate::backend::{self, Chosen, leader_key};
use crate::cli::{CheckArgs, StatusArgs};
use crate::exit::{self, Failure};

/// Prints who holds KEY; exit 0 if someone does, 1 if nobody, 2 if the backend cannot tell.
pub(crate) async fn status(args: StatusArgs) -> Result<u8, Failure> {
    let chosen = Chosen::from_args(&args.backend, std::time::Duration::ZERO)?;
    chosen.spec(&args.key, args.limit)?;
    let report = match &chosen {
        Chosen::Consul(consul) if args.limit == 1 => leader(consul, &leader_key(&args.key)).await,
        Chosen::Consul(consul) => consul_semaphore(consul, &args.key, args.limit).await,
        Chosen::Amqp(amqp) => amqp_semaphore(amqp, &args.key).await,
        Chosen::Etcd(etcd) if args.limit == 1 => leader(etcd, &args.key).await,
        Chosen::Etcd(_) => {
            return Err(Failure::usage(format_args!(
                "-n on etcd: the etcd backend cannot list a semaphore's holders; \
                 `etcdctl get --prefix --sort-by=CREATE {}/` lists its contenders, oldest first",
                args.key
            )));
        }
        Chosen::Postgres(postgres) if args.limit == 1 => leader(postgres, &args.key).await,
        Chosen::Postgres(_) => {
            return Err(Failure::usage(format_args!(
                "-n on PostgreSQL: `lease status` cannot list a semaphore's holders there; \
                 the backend's lease table lists them (rows of key {:?})",
                args.key
            )));
        }
        Chosen::Redis(redis) if args.limit == 1 => leader(redis, &args.key).await,
        Chosen::Redis(_) => {
            return Err(Failure::usage(format_args!(
                "-n on Redis: `lease status` cannot list a semaphore's holders there; \
                 `redis-cli ZRANGE 'lease:{{{}}}:slots' 0 -1` lists them",
                args.key
            )));
        }
    };
    let report =
        report.map_err(|e| Failure::new(exit::QUERY_FAILED, exit::in_cli_terms(&e.to_string())))?;
    let held = report["held"].as_bool().unwrap_or(false);
    if args.json {
        println!("{report:#}");
    } else {
        print_text(&report);
    }
    chosen.backend().shutdown().await;
    Ok(if held { 0 } else { exit::NOT_HELD })
}

async fn leader(backend: &dyn Backend, key: &str) -> Result<Value, Error> {
    let observer = backend.observe_leader(key).await?;
    Ok(match observer.leader() {
        Some(leader) => {
            let (index, holder) = holder_terms(leader.sequencer.backend());
            let mut report = serde_json::Map::new();
            report.insert("key".into(), key.into());
            report.insert("held".into(), true.into());
            report.insert(index.0.into(), leader.sequencer.index().into());
            report.insert(holder.0.into(), leader.sequencer.holder().into());
            report.insert(
                "value".into(),
                String::from_utf8_lossy(&leader.value).into(),
            );
            report.insert("sequencer".into(), leader.sequencer.to_string().into());
            Value::Object(report)
        }
        None => json!({ "key": key, "held": false }),
    })
}

/// What a backend calls a sequencer's index and holder: `(JSON field, words)` each. Consul (and
/// etcd, which `lease status` has always shown the same way) a lock index and a session;
/// PostgreSQL an index (from its `lease.lease_index` sequence) and a holder ID (one per
/// acquisition); Redis a fencing token and a holder ID.
pub(crate) fn holder_terms(
    kind: BackendKind,
) -> ((&'static str, &'static str), (&'static str, &'static str)) {
    match kind {
        BackendKind::Postgres => (("index", "index"), ("holder", "holder")),
        BackendKind::Redis => (("token", "token"), ("holder", "holder")),
        _ => (("lock_index", "lock index"), ("session", "session")),
    }
}

async fn consul_semaphore(
    consul: &lease_consul::Consul,
    prefix: &str,
    limit: u32,
) -> Result<Value, Error> {
    let state = consul.semaphore_state(prefix).await?;
    let holders: Vec<Value> = state
        .holders
        .iter()
        .map(|holder| {
            json!({
                "session": holder.session,
                "value": String::from_utf8_lossy(&holder.value),
                "sequencer": holder.sequencer.to_string(),
            })
        })
        .collect();
    Ok(json!({
        "key": prefix,
        "held": !holders.is_empty(),
        "limit": state.limit.unwrap_or(u64::from(limit)),
        "holders": holders,
    }))
}

async fn amqp_semaphore(amqp: &Amqp, name: &str) -> Result<Value, Error> {
    let admin = amqp.admin();
    let slots = admin.slots(name).await?;
    let mut held = Vec::new();
    for slot in 1..=slots {
        if admin.has_holder(name, slot).await? {
            held.push(slot);
        }
    }
    Ok(json!({
        "key": name,
        "held": !held.is_empty(),
        "limit": slots,
        "held_slots": held,
    }))
}

fn print_text(report: &Value) {
    let Some(fields) = report.as_object() else {
        return;
    };
    for (name, value) in fields {
        let text = match value {
            Value::String(s) => s.clone(),
            Value::Array(items) if items.iter().all(Value::is_object) => {
                println!("{name}:");
                for item in items {
                    let line: Vec<String> = item
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(|(k, v)| {
                            format!("{k}={}", v.as_str().map_or(v.to_string(), str::to_owned))
                        })
                        .collect();
                    println!("  {}", line.join(" "));
                }
                continue;
            }
            other => other.to_string(),
        };
        println!("{name}: {text}");
    }
}

/// Exit 0 if `sequencer` is current, 1 (with the reason) if stale, 2 if the backend cannot tell.
pub(crate) async fn check(args: CheckArgs) -> Result<u8, Failure> {
    let sequencer: Sequencer = args.sequencer.parse().map_err(|e| {
        Failure::new(
            exit::QUERY_FAILED,
            format_args!(
                "{:?} is not a sequencer: {e}; pass LEASE_SEQUENCER as it was given",
                args.sequencer
            ),
        )
    })?;
    let failed = |f: Failure| Failure::new(exit::QUERY_FAILED, f.message);
    // The sequencer names its backend; a flag for another one is a mistake worth saying.
    let chosen = match sequencer.backend() {
        BackendKind::Amqp if args.backend.amqp.is_none() => {
            Chosen::Amqp(Amqp::from_env().map_err(|e| Failure::new(exit::QUERY_FAILED, e))?)
        }
        BackendKind::Consul
            if args.backend.amqp.is_some()
                || args.backend.etcd.is_some()
                || args.backend.postgres.is_some()
                || args.backend.redis.is_some() =>
        {
            return Err(Failure::new(
                exit::QUERY_FAILED,
                "a consul: sequencer is checked with Consul: drop --amqp, --etcd and --postgres",
            ));
        }
        BackendKind::Consul => Chosen::Consul(backend::consul(&args.backend).map_err(failed)?),
        BackendKind::Amqp => {
            Chosen::from_args(&args.backend, std::time::Duration::ZERO).map_err(failed)?
        }
        BackendKind::Etcd
            if args.backend.amqp.is_some()
                || args.backend.consul.is_some()
                || args.backend.postgres.is_some()
                || args.backend.redis.is_some() =>
        {
            return Err(Failure::new(
                exit::QUERY_FAILED,
                "an etcd: sequencer is checked with etcd: drop --consul, --amqp and --postgres",
            ));
        }
        // --etcd, else LEASE_ETCD_ENDPOINTS, else the library's ETCD_ENDPOINTS or its default.
        BackendKind::Etcd => Chosen::Etcd(
            backend::etcd(backend::etcd_endpoints(&args.backend).as_deref()).map_err(failed)?,
        ),
        BackendKind::Postgres
            if args.backend.amqp.is_some()
                || args.backend.consul.is_some()
                || args.backend.etcd.is_some() =>
        {
            return Err(Failure::new(
                exit::QUERY_FAILED,
                "a postgres: sequencer is checked with PostgreSQL: drop --consul, --amqp and --etcd",
            ));
        }
        // --postgres, else LEASE_POSTGRES_URL (not DATABASE_URL, as for `lease lock`).
        BackendKind::Postgres => {
            let url = (args.backend.postgres.clone())
                .map(|url| (url, "--postgres"))
                .or_else(|| {
                    backend::postgres_url_env().map(|url| (url, backend::POSTGRES_URL_ENV))
                });
            let Some((url, source)) = url else {
                return Err(Failure::new(
                    exit::QUERY_FAILED,
                    "a postgres: sequencer is checked with PostgreSQL: give --postgres URL (or set \
                     LEASE_POSTGRES_URL)",
                ));
            };
            Chosen::Postgres(backend::postgres(&url, source).map_err(failed)?)
        }
        BackendKind::Redis
            if args.backend.amqp.is_some()
                || args.backend.consul.is_some()
                || args.backend.etcd.is_some()
                || args.backend.postgres.is_some() =>
        {
            return Err(Failure::new(
                exit::QUERY_FAILED,
                "a redis: sequencer is checked with Redis: drop --consul, --amqp, --etcd and \
                 --postgres",
            ));
        }
        // --redis, else LEASE_REDIS_URL (not REDIS_URL, as for `lease lock`).
        BackendKind::Redis => {
            let url = (args.backend.redis.clone())
                .map(|url| (url, "--redis"))
                .or_else(|| backend::redis_url_env().map(|url| (url, backend::REDIS_URL_ENV)));
            let Some((url, source)) = url else {
                return Err(Failure::new(
                    exit::QUERY_FAILED,
                    "a redis: sequencer is checked with Redis: give --redis URL (or set \
                     LEASE_REDIS_URL)",
                ));
            };
            Chosen::Redis(backend::redis(&url, source).map_err(failed)?)
        }
        other => {
            return Err(Failure::new(
                exit::QUERY_FAILED,
                format_args!(
                    "a {other}: sequencer lives in one process and cannot be checked from here"
                ),
            ));
        }
    };
    let backend = chosen.backend();
    let result = backend.check_sequencer(&sequencer).await;
    backend.shutdown().await;
    match result {
        Ok(()) => {
            println!("current: {sequencer}");
            Ok(0)
        }
        Err(Error::Lost(reason)) => {
            println!("stale: {reason}");
            Ok(exit::NOT_HELD)
        }
        Err(error) => Err(Failure::new(
            exit::QUERY_FAILED,
            exit::in_cli_terms(&error.to_string()),
        )),
    }
}
