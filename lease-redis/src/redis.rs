//! The public backend type, [`Redis`], and its `impl Backend`: it calls down into the recipes
//! (the `acquire` and `observe` modules) and the owner (`Shared`); nothing below imports it.
//! [`RedisBuilder`](crate::RedisBuilder) builds it (the `config` module).

use std::fmt;
use std::sync::Arc;

use lease_core::backend::Reachability;
use lease_core::leader::LeaderObserver;
use lease_core::{Backend, BackendKind, BoxFuture, Error, Lease, LeaseSpec, Sequencer};

use crate::acquire;
use crate::client::Shared;
use crate::observe;
use crate::renew::Kind;
use crate::wire::check_name;

/// Leases in Redis (or Valkey). Cloning is cheap, and clones share the connections.
///
/// - **A leader lease is one key**, `<prefix>{<name>}` (prefix `lease:` by default), a hash of
///   the holder, its fencing token and its advertised value, with a TTL on the server's clock;
///   a semaphore holder has a key of its own, `<prefix>{<name>}:s:<holder>`. Beside them, the
///   name's bookkeeping (its kind and limit, its holders' expiries, its line of waiters), all
///   under the name's hash tag. Every change is a Lua script that compares the holder before it
///   writes.
/// - **Renewal is batched**: every TTL/3, one `renew` script call renews every lease of this
///   handle with that TTL (up to 2,000 a call); each answered renewal confirms the leases'
///   fences, and a lease it finds gone is lost.
/// - **Loss without polling**: the command connection turns on client-side tracking (`CLIENT
///   TRACKING ON NOLOOP`, RESP3, Redis 6 or later, nothing to configure on the server), so an
///   operator's `DEL`, another client's overwrite, an eviction or an expiry of a holder key
///   reaches its holder as an invalidation within milliseconds; the holder checks at once (one
///   renewal) and loses the lease if it is gone. The connection going suspends the fences of
///   its leases until a renewal on the next one.
/// - **Waiters woken, not polling**: one subscriber connection per handle subscribes to the
///   wake-up channel of each name it waits for; a release publishes the IDs of the waiters now
///   first in line. Leader and semaphore waiters are served in FIFO order.
/// - **Self-fence**: no answered renewal for [`LeaseSpec::fence_after`] (the TTL less a tenth,
///   at least a second) and the lease is lost, before the server could let anyone else in.
/// - **Settle**: a holder removed without a release (a `DEL`, an eviction) keeps its slot for its
///   [`LeaseSpec::settle_after_removal`] from the moment a script noticed, so the old holder
///   stops before the next one starts.
/// - **Sequencer**: `redis:<token>:<holder>:<key>`; the token is drawn by the acquire script,
///   above the name's previous one and at least the server's clock in microseconds, so it rises
///   with every acquisition of the name; the holder is a random ID per acquisition; the key is
///   the leader key, or `<name>/<holder>` for a semaphore. lease-postgres's fence accepts leader
///   sequencers.
/// - **Replicas**: with replicas, an acquisition returns only once `WAIT` saw it on every one
///   ([`RedisBuilder::replica_wait`](crate::RedisBuilder::replica_wait)).
/// - **Connections**: two per handle (commands, and the subscriber), however many leases and
///   waiters; they close once the last clone of the handle and every lease and observer of it
///   are gone.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), lease_core::Error> {
/// use lease_core::{Backend, LeaseSpec};
/// use lease_redis::Redis;
///
/// // LEASE_REDIS_URL, else REDIS_URL: redis://[:password@]host:6379[/db], rediss:// for TLS.
/// let redis = Redis::from_env()?;
/// let lease = redis.acquire(&LeaseSpec::leader("jobs/billing").value("10.0.0.7")).await?;
/// // redis:<token>:<holder>:jobs/billing — the token rises with every acquisition.
/// println!("leading as {}", lease.sequencer());
/// lease.run(async { /* only the leader gets here; dropped if the lease is lost */ }).await?;
/// lease.release().await?;
/// redis.shutdown().await;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Redis {
    shared: Arc<Shared>,
}

impl fmt::Debug for Redis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redis")
            .field("address", &self.shared.wire.address)
            .field("prefix", &self.shared.wire.prefix)
            .finish_non_exhaustive()
    }
}

impl Redis {
    pub(crate) fn from_shared(shared: Shared) -> Redis {
        Redis {
            shared: Arc::new(shared),
        }
    }

    /// `host:port`, or the sentinels and their master's name (never the password).
    pub fn address(&self) -> &str {
        &self.shared.wire.address
    }

    /// The prefix of this backend's keys and channels.
    pub fn prefix(&self) -> &str {
        &self.shared.wire.prefix
    }

    /// The connections this handle and its clones have open now: two once used (commands and
    /// the subscriber), plus one briefly while a release runs without the handle's runtime.
    pub fn open_connections(&self) -> usize {
        self.shared.wire.open_connections()
    }

    /// How many leases of this handle are held and renewed.
    pub fn held(&self) -> usize {
        self.shared.held()
    }

    /// Whether `sequencer` still names a current holder: one read. `Ok(())` while its holder key
    /// is there with its token, `Err(Error::Lost(_))` once it was released, deleted, expired or
    /// the name taken by another acquisition.
    pub async fn check_sequencer(&self, sequencer: &Sequencer) -> Result<(), Error> {
        acquire::check_sequencer(&self.shared, sequencer).await
    }

    /// Operator action: deletes the holder key of `key`, as an administrator's `DEL` would: the
    /// leader key `key`, or the semaphore holder whose sequencer's key is `key`
    /// (`<name>/<holder>`). Its holder loses the lease with
    /// [`LostReason::KeyDeleted`](lease_core::LostReason::KeyDeleted) within milliseconds, and
    /// the name (or slot) stays barred for the holder's settle time. Returns whether a key
    /// went.
    pub async fn delete_key(&self, key: &str) -> Result<bool, Error> {
        let (name, holder) = match key.rsplit_once('/') {
            Some((name, holder))
                if holder.len() == 32 && holder.bytes().all(|b| b.is_ascii_hexdigit()) =>
            {
                (name, Some(holder))
            }
            _ => (key, None),
        };
        check_name(name)?;
        let keys = self.shared.wire.keys(name);
        let target = match holder {
            Some(holder) => keys.holder(holder),
            None => keys.base,
        };
        self.del(&[target], key).await.map(|n| n > 0)
    }

    /// Operator action: takes away the lease `sequencer` names, deleting its holder key (see
    /// [`delete_key`](Redis::delete_key)). Returns whether a key went.
    pub async fn revoke(&self, sequencer: &Sequencer) -> Result<bool, Error> {
        let (name, kind) = acquire::target_of(sequencer);
        check_name(name)?;
        let keys = self.shared.wire.keys(name);
        let target = match kind {
            Kind::Leader => keys.base,
            Kind::Semaphore => keys.holder(sequencer.holder()),
        };
        self.del(&[target], sequencer.key()).await.map(|n| n > 0)
    }

    /// Operator action: removes every key of the leader key or semaphore `name` (its holders,
    /// its line of waiters, its bookkeeping), as a `DEL` of them all would. Holders lose their
    /// leases, and nothing bars the name afterwards. Returns how many keys went.
    pub async fn purge(&self, name: &str) -> Result<u64, Error> {
        check_name(name)?;
        let keys = self.shared.wire.keys(name);
        let mut all: Vec<String> = keys.bookkeeping().to_vec();
        // The semaphore holders' own keys, as the slots name them.
        let slots = format!("{}:slots", keys.base);
        let holders: Vec<String> = self
            .shared
            .wire
            .request(false, |mut conn| async move {
                redis::cmd("ZRANGE")
                    .arg(&slots)
                    .arg(0)
                    .arg(-1)
                    .query_async(&mut conn)
                    .await
            })
            .await
            .map_err(|e| e.into_error(self.address(), format_args!("read {name:?}")))?;
        all.extend(holders.iter().map(|h| keys.holder(h)));
        self.del(&all, name).await
    }

    async fn del(&self, targets: &[String], what: &str) -> Result<u64, Error> {
        let deleted = self
            .shared
            .wire
            .request(true, |mut conn| async move {
                redis::cmd("DEL").arg(targets).query_async(&mut conn).await
            })
            .await
            .map_err(|e| e.into_error(self.address(), format_args!("delete {what:?}")))?;
        // The server tells every other client (tracking); this handle's own holders hear it here.
        for target in targets {
            self.shared.wire.changed_here(target);
        }
        Ok(deleted)
    }
}

impl Backend for Redis {
    fn acquire<'a>(&'a self, spec: &'a LeaseSpec) -> BoxFuture<'a, Result<Lease, Error>> {
        lease_core::backend::instrument_acquire(BackendKind::Redis, spec, async move {
            spec.validate()?;
            let backend: Arc<dyn Backend> = Arc::new(self.clone());
            acquire::acquire(&self.shared, spec, backend).await
        })
    }

    fn observe_leader<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<LeaderObserver, Error>> {
        Box::pin(observe::observe(&self.shared, key))
    }

    fn check_sequencer<'a>(&'a self, sequencer: &'a Sequencer) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(Redis::check_sequencer(self, sequencer))
    }

    fn reachability(&self) -> Reachability {
        self.shared.wire.probed_reachability()
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.shared.keepers.shutdown())
    }
}
