//! The model's state machine: every call lease-etcd makes, answered as etcd 3.4 answers it,
//! over the store, the lessor, the watches and the auth tokens. No I/O and no clock of its own:
//! each call is handed the time (`tokio::time`'s), so the state machine is a pure function of
//! its seed and of the calls and times it is handed.
//!
//! The checks run in etcd's order: the request's own validation (`v3rpc/key.go`), then the token
//! (`AuthInfoFromCtx`), then the permission, then what the apply finds (`etcdserver/apply.go`:
//! a put's lease, an ignored value's key, a read's revision).

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::watch as signal;
use tokio::time::Instant;
use tonic::Status;

use lease_etcd::proto::{
    AuthenticateRequest, AuthenticateResponse, DeleteRangeRequest, DeleteRangeResponse, KeyValue,
    LeaseGrantRequest, LeaseGrantResponse, RangeRequest, RangeResponse, ResponseHeader,
    WatchRequest, WatchRequestUnion,
};

use super::config::Config;
use super::error;
use super::lessor::{Lessor, Renewal};
use super::mvcc::{Span, Store, Write};
use super::watch::{Outbox, Watches};
use crate::rng::Rng;

mod txn;

/// `RangeRequest.SortOrder` and `SortTarget`.
const SORT_NONE: i32 = 0;
const SORT_ASCEND: i32 = 1;
const SORT_DESCEND: i32 = 2;
const TARGET_KEY: i32 = 0;
const TARGET_VERSION: i32 = 1;
const TARGET_CREATE: i32 = 2;
const TARGET_MOD: i32 = 3;
const TARGET_VALUE: i32 = 4;

/// Who a call is, as etcd's auth store tells from its token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    /// Authentication is off: anyone may do anything.
    Anyone,
    /// A valid token (of the root user, the only one the model has).
    Root,
    /// Authentication is on and the call carries no token.
    NoUser,
}

impl Access {
    /// The permission check of a key operation: a call without a user is refused.
    fn key_ops(self) -> Result<(), Status> {
        match self {
            Access::NoUser => Err(error::user_empty()),
            Access::Anyone | Access::Root => Ok(()),
        }
    }
}

/// A lease as the operator's inspection shows it.
#[derive(Clone, Debug)]
pub(crate) struct LeaseView {
    pub(crate) id: i64,
    pub(crate) ttl: i64,
    pub(crate) expiry: Instant,
    pub(crate) keys: Vec<Vec<u8>>,
}

#[derive(Debug)]
pub(crate) struct State {
    config: Config,
    rng: Rng,
    store: Store,
    lessor: Lessor,
    watches: Watches,
    /// Valid tokens and when each expires (simple tokens: in memory, refreshed on each use).
    tokens: BTreeMap<String, Instant>,
    tokens_given: u64,
    /// Bumped at every revocation, for the keep-alives that wait for one.
    revoked: signal::Sender<u64>,
}

impl State {
    pub(crate) fn new(config: Config, now: Instant) -> State {
        let mut rng = Rng::new(config.seed);
        let lessor = Lessor::new(&mut rng, config.min_lease_ttl);
        // The sync loop's phase against the simulation's clock.
        let every = config.sync_interval;
        let phase = rng.below(u64::try_from(every.as_nanos()).unwrap_or(u64::MAX));
        let sync_at = now.checked_add(Duration::from_nanos(phase)).unwrap_or(now);
        State {
            config,
            rng,
            store: Store::default(),
            lessor,
            watches: Watches::new(sync_at, every),
            tokens: BTreeMap::new(),
            tokens_given: 0,
            revoked: signal::Sender::new(0),
        }
    }

    pub(crate) fn revision(&self) -> i64 {
        self.store.rev()
    }

    pub(crate) fn compacted(&self) -> i64 {
        self.store.compacted()
    }

    /// A receiver of the revocations, for a keep-alive that waits for one.
    pub(crate) fn revocations(&self) -> signal::Receiver<u64> {
        self.revoked.subscribe()
    }

    // --- auth ---

    /// Who `token` is: etcd's `AuthInfoFromCtx` (an unknown or expired token is refused).
    fn access(&mut self, token: Option<&str>, now: Instant) -> Result<Access, Status> {
        if self.config.auth.is_none() {
            return Ok(Access::Anyone);
        }
        let Some(token) = token else {
            return Ok(Access::NoUser);
        };
        match self.tokens.get_mut(token) {
            Some(expires) if *expires > now => {
                *expires = now.checked_add(self.config.token_ttl).unwrap_or(now);
                Ok(Access::Root)
            }
            Some(_) => {
                self.tokens.remove(token);
                Err(error::invalid_auth_token())
            }
            None => Err(error::invalid_auth_token()),
        }
    }

    /// `Auth/Authenticate`: a token for the configured user.
    pub(crate) fn authenticate(
        &mut self,
        request: &AuthenticateRequest,
        now: Instant,
    ) -> Result<AuthenticateResponse, Status> {
        let Some(credentials) = &self.config.auth else {
            return Err(error::auth_not_enabled());
        };
        if request.name != credentials.user || request.password != credentials.password {
            return Err(error::auth_failed());
        }
        let letters: String = (0..16)
            .map(|_| char::from(b'a' + u8::try_from(self.rng.below(26)).unwrap_or(0)))
            .collect();
        self.tokens_given += 1;
        let token = format!("{letters}.{}", self.tokens_given);
        let expires = now.checked_add(self.config.token_ttl).unwrap_or(now);
        self.tokens.insert(token.clone(), expires);
        Ok(AuthenticateResponse { token })
    }

    /// Forgets every token (an operator's action; what a restart does too).
    pub(crate) fn expire_tokens(&mut self) {
        self.tokens.clear();
    }

    // --- writes ---

    /// Ends a write: the revision it answers with (the new one if it changed anything, else the
    /// current one); its events go to the watches, and the history kept is trimmed.
    fn commit(&mut self, write: Write) -> i64 {
        if !write.changed() {
            return self.store.rev();
        }
        let (rev, events) = self.store.commit(write);
        self.watches.notify(&self.store, rev, &events);
        if let Some(keep) = self.config.history {
            let target = rev.saturating_sub(keep.max(1));
            if target > self.store.compacted() && target > 0 {
                let _ = self.store.compact(target);
            }
        }
        rev
    }

    // --- KV ---

    /// A read of `request` by a transaction at revision `current`.
    fn read(&self, request: &RangeRequest, current: i64) -> Result<RangeResponse, Status> {
        let at = self.store.readable(request.revision, current)?;
        let span = Span::of(&request.key, &request.range_end);
        let mut kvs = self.store.range_at(&span, at);
        let limit = usize::try_from(request.limit).unwrap_or(0);
        // etcd fetches everything to sort or filter, else one more than the limit.
        let fetch_all = request.sort_order != SORT_NONE || request.max_create_revision != 0;
        if !fetch_all && limit > 0 {
            kvs.truncate(limit.saturating_add(1));
        }
        if request.max_create_revision != 0 {
            kvs.retain(|kv| kv.create_revision <= request.max_create_revision);
        }
        let mut order = request.sort_order;
        if request.sort_target != TARGET_KEY && order == SORT_NONE {
            order = SORT_ASCEND;
        }
        // etcd's sort is not stable; keys are never tied on what lease-etcd sorts by (create
        // revisions), and ties keep their key order here.
        let by = |a: &KeyValue, b: &KeyValue| match request.sort_target {
            TARGET_KEY => a.key.cmp(&b.key),
            TARGET_VERSION => a.version.cmp(&b.version),
            TARGET_CREATE => a.create_revision.cmp(&b.create_revision),
            TARGET_MOD => a.mod_revision.cmp(&b.mod_revision),
            TARGET_VALUE => a.value.cmp(&b.value),
            _ => std::cmp::Ordering::Equal,
        };
        match order {
            SORT_ASCEND => kvs.sort_by(by),
            SORT_DESCEND => kvs.sort_by(|a, b| by(b, a)),
            _ => {}
        }
        if limit > 0 {
            kvs.truncate(limit);
        }
        if request.keys_only {
            for kv in &mut kvs {
                kv.value.clear();
            }
        }
        Ok(RangeResponse {
            header: Some(ResponseHeader { revision: current }),
            kvs,
        })
    }

    /// `KV/Range`.
    pub(crate) fn range(
        &mut self,
        request: &RangeRequest,
        token: Option<&str>,
        now: Instant,
    ) -> Result<RangeResponse, Status> {
        if request.key.is_empty() {
            return Err(error::empty_key());
        }
        self.access(token, now)?.key_ops()?;
        self.read(request, self.store.rev())
    }

    /// `KV/DeleteRange`.
    pub(crate) fn delete_range(
        &mut self,
        request: &DeleteRangeRequest,
        token: Option<&str>,
        now: Instant,
    ) -> Result<DeleteRangeResponse, Status> {
        if request.key.is_empty() {
            return Err(error::empty_key());
        }
        self.access(token, now)?.key_ops()?;
        let deleted = self.delete(&Span::of(&request.key, &request.range_end));
        Ok(DeleteRangeResponse {
            header: Some(ResponseHeader {
                revision: deleted.1,
            }),
            deleted: deleted.0,
        })
    }

    /// Deletes the keys in `span` in a write of its own: how many, and the revision after.
    pub(crate) fn delete(&mut self, span: &Span) -> (i64, i64) {
        let mut write = self.store.begin();
        let deleted = self.store.delete(&mut write, span);
        (deleted, self.commit(write))
    }

    /// Compacts the history at `rev` (etcd's `Compact`).
    pub(crate) fn compact(&mut self, rev: i64) -> Result<(), Status> {
        self.store.compact(rev)
    }

    /// Every key now, in key order.
    pub(crate) fn keys(&self) -> Vec<KeyValue> {
        self.store.current()
    }

    // --- leases ---

    /// `Lease/LeaseGrant` (with an ID of the server's when `id` is 0).
    pub(crate) fn lease_grant(
        &mut self,
        request: &LeaseGrantRequest,
        id: i64,
        token: Option<&str>,
        now: Instant,
    ) -> Result<LeaseGrantResponse, Status> {
        self.access(token, now)?;
        let (id, ttl) = self.lessor.grant(id, request.ttl, now)?;
        Ok(LeaseGrantResponse {
            id,
            ttl,
            error: String::new(),
        })
    }

    /// `Lease/LeaseRevoke`.
    pub(crate) fn lease_revoke(
        &mut self,
        id: i64,
        token: Option<&str>,
        now: Instant,
    ) -> Result<(), Status> {
        let access = self.access(token, now)?;
        if self.lessor.get(id).is_none() {
            return Err(error::lease_not_found());
        }
        // Revoking deletes the lease's keys: a caller without a user may not, if it has some.
        if !self.store.keys_of(id).is_empty() {
            access.key_ops()?;
        }
        self.revoke(id);
        Ok(())
    }

    /// Revokes lease `id`, deleting its keys in one revision (none if it has no keys), in key
    /// order; whether it existed.
    pub(crate) fn revoke(&mut self, id: i64) -> bool {
        if self.lessor.get(id).is_none() {
            return false;
        }
        let mut write = self.store.begin();
        for key in self.store.keys_of(id) {
            self.store.delete(&mut write, &Span::Key(key));
        }
        self.lessor.remove(id);
        self.commit(write);
        self.revoked.send_modify(|n| *n = n.wrapping_add(1));
        true
    }

    /// A keep-alive of lease `id` (`Lease/LeaseKeepAlive`'s `Renew`).
    pub(crate) fn renew(&mut self, id: i64, now: Instant) -> Renewal {
        self.lessor.renew(id, now)
    }

    /// Whether lease `id` exists.
    pub(crate) fn has_lease(&self, id: i64) -> bool {
        self.lessor.get(id).is_some()
    }

    /// `Lease/LeaseTimeToLive`: the whole seconds left, -1 for no such lease.
    pub(crate) fn time_to_live(&self, id: i64, now: Instant) -> i64 {
        self.lessor
            .get(id)
            .map_or(-1, |lease| lease.seconds_left(now))
    }

    /// Every lease, by ID.
    pub(crate) fn leases(&self) -> Vec<LeaseView> {
        self.lessor
            .leases()
            .map(|(id, lease)| LeaseView {
                id,
                ttl: lease.ttl,
                expiry: lease.expiry,
                keys: self.store.keys_of(id),
            })
            .collect()
    }

    /// When lease `id` is revoked, once expired: its expiry, and the lessor's lateness.
    fn revocation_due(&self, expiry: Instant) -> Instant {
        expiry
            .checked_add(self.config.revoke_late)
            .unwrap_or(expiry)
    }

    // --- watches ---

    /// A new watch stream answering into `outbox`, with the client's token.
    pub(crate) fn open_watch_stream(
        &mut self,
        outbox: Outbox,
        token: Option<String>,
        now: Instant,
    ) -> u64 {
        // `GetProgressReportInterval`: the interval and up to a tenth more.
        let every = self.config.progress_interval;
        let tenth = u64::try_from(every.as_nanos() / 10).unwrap_or(u64::MAX);
        let every = every.saturating_add(Duration::from_nanos(self.rng.below(tenth)));
        self.watches.open(outbox, token, every, now)
    }

    pub(crate) fn close_watch_stream(&mut self, stream: u64) {
        self.watches.close(stream);
    }

    /// One message of the client on watch stream `stream`; true if the sync loop has work.
    pub(crate) fn watch_request(
        &mut self,
        stream: u64,
        request: &WatchRequest,
        now: Instant,
    ) -> bool {
        match &request.request_union {
            Some(WatchRequestUnion::Create(create)) => {
                let token = self.watches.token(stream).map(str::to_owned);
                let refusal = match self.access(token.as_deref(), now) {
                    Ok(access) => access.key_ops().err(),
                    Err(status) => Some(status),
                };
                if let Some(status) = refusal {
                    self.watches
                        .refuse(stream, error::as_reason(&status), &self.store);
                    return false;
                }
                self.watches.create(stream, create, &self.store)
            }
            Some(WatchRequestUnion::Cancel(cancel)) => {
                self.watches.cancel(stream, cancel.watch_id, &self.store);
                false
            }
            None => false,
        }
    }

    /// How many watches are open.
    pub(crate) fn watch_count(&self) -> usize {
        self.watches.count()
    }

    // --- time ---

    /// Does what is due by `now`: revokes the expired leases whose revocation is due (each in a
    /// revision of its own, as etcd revokes each in a raft request of its own), then the watch
    /// sync loop's turn and the progress ticks.
    pub(crate) fn run_due(&mut self, now: Instant) {
        let mut due: Vec<(Instant, i64)> = self
            .lessor
            .leases()
            .map(|(id, lease)| (self.revocation_due(lease.expiry), id))
            .filter(|(at, _)| *at <= now)
            .collect();
        due.sort();
        for (_, id) in due {
            self.revoke(id);
        }
        self.watches.run_due(&self.store, now);
    }

    /// When there is something to do next (see [`State::run_due`]).
    pub(crate) fn next_deadline(&self, now: Instant) -> Option<Instant> {
        let revocation = self
            .lessor
            .leases()
            .map(|(_, lease)| self.revocation_due(lease.expiry))
            .min();
        match (revocation, self.watches.next_deadline(now)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// What an etcd restart (or a new leader) does: the keys, revisions, history and leases
    /// stay; every stream ends, the tokens go (simple tokens live in memory), and the new
    /// leader's lessor extends every lease to its TTL plus the election timeout.
    pub(crate) fn restart(&mut self, now: Instant) {
        self.watches.close_all();
        self.tokens.clear();
        self.lessor.promote(now, self.config.election_timeout);
    }
}
