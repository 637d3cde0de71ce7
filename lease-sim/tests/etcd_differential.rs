//! The etcd model checked against a real etcd 3.4: seeded sequences of exactly the calls
//! lease-etcd makes, with the arguments it makes them with (plus an operator's revocations,
//! deletions and compactions), replayed against both over gRPC with lease-etcd's own messages,
//! every answer compared with revisions and lease IDs normalised. A disagreement is a bug in the
//! model: the test fails with the seed, the step, the operation and both answers.
//!
//! Normalising: each sequence runs in a namespace of its own on one etcd (`d<seed>/`) and on a
//! fresh model; a revision is read as its distance from the sequence's first revision on its
//! side, a lease ID as its place in the order of that side's grants (`L0`, `L1`…, in key names
//! too: a contender key is `<name>/<lease hex>`), so one answer reads the same on both sides
//! exactly when the model is right. Time is the one thing the two sides do not share: a
//! time-to-live may differ by a second. Watch answers are compared per watch, event by event
//! (how etcd batches them depends on when its sync loop runs), once both sides have sent them;
//! a watch is cancelled, and the history compacted, only once both sides have delivered what
//! they will (as the client cancels after it has read).
//!
//! Expiry runs in a test of its own (`expired_leases_are_revoked_alike`), on short TTLs.
//!
//! Run: `cargo test -p lease-sim --test etcd_differential -- --nocapture` (the numbers are
//! printed); `ETCD_DIFF_SEED=<seed> ETCD_DIFF_SEQUENCES=1` replays one sequence;
//! `ETCD_DIFF_SEQUENCES=<n>` runs more; `ETCD_DIFF_TRACE=1` prints every step's answers and
//! every watch's, `ETCD_DIFF_STATS=1` one line per step (operation, outcome) to count them by.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::uri::PathAndQuery;
use lease_etcd::proto::{
    AuthenticateRequest, AuthenticateResponse, Compare, DeleteRangeRequest, DeleteRangeResponse,
    Empty, KeyValue, LeaseGrantRequest, LeaseGrantResponse, LeaseId, LeaseKeepAliveResponse,
    LeaseTimeToLiveResponse, PutRequest, RangeRequest, RangeResponse, RequestOp, Response,
    TxnRequest, TxnResponse, WatchCancelRequest, WatchCreateRequest, WatchRequest,
    WatchRequestUnion, WatchResponse, path,
};
use lease_sim::etcd::{Config, Model};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::client::Grpc;
use tonic::transport::Channel;
use tonic_prost::ProstCodec;

/// The operator's messages lease-etcd has no use for: `KV/Compact` and `Lease/LeaseLeases`.
mod operator {
    use lease_etcd::proto::ResponseHeader;

    pub(crate) const COMPACT: &str = "/etcdserverpb.KV/Compact";
    pub(crate) const LEASES: &str = "/etcdserverpb.Lease/LeaseLeases";

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct CompactionRequest {
        #[prost(int64, tag = "1")]
        pub(crate) revision: i64,
        #[prost(bool, tag = "2")]
        pub(crate) physical: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct CompactionResponse {
        #[prost(message, optional, tag = "1")]
        pub(crate) header: Option<ResponseHeader>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct LeaseLeasesRequest {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct LeaseStatus {
        #[prost(int64, tag = "1")]
        pub(crate) id: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct LeaseLeasesResponse {
        #[prost(message, repeated, tag = "2")]
        pub(crate) leases: Vec<LeaseStatus>,
    }
}

/// How long one answer may take.
const ANSWER: Duration = Duration::from_secs(5);

/// A watch from a past revision is sent its history by etcd's sync loop, every 100 ms: after
/// this, both sides have.
const SYNCED_AFTER: Duration = Duration::from_millis(130);

/// The semaphore limit the generator's semaphore contenders ask for.
const LIMIT: i64 = 2;

/// SplitMix64, the generator's randomness.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        usize::try_from(self.next() % n as u64).unwrap_or(0)
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        if items.is_empty() {
            None
        } else {
            items.get(self.below(items.len()))
        }
    }
}

/// A lease, by the order of its grant in the sequence, or one nobody granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LeaseRef {
    Granted(usize),
    /// An ID neither side has (etcd's IDs are far larger).
    Unknown,
}

const UNKNOWN_LEASE: i64 = 0x1d;

/// A contender key: `<name>/<lease hex>`, or `<name>/<lease hex>_<slot>`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct KeySym {
    name: &'static str,
    lease: usize,
    slot: u64,
}

#[derive(Clone, Copy, Debug)]
enum Recipe {
    Leader,
    Semaphore,
}

fn recipe_of(name: &str) -> Recipe {
    if name.starts_with('s') {
        Recipe::Semaphore
    } else {
        Recipe::Leader
    }
}

#[derive(Clone, Debug)]
enum WatchRange {
    Key(KeySym),
    Name(&'static str),
}

/// One call, as lease-etcd makes it (the comment names where), or an operator's action.
/// Revisions are distances from the sequence's first revision.
#[derive(Clone, Debug)]
enum Op {
    /// `pool::grant`, `session::keep_key`.
    Grant { ttl: i64 },
    /// `pool::revoke`, `Etcd::revoke_lease`.
    Revoke { lease: LeaseRef },
    /// The operator's `etcdctl lease revoke` (the model's `revoke_lease`).
    OperatorRevoke { lease: LeaseRef },
    /// `KeyHold::refine`.
    TimeToLive { lease: LeaseRef },
    /// The pool's keep-alive stream.
    KeepAlive { lease: LeaseRef },
    /// `queue::join`.
    Join { key: KeySym, lease: LeaseRef },
    /// `queue::contend`'s read (with its history read on the first judgment).
    Read {
        key: KeySym,
        created: i64,
        first: bool,
    },
    /// `session::announce_release`.
    Touch { key: KeySym, created: i64 },
    /// `KeyHold::release`'s delete.
    Release { key: KeySym, created: i64 },
    /// `session::give_back` (`delete_own`).
    GiveBack { key: KeySym, created: Option<i64> },
    /// `session::keep_key`'s move onto a lease of its own.
    Keep {
        key: KeySym,
        created: i64,
        lease: LeaseRef,
    },
    /// `check::check_sequencer`.
    Check { key: KeySym, index: i64 },
    /// `observe::leader_of`.
    Observe { name: &'static str },
    /// `session::watch_own_key`'s read after a broken watch.
    ReadOwn { key: KeySym },
    /// `EtcdClient::probed_reachability`'s probe.
    Probe,
    /// `Etcd::delete_key` (`Wire::delete` with its dir).
    Delete { name: &'static str },
    /// The operator's `etcdctl del <key>` (the model's `delete_key`).
    OperatorDeleteKey { key: KeySym },
    /// The operator's `etcdctl del --prefix <name>/` (the model's `delete_prefix`).
    OperatorDeletePrefix { name: &'static str },
    /// The operator's `etcdctl compaction` (the model's `compact`).
    Compact { rev: i64 },
    /// `Watches::create`: every watch of the client has `progress_notify` and `prev_kv`.
    Watch {
        id: i64,
        range: WatchRange,
        start: i64,
    },
    /// `State::remove`'s cancel.
    Cancel { id: i64 },
    /// `Wire::token` on a cluster without authentication.
    Authenticate,
}

/// The generator's view of the state both sides agreed on, read from the model after each step.
#[derive(Default)]
struct View {
    /// Distance of the current revision from the first.
    rev: i64,
    compacted: Option<i64>,
    granted: usize,
    alive: Vec<usize>,
    /// The contender keys there are, with their create revisions and versions.
    contenders: Vec<(KeySym, i64, i64)>,
    /// The watches open: ID, when created, whether from the past.
    watches: Vec<(i64, Instant, bool)>,
    last_watch: i64,
    /// What the client would do next about a key (the queue's steps after a join, a release's
    /// delete after its touch), taken up now and then.
    intents: Vec<Intent>,
}

/// A contender's next step, as the queue and the holder take them.
#[derive(Clone, Debug)]
enum Intent {
    /// The first judgment after the join (with its read of the history).
    Judge(KeySym),
    /// A waiter's watch of what is ahead of it, from the read's revision on.
    WaitAhead(KeySym),
    /// The holder's watch of its own key.
    WatchOwn(KeySym),
    /// A release: the touch, then (queued again) the delete.
    Touch(KeySym),
    Release(KeySym),
}

const NAMES: [&str; 3] = ["e0", "e1", "s0"];

impl View {
    fn created(&self, key: &KeySym) -> Option<i64> {
        self.contenders
            .iter()
            .find(|(k, ..)| k == key)
            .map(|(_, created, _)| *created)
    }

    /// The newest contender of `key`'s name created before it (a leader waiter's key ahead).
    fn ahead(&self, key: &KeySym) -> Option<KeySym> {
        let created = self.created(key)?;
        self.contenders
            .iter()
            .filter(|(k, c, _)| k.name == key.name && *c < created)
            .max_by_key(|(_, c, _)| *c)
            .map(|(k, ..)| k.clone())
    }
}

/// The next operation, and what the client would do after it.
fn generate(rng: &mut Rng, view: &mut View) -> Op {
    if view.alive.is_empty() || rng.chance(3) {
        return Op::Grant {
            ttl: [5, 10, 15, 30][rng.below(4)],
        };
    }
    if !view.intents.is_empty() && rng.chance(45) {
        let intent = view.intents.remove(rng.below(view.intents.len()));
        if let Some(op) = follow(rng, view, intent) {
            return op;
        }
    }
    let any_lease = |rng: &mut Rng| {
        if rng.chance(4) {
            LeaseRef::Unknown
        } else if rng.chance(92) {
            LeaseRef::Granted(*rng.pick(&view.alive).unwrap_or(&0))
        } else {
            LeaseRef::Granted(rng.below(view.granted))
        }
    };
    let fresh_key = |rng: &mut Rng| KeySym {
        name: NAMES[rng.below(NAMES.len())],
        lease: match any_lease(rng) {
            LeaseRef::Granted(i) => i,
            LeaseRef::Unknown => 0,
        },
        slot: [0, 0, 0, 1, 2][rng.below(5)],
    };
    // A contender that exists, with its create revision (now and then one that is off by one, as
    // a stale holder's is), or a key that does not.
    let existing = |rng: &mut Rng| match rng.pick(&view.contenders) {
        Some((key, created, _)) if rng.chance(90) => {
            let created = if rng.chance(6) { created + 1 } else { *created };
            (key.clone(), created)
        }
        _ => (fresh_key(rng), view.rev),
    };
    let op = match rng.below(100) {
        0..=15 => {
            let key = fresh_key(rng);
            Op::Join {
                lease: if rng.chance(4) {
                    LeaseRef::Unknown
                } else {
                    LeaseRef::Granted(key.lease)
                },
                key,
            }
        }
        16..=24 => {
            let (key, created) = existing(rng);
            Op::Read {
                key,
                created,
                first: rng.chance(40),
            }
        }
        25..=27 => {
            let (key, created) = existing(rng);
            Op::Touch { key, created }
        }
        28..=30 => {
            let (key, created) = existing(rng);
            Op::Release { key, created }
        }
        31..=34 => {
            let (key, created) = existing(rng);
            Op::GiveBack {
                key,
                created: rng.chance(70).then_some(created),
            }
        }
        35..=36 => {
            let (key, created) = existing(rng);
            Op::Keep {
                key,
                created,
                lease: any_lease(rng),
            }
        }
        37..=41 => {
            let (key, created) = existing(rng);
            Op::Check {
                key,
                index: created,
            }
        }
        42..=44 => Op::Observe {
            name: NAMES[rng.below(NAMES.len())],
        },
        45..=47 => Op::ReadOwn {
            key: existing(rng).0,
        },
        48 => Op::Probe,
        49..=50 => Op::Delete {
            name: NAMES[rng.below(NAMES.len())],
        },
        51..=53 => Op::OperatorDeleteKey {
            key: existing(rng).0,
        },
        54 => Op::OperatorDeletePrefix {
            name: NAMES[rng.below(NAMES.len())],
        },
        55..=56 => Op::Revoke {
            lease: any_lease(rng),
        },
        57..=58 => Op::OperatorRevoke {
            lease: any_lease(rng),
        },
        59..=61 => Op::TimeToLive {
            lease: any_lease(rng),
        },
        62..=66 => Op::KeepAlive {
            lease: any_lease(rng),
        },
        67..=71 => {
            let floor = view.compacted.unwrap_or(0);
            let span = usize::try_from(view.rev - floor).unwrap_or(0).max(1);
            // At the last compaction again (refused), ahead of the revision (refused), or in
            // between. Never at the sequence's first revision: a sequence before may have
            // compacted the etcd there.
            let rev = match rng.below(10) {
                0 if view.compacted.is_some() => floor,
                1 => view.rev + 1,
                _ => floor + 1 + i64::try_from(rng.below(span)).unwrap_or(0),
            };
            Op::Compact { rev: rev.max(1) }
        }
        72..=81 => {
            let range = if rng.chance(50) {
                WatchRange::Key(existing(rng).0)
            } else {
                WatchRange::Name(NAMES[rng.below(NAMES.len())])
            };
            let start = match (rng.below(10), view.compacted) {
                (0..=4, _) => view.rev + 1,
                (5, _) => view.rev + 3,
                // Before the compaction (cancelled), or at it (the history from there is kept).
                (6, Some(compacted)) => compacted.max(1),
                (7..=8, Some(compacted)) => {
                    (compacted - 1 - i64::try_from(rng.below(2)).unwrap_or(0)).max(1)
                }
                _ => existing(rng).1.max(1),
            };
            Op::Watch {
                id: view.last_watch + 1,
                range,
                start,
            }
        }
        82..=86 => match rng.pick(&view.watches) {
            Some((id, ..)) => Op::Cancel { id: *id },
            None => Op::Probe,
        },
        87 => Op::Authenticate,
        _ => Op::ReadOwn {
            key: existing(rng).0,
        },
    };
    if let Op::Join { key, .. } = &op {
        view.intents.push(Intent::Judge(key.clone()));
    }
    op
}

/// The operation that takes `intent` up, if its key is still there; queues the next one.
fn follow(rng: &mut Rng, view: &mut View, intent: Intent) -> Option<Op> {
    let watch = |view: &View, range, start| Op::Watch {
        id: view.last_watch + 1,
        range,
        start,
    };
    let op = match intent {
        Intent::Judge(key) => {
            let created = view.created(&key)?;
            let next = if rng.chance(50) {
                Intent::WaitAhead(key.clone())
            } else {
                Intent::WatchOwn(key.clone())
            };
            view.intents.push(next);
            Op::Read {
                key,
                created,
                first: true,
            }
        }
        Intent::WaitAhead(key) => {
            let range = match recipe_of(key.name) {
                Recipe::Leader => WatchRange::Key(view.ahead(&key)?),
                Recipe::Semaphore => WatchRange::Name(key.name),
            };
            watch(view, range, view.rev + 1)
        }
        Intent::WatchOwn(key) => {
            let created = view.created(&key)?;
            view.intents.push(Intent::Touch(key.clone()));
            // From the judgment's revision on: often the current one, now and then older.
            let start = if rng.chance(70) {
                view.rev + 1
            } else {
                created + 1
            };
            watch(view, WatchRange::Key(key), start)
        }
        Intent::Touch(key) => {
            let created = view.created(&key)?;
            view.intents.push(Intent::Release(key.clone()));
            Op::Touch { key, created }
        }
        Intent::Release(key) => {
            let created = view.created(&key)?;
            Op::Release { key, created }
        }
    };
    Some(op)
}

/// One side: the model or the real etcd, over gRPC, with its own revisions and lease IDs.
struct Side {
    name: &'static str,
    grpc: Grpc<Channel>,
    model: Option<Model>,
    /// The namespace of the sequence.
    ns: String,
    /// The revision the sequence started at.
    base: i64,
    /// The lease IDs, in the order of their grants.
    leases: Vec<i64>,
    keep_alive: mpsc::UnboundedSender<LeaseId>,
    kept: mpsc::UnboundedReceiver<Result<LeaseKeepAliveResponse, String>>,
    watch: mpsc::UnboundedSender<WatchRequest>,
    watched: Arc<Mutex<Vec<WatchResponse>>>,
}

type Answer = Result<String, String>;

fn status(status: &tonic::Status) -> String {
    format!("{:?}: {}", status.code(), status.message())
}

impl Side {
    async fn open(name: &'static str, url: &str, model: Option<Model>, ns: String) -> Side {
        let channel = tonic::transport::Endpoint::from_shared(url.to_owned())
            .expect("a URL")
            .connect()
            .await
            .unwrap_or_else(|e| panic!("{name}: cannot connect to {url}: {e}"));
        let grpc = Grpc::new(channel);
        let (keep_alive, outgoing) = mpsc::unbounded_channel();
        let (kept_tx, kept) = mpsc::unbounded_channel();
        let mut stream_grpc = grpc.clone();
        tokio::spawn(async move {
            let opened = async {
                stream_grpc.ready().await.map_err(|e| e.to_string())?;
                stream_grpc
                    .streaming(
                        tonic::Request::new(UnboundedReceiverStream::new(outgoing)),
                        PathAndQuery::from_static(path::LEASE_KEEP_ALIVE),
                        ProstCodec::<LeaseId, LeaseKeepAliveResponse>::default(),
                    )
                    .await
                    .map_err(|e| status(&e))
            };
            match opened.await {
                Ok(response) => {
                    let mut answers = response.into_inner();
                    loop {
                        let answer = match answers.message().await {
                            Ok(Some(answer)) => Ok(answer),
                            Ok(None) => Err("the keep-alive stream ended".to_owned()),
                            Err(e) => Err(status(&e)),
                        };
                        let end = answer.is_err();
                        if kept_tx.send(answer).is_err() || end {
                            return;
                        }
                    }
                }
                Err(e) => {
                    let _ = kept_tx.send(Err(e));
                }
            }
        });
        let (watch, outgoing) = mpsc::unbounded_channel();
        let watched = Arc::new(Mutex::new(Vec::new()));
        let mut stream_grpc = grpc.clone();
        let log = Arc::clone(&watched);
        tokio::spawn(async move {
            if stream_grpc.ready().await.is_err() {
                return;
            }
            let opened = stream_grpc
                .streaming(
                    tonic::Request::new(UnboundedReceiverStream::new(outgoing)),
                    PathAndQuery::from_static(path::WATCH),
                    ProstCodec::<WatchRequest, WatchResponse>::default(),
                )
                .await;
            let Ok(response) = opened else { return };
            let mut answers = response.into_inner();
            while let Ok(Some(answer)) = answers.message().await {
                log.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(answer);
            }
        });
        let mut side = Side {
            name,
            grpc,
            model,
            ns,
            base: 0,
            leases: Vec::new(),
            keep_alive,
            kept,
            watch,
            watched,
        };
        side.base = side
            .call::<_, RangeResponse>(path::RANGE, RangeRequest::probe())
            .await
            .unwrap_or_else(|e| panic!("{name}: the first read: {e}"))
            .revision();
        side
    }

    async fn call<Req, Resp>(&mut self, path: &'static str, request: Req) -> Result<Resp, String>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let answer = tokio::time::timeout(ANSWER, async {
            self.grpc.ready().await.map_err(|e| e.to_string())?;
            self.grpc
                .unary(
                    tonic::Request::new(request),
                    PathAndQuery::from_static(path),
                    ProstCodec::<Req, Resp>::default(),
                )
                .await
                .map(tonic::Response::into_inner)
                .map_err(|e| status(&e))
        })
        .await;
        answer.unwrap_or_else(|_| Err(format!("no answer from {} in {ANSWER:?}", self.name)))
    }

    // --- from the sequence's terms to this side's, and back ---

    fn id(&self, lease: LeaseRef) -> i64 {
        match lease {
            LeaseRef::Granted(i) => self.leases.get(i).copied().unwrap_or(UNKNOWN_LEASE),
            LeaseRef::Unknown => UNKNOWN_LEASE,
        }
    }

    fn name_key(&self, name: &str) -> String {
        format!("{}/{name}", self.ns)
    }

    fn key(&self, key: &KeySym) -> String {
        let hex = format!("{:x}", self.id(LeaseRef::Granted(key.lease)));
        match key.slot {
            0 => format!("{}/{}/{hex}", self.ns, key.name),
            n => format!("{}/{}/{hex}_{n}", self.ns, key.name),
        }
    }

    fn at(&self, rev: i64) -> i64 {
        self.base + rev
    }

    fn norm_rev(&self, rev: i64) -> i64 {
        if rev == 0 { 0 } else { rev - self.base }
    }

    fn norm_lease(&self, id: i64) -> String {
        if id == 0 {
            return "0".into();
        }
        match self.leases.iter().position(|l| *l == id) {
            Some(i) => format!("L{i}"),
            None => format!("?{id:x}"),
        }
    }

    fn norm_key(&self, key: &[u8]) -> String {
        let mut key = String::from_utf8_lossy(key).into_owned();
        for (i, id) in self.leases.iter().enumerate() {
            key = key.replace(&format!("{id:x}"), &format!("L{i}"));
        }
        key
    }

    fn norm_kv(&self, kv: &KeyValue) -> String {
        format!(
            "{}@c{}m{}v{}/{}={:?}",
            self.norm_key(&kv.key),
            self.norm_rev(kv.create_revision),
            self.norm_rev(kv.mod_revision),
            kv.version,
            self.norm_lease(kv.lease),
            String::from_utf8_lossy(&kv.value)
        )
    }

    fn norm_range(&self, range: &RangeResponse) -> String {
        let kvs: Vec<String> = range.kvs.iter().map(|kv| self.norm_kv(kv)).collect();
        format!("@{} [{}]", self.norm_rev(range.revision()), kvs.join(", "))
    }

    fn norm_txn(&self, txn: &TxnResponse) -> String {
        let ops: Vec<String> = txn
            .responses
            .iter()
            .map(|op| match &op.response {
                Some(Response::Range(range)) => self.norm_range(range),
                None => "-".into(),
            })
            .collect();
        format!(
            "{} @{} {{{}}}",
            if txn.succeeded { "success" } else { "failure" },
            self.norm_rev(txn.revision()),
            ops.join("; ")
        )
    }

    fn norm_watch(&self, answer: &WatchResponse) -> Vec<String> {
        if answer.created || answer.canceled || answer.events.is_empty() {
            return vec![format!(
                "{}{}@{} compact {} {:?}",
                if answer.created { "created " } else { "" },
                if answer.canceled { "canceled" } else { "" },
                self.norm_rev(answer.revision()),
                self.norm_rev(answer.compact_revision),
                answer.cancel_reason
            )];
        }
        answer
            .events
            .iter()
            .map(|e| {
                format!(
                    "{} {} prev {}",
                    if e.is_delete() { "DELETE" } else { "PUT" },
                    self.norm_kv(&e.kv()),
                    e.prev_kv.as_ref().map_or("-".into(), |p| self.norm_kv(p))
                )
            })
            .collect()
    }

    /// What each watch was sent, event by event.
    fn watch_log(&self) -> BTreeMap<i64, Vec<String>> {
        let mut log: BTreeMap<i64, Vec<String>> = BTreeMap::new();
        for answer in self
            .watched
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            log.entry(answer.watch_id)
                .or_default()
                .extend(self.norm_watch(answer));
        }
        log
    }

    // --- the calls ---

    async fn txn(&mut self, txn: TxnRequest) -> Answer {
        let answer = self.call::<_, TxnResponse>(path::TXN, txn).await?;
        Ok(self.norm_txn(&answer))
    }

    async fn range(&mut self, range: RangeRequest) -> Answer {
        let answer = self.call::<_, RangeResponse>(path::RANGE, range).await?;
        Ok(self.norm_range(&answer))
    }

    async fn delete_range(&mut self, key: Vec<u8>, range_end: Vec<u8>) -> Answer {
        let request = DeleteRangeRequest { key, range_end };
        let answer = self
            .call::<_, DeleteRangeResponse>(path::DELETE_RANGE, request)
            .await?;
        Ok(format!(
            "deleted {} @{}",
            answer.deleted,
            self.norm_rev(answer.header.map_or(0, |h| h.revision))
        ))
    }

    async fn run(&mut self, op: &Op) -> Answer {
        match op {
            Op::Grant { ttl } => {
                let granted = self
                    .call::<_, LeaseGrantResponse>(
                        path::LEASE_GRANT,
                        LeaseGrantRequest { ttl: *ttl },
                    )
                    .await?;
                self.leases.push(granted.id);
                Ok(format!(
                    "{} ttl {} {:?}",
                    self.norm_lease(granted.id),
                    granted.ttl,
                    granted.error
                ))
            }
            Op::Revoke { lease } => {
                let id = self.id(*lease);
                self.call::<_, Empty>(path::LEASE_REVOKE, LeaseId { id })
                    .await
                    .map(|_| "revoked".into())
            }
            Op::OperatorRevoke { lease } => {
                let id = self.id(*lease);
                match &self.model {
                    Some(model) => Ok(format!("revoked {}", model.revoke_lease(id))),
                    None => {
                        let revoked = self
                            .call::<_, Empty>(path::LEASE_REVOKE, LeaseId { id })
                            .await;
                        Ok(format!("revoked {}", revoked.is_ok()))
                    }
                }
            }
            Op::TimeToLive { lease } => {
                let id = self.id(*lease);
                let answer = self
                    .call::<_, LeaseTimeToLiveResponse>(path::LEASE_TIME_TO_LIVE, LeaseId { id })
                    .await?;
                // Compared within a second (see `agree`).
                Ok(format!("ttl {}", answer.ttl))
            }
            Op::KeepAlive { lease } => {
                let id = self.id(*lease);
                self.keep_alive
                    .send(LeaseId { id })
                    .map_err(|_| "the keep-alive stream is gone".to_owned())?;
                let answer = tokio::time::timeout(ANSWER, self.kept.recv())
                    .await
                    .map_err(|_| "no keep-alive answer".to_owned())?
                    .ok_or("the keep-alive stream is gone")??;
                Ok(format!(
                    "kept {} ttl {}",
                    self.norm_lease(answer.id),
                    answer.ttl
                ))
            }
            Op::Join { key, lease } => {
                let own = self.key(key);
                let value = match recipe_of(key.name) {
                    Recipe::Leader => format!("v{}", key.lease).into_bytes(),
                    Recipe::Semaphore => {
                        format!("{{\"limit\":{LIMIT},\"value\":\"djE=\"}}").into_bytes()
                    }
                };
                let txn = TxnRequest {
                    compare: vec![Compare::absent(&own)],
                    success: vec![RequestOp::put(PutRequest {
                        key: own.clone().into_bytes(),
                        value,
                        lease: self.id(*lease),
                        ..PutRequest::default()
                    })],
                    failure: vec![RequestOp::range(RangeRequest::key(&own))],
                };
                self.txn(txn).await
            }
            Op::Read {
                key,
                created,
                first,
            } => {
                let own = self.key(key);
                let name = self.name_key(key.name);
                let created = self.at(*created);
                let ahead = match recipe_of(key.name) {
                    Recipe::Leader => RangeRequest::under(&name)
                        .by_creation(false)
                        .limit(1)
                        .created_by(created - 1),
                    Recipe::Semaphore => RangeRequest::under(&name).by_creation(true).limit(LIMIT),
                };
                let mut ops = vec![
                    RequestOp::range(RangeRequest::key(&own)),
                    RequestOp::range(ahead.clone()),
                ];
                if let Recipe::Semaphore = recipe_of(key.name) {
                    ops.push(RequestOp::range(
                        RangeRequest::under(&name)
                            .created_by(created - 1)
                            .limit(1000),
                    ));
                }
                if *first {
                    ops.push(RequestOp::range(ahead.at_revision(created)));
                }
                self.txn(TxnRequest {
                    success: ops,
                    ..TxnRequest::default()
                })
                .await
            }
            Op::Touch { key, created } => {
                let own = self.key(key);
                let txn = TxnRequest {
                    compare: vec![Compare::created(&own, self.at(*created))],
                    success: vec![RequestOp::put(PutRequest::touch(&own))],
                    ..TxnRequest::default()
                };
                self.txn(txn).await
            }
            Op::Release { key, created } => {
                let own = self.key(key);
                let txn = TxnRequest {
                    compare: vec![
                        Compare::created(&own, self.at(*created)),
                        Compare::touched(&own),
                    ],
                    success: vec![RequestOp::delete(&own)],
                    ..TxnRequest::default()
                };
                self.txn(txn).await
            }
            Op::GiveBack { key, created } => {
                let own = self.key(key);
                let txn = TxnRequest {
                    compare: created
                        .map(|c| vec![Compare::created(&own, self.at(c))])
                        .unwrap_or_default(),
                    success: vec![RequestOp::delete(&own)],
                    ..TxnRequest::default()
                };
                self.txn(txn).await
            }
            Op::Keep {
                key,
                created,
                lease,
            } => {
                let own = self.key(key);
                let txn = TxnRequest {
                    compare: vec![Compare::created(&own, self.at(*created))],
                    success: vec![RequestOp::put(PutRequest {
                        key: own.clone().into_bytes(),
                        lease: self.id(*lease),
                        ignore_value: true,
                        ..PutRequest::default()
                    })],
                    ..TxnRequest::default()
                };
                self.txn(txn).await
            }
            Op::Check { key, index } => {
                let index = self.at(*index);
                let holder = self.key(key);
                let holder = holder.rsplit('/').next().unwrap_or_default().to_owned();
                // A leader's sequencer names the election, a semaphore holder's its own key.
                let seq_key = match recipe_of(key.name) {
                    Recipe::Leader => self.name_key(key.name),
                    Recipe::Semaphore => self.key(key),
                };
                let leader_own = format!("{seq_key}/{holder}");
                let mut ops = vec![
                    RequestOp::range(RangeRequest::key(&leader_own)),
                    RequestOp::range(
                        RangeRequest::under(&seq_key)
                            .by_creation(false)
                            .limit(1)
                            .created_by(index - 1),
                    ),
                    RequestOp::range(RangeRequest::key(&seq_key)),
                ];
                if let Some((prefix, _)) = seq_key.rsplit_once('/') {
                    ops.push(RequestOp::range(
                        RangeRequest::under(prefix)
                            .keys_only()
                            .created_by(index - 1),
                    ));
                }
                self.txn(TxnRequest {
                    success: ops,
                    ..TxnRequest::default()
                })
                .await
            }
            Op::Observe { name } => {
                let name = self.name_key(name);
                self.range(RangeRequest::under(&name).by_creation(true).limit(1))
                    .await
            }
            Op::ReadOwn { key } => {
                let own = self.key(key);
                self.range(RangeRequest::key(&own)).await
            }
            Op::Probe => self.range(RangeRequest::probe()).await,
            Op::Delete { name } => {
                let name = self.name_key(name);
                let one = self
                    .delete_range(name.clone().into_bytes(), Vec::new())
                    .await?;
                let (key, range_end) = lease_etcd::proto::dir_range(&name);
                let dir = self.delete_range(key, range_end).await?;
                Ok(format!("{one}; {dir}"))
            }
            Op::OperatorDeleteKey { key } => {
                let own = self.key(key);
                match &self.model {
                    Some(model) => Ok(format!("deleted {}", model.delete_key(&own))),
                    None => {
                        let request = DeleteRangeRequest {
                            key: own.into_bytes(),
                            range_end: Vec::new(),
                        };
                        let answer = self
                            .call::<_, DeleteRangeResponse>(path::DELETE_RANGE, request)
                            .await?;
                        Ok(format!("deleted {}", answer.deleted))
                    }
                }
            }
            Op::OperatorDeletePrefix { name } => {
                let prefix = format!("{}/", self.name_key(name));
                match &self.model {
                    Some(model) => Ok(format!("deleted {}", model.delete_prefix(&prefix))),
                    None => {
                        let (key, range_end) = lease_etcd::proto::dir_range(&self.name_key(name));
                        let request = DeleteRangeRequest { key, range_end };
                        let answer = self
                            .call::<_, DeleteRangeResponse>(path::DELETE_RANGE, request)
                            .await?;
                        Ok(format!("deleted {}", answer.deleted))
                    }
                }
            }
            Op::Compact { rev } => {
                let at = self.at(*rev);
                match &self.model {
                    Some(model) => Ok(match model.compact(at) {
                        Ok(()) => "compacted".into(),
                        Err(e) => status(&e),
                    }),
                    None => {
                        let request = operator::CompactionRequest {
                            revision: at,
                            physical: true,
                        };
                        Ok(
                            match self
                                .call::<_, operator::CompactionResponse>(operator::COMPACT, request)
                                .await
                            {
                                Ok(_) => "compacted".into(),
                                Err(e) => e,
                            },
                        )
                    }
                }
            }
            Op::Watch { id, range, start } => {
                let range = match range {
                    WatchRange::Key(key) => RangeRequest::key(&self.key(key)),
                    WatchRange::Name(name) => RangeRequest::under(&self.name_key(name)),
                };
                let create = WatchCreateRequest {
                    key: range.key,
                    range_end: range.range_end,
                    start_revision: self.at(*start),
                    progress_notify: true,
                    prev_kv: true,
                    watch_id: *id,
                };
                self.watch
                    .send(WatchRequest {
                        request_union: Some(WatchRequestUnion::Create(create)),
                    })
                    .map_err(|_| "the watch stream is gone".to_owned())?;
                // Waits for the creation's answer, as the client does.
                let answered = |log: &[WatchResponse]| {
                    log.iter()
                        .find(|a| a.created && (a.watch_id == *id || a.watch_id == -1))
                        .cloned()
                };
                let deadline = Instant::now() + ANSWER;
                loop {
                    let created =
                        answered(&self.watched.lock().unwrap_or_else(PoisonError::into_inner));
                    if let Some(created) = created {
                        return Ok(self.norm_watch(&created).join(""));
                    }
                    if Instant::now() > deadline {
                        return Err("no answer to the watch's creation".into());
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            Op::Cancel { id } => {
                let cancel = WatchRequest {
                    request_union: Some(WatchRequestUnion::Cancel(WatchCancelRequest {
                        watch_id: *id,
                    })),
                };
                self.watch
                    .send(cancel)
                    .map_err(|_| "the watch stream is gone".to_owned())?;
                let deadline = Instant::now() + ANSWER;
                loop {
                    let cancelled = self
                        .watched
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .iter()
                        .rev()
                        .find(|a| {
                            a.watch_id == *id && a.canceled && !a.created && a.compact_revision == 0
                        })
                        .cloned();
                    if let Some(cancelled) = cancelled {
                        return Ok(self.norm_watch(&cancelled).join(""));
                    }
                    if Instant::now() > deadline {
                        return Ok("no answer to the cancel".into());
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            Op::Authenticate => {
                let request = AuthenticateRequest {
                    name: "root".into(),
                    password: "secret".into(),
                };
                self.call::<_, AuthenticateResponse>(path::AUTHENTICATE, request)
                    .await
                    .map(|a| format!("token {}", !a.token.is_empty()))
            }
        }
    }

    /// Every key of the namespace.
    async fn keys(&mut self) -> Answer {
        let (key, range_end) = lease_etcd::proto::dir_range(&self.ns);
        let answer = self
            .call::<_, RangeResponse>(
                path::RANGE,
                RangeRequest {
                    key,
                    range_end,
                    ..RangeRequest::default()
                },
            )
            .await?;
        let kvs: Vec<String> = answer.kvs.iter().map(|kv| self.norm_kv(kv)).collect();
        Ok(kvs.join(", "))
    }

    /// Every lease there is.
    async fn lease_ids(&mut self) -> Result<Vec<i64>, String> {
        match &self.model {
            Some(model) => Ok(model.leases().iter().map(|l| l.id).collect()),
            None => {
                let answer = self
                    .call::<_, operator::LeaseLeasesResponse>(
                        operator::LEASES,
                        operator::LeaseLeasesRequest {},
                    )
                    .await?;
                let mut ids: Vec<i64> = answer.leases.iter().map(|l| l.id).collect();
                ids.sort_unstable();
                Ok(ids)
            }
        }
    }

    async fn leases(&mut self) -> Answer {
        let ids = self.lease_ids().await?;
        Ok(ids
            .iter()
            .map(|id| self.norm_lease(*id))
            .collect::<Vec<_>>()
            .join(", "))
    }

    /// Leaves nothing of the sequence behind on this side.
    async fn clean_up(&mut self) {
        for id in self.lease_ids().await.unwrap_or_default() {
            let _ = self
                .call::<_, Empty>(path::LEASE_REVOKE, LeaseId { id })
                .await;
        }
        let (key, range_end) = lease_etcd::proto::dir_range(&self.ns);
        let _ = self
            .call::<_, DeleteRangeResponse>(
                path::DELETE_RANGE,
                DeleteRangeRequest { key, range_end },
            )
            .await;
    }
}

/// Whether two answers agree: equal, or for a time-to-live within a second.
fn agree(op: &Op, model: &Answer, real: &Answer) -> bool {
    if model == real {
        return true;
    }
    let ttl = |answer: &Answer| {
        answer
            .as_ref()
            .ok()
            .and_then(|a| a.strip_prefix("ttl "))
            .and_then(|t| t.parse::<i64>().ok())
    };
    matches!(op, Op::TimeToLive { .. })
        && matches!((ttl(model), ttl(real)), (Some(m), Some(r)) if m >= 0 && r >= 0 && (m - r).abs() <= 1)
}

/// Waits until both sides sent the same to every watch, or `ANSWER` passes; the two logs. The
/// model's watches from the past have their history within a millisecond: the logs agree once
/// etcd has sent its (or when neither had any to send). `synced`: also wait until etcd's sync
/// loop has run for every watch from the past (before a compaction, which cancels a watch that
/// waits for its history from before it, with or without events to send).
async fn settle(
    model: &Side,
    real: &Side,
    view: &View,
    synced: bool,
) -> (BTreeMap<i64, Vec<String>>, BTreeMap<i64, Vec<String>>) {
    let youngest = view
        .watches
        .iter()
        .filter(|(_, _, past)| *past)
        .map(|(_, at, _)| *at)
        .max();
    if let (true, Some(youngest)) = (synced, youngest) {
        tokio::time::sleep_until(youngest + SYNCED_AFTER).await;
    }
    tokio::time::sleep(Duration::from_millis(2)).await;
    let deadline = Instant::now() + ANSWER;
    let mut agreed = 0;
    loop {
        let (m, r) = (model.watch_log(), real.watch_log());
        if m == r {
            agreed += 1;
            if agreed == 2 {
                return (m, r);
            }
        } else {
            agreed = 0;
        }
        if Instant::now() > deadline {
            return (m, r);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn show(log: &BTreeMap<i64, Vec<String>>) -> String {
    let mut text = String::new();
    for (id, answers) in log {
        let _ = writeln!(text, "    watch {id}:");
        for answer in answers {
            let _ = writeln!(text, "      {answer}");
        }
    }
    text
}

/// The model's state, in the sequence's terms, for the next operation.
fn look(model: &Model, side: &Side, view: &mut View) {
    view.rev = model.revision() - side.base;
    view.compacted = Some(model.compacted())
        .filter(|c| *c >= 0)
        .map(|c| c - side.base);
    view.granted = side.leases.len();
    let leases = model.leases();
    view.alive = (0..side.leases.len())
        .filter(|i| leases.iter().any(|l| l.id == side.leases[*i]))
        .collect();
    view.contenders.clear();
    for kv in model.keys() {
        let Some(rest) = kv.key.strip_prefix(&format!("{}/", side.ns)) else {
            continue;
        };
        let Some((name, holder)) = rest.split_once('/') else {
            continue;
        };
        let Some(name) = NAMES.iter().find(|n| **n == name) else {
            continue;
        };
        let (hex, slot) = match holder.split_once('_') {
            Some((hex, n)) => (hex, n.parse().unwrap_or(0)),
            None => (holder, 0),
        };
        let Some(lease) = side.leases.iter().position(|id| format!("{id:x}") == hex) else {
            continue;
        };
        let key = KeySym { name, lease, slot };
        view.contenders
            .push((key, kv.create_revision - side.base, kv.version));
    }
}

async fn serve(model: &Model) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let url = format!("http://{}", listener.local_addr().expect("its address"));
    let model = model.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let model = model.clone();
            tokio::spawn(async move {
                let _ = socket.set_nodelay(true);
                let _ = model.serve_connection(socket).await;
            });
        }
    });
    url
}

/// The model as the test support's etcd is configured: 50 ms heartbeats and a 500 ms election
/// timeout, so the shortest lease TTL is 1 s.
/// Its watch sync loop runs every millisecond, so that its watches from the past have their
/// history long before etcd's (every 100 ms) do: both sides have sent the same once etcd has.
fn model_config(seed: u64) -> Config {
    Config::new(seed)
        .min_lease_ttl(1)
        .election_timeout(Duration::from_millis(500))
        .sync_interval(Duration::from_millis(1))
}

/// One sequence of `seed` against both; the operations it ran, or the disagreement.
async fn sequence(seed: u64, etcd_url: &str) -> Result<usize, String> {
    let ns = format!("d{seed}");
    let model = Model::new(model_config(seed));
    let model_url = serve(&model).await;
    let mut m = Side::open("model", &model_url, Some(model.clone()), ns.clone()).await;
    let mut r = Side::open("etcd", etcd_url, None, ns).await;
    let mut rng = Rng(seed);
    let mut view = View::default();
    look(&model, &m, &mut view);
    let steps = 10 + rng.below(21);
    let fail = |step: usize, op: &dyn std::fmt::Debug, model: &str, real: &str| {
        format!(
            "seed {seed}, step {step}: {op:?}\n  model: {model}\n  etcd:  {real}\n(replay: \
             ETCD_DIFF_SEED={seed} ETCD_DIFF_SEQUENCES=1)"
        )
    };
    for step in 0..steps {
        let op = generate(&mut rng, &mut view);
        // Cancelled, or compacted, only once both sides have delivered what they will.
        if matches!(op, Op::Cancel { .. } | Op::Compact { .. }) {
            let synced = matches!(op, Op::Compact { .. });
            let (ml, rl) = settle(&m, &r, &view, synced).await;
            if ml != rl {
                return Err(fail(step, &"the watches before it", &show(&ml), &show(&rl)));
            }
        }
        // The two sides are independent: both at once.
        let (ma, ra) = tokio::join!(m.run(&op), r.run(&op));
        if std::env::var_os("ETCD_DIFF_TRACE").is_some() {
            println!("{seed}.{step} {op:?}\n  model: {ma:?}\n  etcd:  {ra:?}");
        }
        if !agree(&op, &ma, &ra) {
            return Err(fail(step, &op, &format!("{ma:?}"), &format!("{ra:?}")));
        }
        if std::env::var_os("ETCD_DIFF_STATS").is_some() {
            let kind = format!("{op:?}");
            let kind = kind.split([' ', '{']).next().unwrap_or_default().to_owned();
            let outcome = match &ma {
                Ok(a) => a.split([' ', '@']).next().unwrap_or_default().to_owned(),
                Err(e) => e.split(':').next().unwrap_or_default().to_owned(),
            };
            let extra = if ma
                .as_ref()
                .is_ok_and(|a| a.contains("compact") && !a.contains("compact 0"))
            {
                " compacted"
            } else {
                ""
            };
            println!("STAT {kind} {outcome}{extra}");
        }
        match &op {
            Op::Watch { id, start, .. } => {
                view.last_watch = *id;
                view.watches.push((*id, Instant::now(), *start <= view.rev));
            }
            Op::Cancel { id } => view.watches.retain(|(w, ..)| w != id),
            _ => {}
        }
        look(&model, &m, &mut view);
    }
    let (ml, rl) = settle(&m, &r, &view, false).await;
    if std::env::var_os("ETCD_DIFF_TRACE").is_some() {
        println!("{seed} the watches:\n{}", show(&ml));
    }
    if ml != rl {
        return Err(fail(steps, &"the watches", &show(&ml), &show(&rl)));
    }
    let (mk, rk) = (m.keys().await, r.keys().await);
    if mk != rk {
        return Err(fail(
            steps,
            &"the keys left",
            &format!("{mk:?}"),
            &format!("{rk:?}"),
        ));
    }
    let (ml, rl) = (m.leases().await, r.leases().await);
    if ml != rl {
        return Err(fail(
            steps,
            &"the leases left",
            &format!("{ml:?}"),
            &format!("{rl:?}"),
        ));
    }
    r.clean_up().await;
    Ok(steps)
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::test]
async fn the_model_answers_as_etcd_does() {
    lease_tests::init_tracing();
    let server = lease_tests::etcd::Server::start().await;
    let url = server.url();
    let first = env("ETCD_DIFF_SEED", 1);
    let count = env("ETCD_DIFF_SEQUENCES", 200);
    let started = Instant::now();
    let mut operations = 0;
    for seed in first..first + count {
        match sequence(seed, &url).await {
            Ok(steps) => operations += steps,
            Err(disagreement) => panic!("the model disagrees with etcd: {disagreement}"),
        }
    }
    println!(
        "etcd differential: {count} sequences, {operations} operations, {:.1} s, no disagreement",
        started.elapsed().as_secs_f64()
    );
}

/// Leases expire and are revoked alike: the keys of each go in one revision, a keep-alive after
/// the revocation answers 0, its time-to-live -1, and a put on it is refused. Short TTLs (the
/// test support's etcd has a 1 s minimum), so a few seconds of real time.
#[tokio::test]
async fn expired_leases_are_revoked_alike() {
    lease_tests::init_tracing();
    let server = lease_tests::etcd::Server::start().await;
    let seed = 9_000;
    let ns = format!("d{seed}");
    let model = Model::new(model_config(seed));
    let model_url = serve(&model).await;
    let mut m = Side::open("model", &model_url, Some(model.clone()), ns.clone()).await;
    let mut r = Side::open("etcd", &server.url(), None, ns).await;
    let key = |lease, slot| KeySym {
        name: "e0",
        lease,
        slot,
    };
    let mut ops = vec![
        Op::Grant { ttl: 1 },
        Op::Grant { ttl: 2 },
        Op::Grant { ttl: 30 },
        Op::Watch {
            id: 1,
            range: WatchRange::Name("e0"),
            start: 1,
        },
    ];
    for (lease, slot) in [(0, 0), (0, 1), (1, 0), (1, 2), (2, 0)] {
        ops.push(Op::Join {
            key: key(lease, slot),
            lease: LeaseRef::Granted(lease),
        });
    }
    ops.push(Op::KeepAlive {
        lease: LeaseRef::Granted(1),
    });
    let mut step = 0;
    let mut compare = |op: &Op, ma: Answer, ra: Answer| {
        step += 1;
        if std::env::var_os("ETCD_DIFF_TRACE").is_some() {
            println!("{step} {op:?}\n  model: {ma:?}\n  etcd:  {ra:?}");
        }
        assert!(
            agree(op, &ma, &ra),
            "the model disagrees with etcd at step {step}: {op:?}\n  model: {ma:?}\n  etcd:  {ra:?}"
        );
    };
    for op in &ops {
        let (ma, ra) = tokio::join!(m.run(op), r.run(op));
        compare(op, ma, ra);
    }
    // Lease 0 expires at 1 s, lease 1 at 2 s; etcd revokes each within about half a second.
    tokio::time::sleep(Duration::from_millis(3200)).await;
    let after = [
        Op::KeepAlive {
            lease: LeaseRef::Granted(0),
        },
        Op::TimeToLive {
            lease: LeaseRef::Granted(1),
        },
        Op::Join {
            key: key(0, 3),
            lease: LeaseRef::Granted(0),
        },
        Op::Observe { name: "e0" },
    ];
    for op in &after {
        let (ma, ra) = tokio::join!(m.run(op), r.run(op));
        compare(op, ma, ra);
    }
    let view = View::default();
    let (ml, rl) = settle(&m, &r, &view, true).await;
    if std::env::var_os("ETCD_DIFF_TRACE").is_some() {
        println!("the watch:\n{}", show(&ml));
    }
    assert_eq!(
        ml,
        rl,
        "the watch:\nmodel:\n{}etcd:\n{}",
        show(&ml),
        show(&rl)
    );
    assert_eq!(m.keys().await, r.keys().await);
    assert_eq!(m.leases().await, r.leases().await);
    r.clean_up().await;
}
