//! Every blocking query of a client, multiplexed onto a few prefix watches.
//!
//! A held lease must notice at once when its key changes, and a waiting one when the key frees
//! up. One blocking query per lease would need one connection per lease (HTTP/1.1 carries one
//! request at a time), and Consul allows each client IP 200. Instead, a client watches **groups**:
//! prefixes that together cover every key and prefix some lease, waiter, observer or
//! semaphore coordinator is interested in. Each group is one recursive blocking query
//! (`GET /v1/kv/<group>?recurse&index=`); when it answers, the group compares the listing with
//! the previous one and wakes only the watchers whose keys changed.
//!
//! There are at most `Budget::max_watches` (in `wire::budget`) groups (all the
//! connections but two, or three with a client of your own), and no group's prefix is a prefix of
//! another's, so every key is covered by at most one group. A watcher whose key no group covers
//! gets a new group (of that key alone, so a process with a few leases watches each key on its own)
//! while there is room; otherwise the group sharing the longest prefix with it is widened to that
//! common prefix, absorbing any groups the wider prefix covers. A group nobody watches any more
//! stops after its current read (so a watcher that comes back meanwhile finds it still running).
//!
//! ## Every interest is read within one listing's time
//! Each group holds a watch slot of the client's budget for as long as it runs, so its reads
//! never queue behind other requests, and at most `max_watches` groups are registered. An
//! absorbed group's last read runs on until Consul answers it (abandoning it would close its
//! connection on our side, but Consul's agent counts the connection until the read's wait
//! ends), and keeps its slot meanwhile. A group that then finds no slot free does not wait for
//! it: it abandons the oldest such read and takes its slot. (Waiting left the wider group
//! without a read for up to one [`WATCH_WAIT`], 30 s, during which a lease whose key only it
//! covered went unwatched.) So the agent may count up to one connection more than the budget
//! per group started that way, for at most 30 s; our side never has more open than the budget.
//!
//! So a key, prefix or directory someone is interested in is always covered by a blocking read in
//! flight, except while its group reads a plain listing: when the group starts (or widens), and
//! after a read failed. That takes one listing: milliseconds, tens of them for a directory of
//! 10,000 keys, and never more than the request timeout. During such a gap, and for as long as a
//! group's reads fail, the [`Fence`]s of the leases it watches are suspended from the moment the
//! gap began: a lease whose key nobody reads self-fences one fence interval
//! (TTL − max(TTL/10, 1 s)) later at the latest, however well its session is kept, and a listing
//! that succeeds lifts the suspension. Idle, a group costs one request per [`WATCH_WAIT`], whatever the number of leases.
//!
//! One more gap, bounded and deliberate: a directory that changes faster than it can be listed
//! (thousands of leases acquired at once: each answer brings 16 keys changed or more, at once)
//! would be listed back to back, and on a 2-core machine the agent's listings then slow the very
//! writes they report (10,000 acquisitions took 6.3 s, against 4.7 s with the pause). After such
//! an answer the group waits twice as long as the read took, at most 150 ms, before reading on.
//! Nothing is missed (the next read starts from the last index, so it answers at once with
//! whatever changed meanwhile), only seen up to 150 ms later, and only while the directory is
//! that busy: an answer that brings a change or two (a loss, a hand-off) is never followed by a
//! pause.
//!
//! Groups are not split further, because with prefixes that may not nest they cannot be: a
//! directory's watched keys can be split only into prefixes that together cover them all, and
//! keys named `<dir>/0` … `<dir>/4999` begin with ten different digits, so any split of them
//! takes ten groups or more, past the budget; hex or UUID names take sixteen. Nested groups
//! would not read less: the outer one would still re-read the whole directory on every change
//! inside it.
//!
//! The cost of this multiplexing is that an answer carries every key under its group: a loss
//! among 5,000 keys under one directory is read as a listing of 5,000 entries (1.4 MB). Consul
//! 1.8 spends 3–5 µs an entry on it (12–25 ms, with the machine's load; its `?keys` listing of
//! the same keys takes 4 ms), the client about 1 µs an entry parsing it and well under 1 ms
//! comparing and waking: 18–37 ms from destroy to cancel at the median, against about 1 ms for
//! a one-key blocking query. Consul 1.8 has no cheaper way to learn which of many keys changed:
//! its KV listing has no filter and no paging, and a separator-folded `?keys` listing, though
//! tiny, says only *that* something under a directory changed.
//!
//! Answers are read in Consul's default consistency mode. A watcher never acts on a listing
//! older than what it already knows: each listing carries its index, and a watcher that wrote
//! at index `i` waits for a listing of index `i` or later.

mod group;
mod registry;
mod watched;

pub(crate) use group::{Interest, Listing};
pub(crate) use watched::{Watched, Watches};
