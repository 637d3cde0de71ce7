//! The planner's rounds, on hand-made snapshots and a hand-held clock.

use std::collections::HashMap;

use super::*;
use crate::semaphore::Unreadable;

const SECOND: Duration = Duration::from_secs(1);

/// One semaphore's planner and queue, on a clock that starts at `t0`.
struct Rig {
    planner: Planner,
    queue: Queue<(), ()>,
    t0: Instant,
}

impl Rig {
    fn new(takes: Vec<Take>, gives: Vec<Give>) -> Rig {
        let mut queue = Queue::default();
        takes.into_iter().for_each(|t| queue.push_take(t, ()));
        gives.into_iter().for_each(|g| queue.push_give(g, ()));
        Rig {
            planner: Planner::default(),
            queue,
            t0: Instant::now(),
        }
    }

    /// A round at `t0 + after`, on a snapshot read from the backend.
    fn fresh(&mut self, snapshot: &Snapshot, after: Duration) -> Plan<(), ()> {
        let now = self.t0 + after;
        (self.planner).plan("p", snapshot, &mut self.queue, true, now)
    }

    /// A round at `t0 + after`, on a snapshot derived from our own writes.
    fn derived(&mut self, snapshot: &Snapshot, after: Duration) -> Plan<(), ()> {
        let now = self.t0 + after;
        (self.planner).plan("p", snapshot, &mut self.queue, false, now)
    }

    /// When a round is due with no change, counted from `t0`.
    fn wake(&self) -> Option<Duration> {
        let wake = self.planner.next_wake();
        wake.map(|at| at.duration_since(self.t0))
    }
}

/// `.lock` with this ModifyIndex, limit and holders; `live` hold their contender keys (LockIndex
/// 1 each).
fn snapshot(lock: Option<(u64, u64, &[&str])>, live: &[&str]) -> Snapshot {
    Snapshot {
        lock: Ok(lock.map(|(modify_index, limit, holders)| {
            let holders = holders.iter().map(|h| (*h).to_owned()).collect();
            (modify_index, LockValue { limit, holders })
        })),
        live: live.iter().map(|s| (*s).to_owned()).collect(),
        contenders: live.iter().map(|s| ((*s).to_owned(), 1)).collect(),
        index: 100,
        lock_created: lock.map(|_| 1),
    }
}

fn take(session: &str, limit: u64, settle: Duration) -> Take {
    let session = session.to_owned();
    let once = false;
    Take {
        session,
        limit,
        settle,
        once,
    }
}

fn once(session: &str, limit: u64) -> Take {
    Take {
        once: true,
        ..take(session, limit, Duration::ZERO)
    }
}

fn give(session: &str) -> Give {
    Give {
        session: session.to_owned(),
        delete_contender: true,
        settle: Duration::ZERO,
    }
}

fn holders(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|h| (*h).to_owned()).collect()
}

fn admitted(write: &Write<(), ()>) -> Vec<&str> {
    write
        .admits
        .iter()
        .map(|a| a.take.session.as_str())
        .collect()
}

fn leaving(gives: &[(Give, ())]) -> Vec<&str> {
    gives.iter().map(|(g, ())| g.session.as_str()).collect()
}

fn answers(plan: &Plan<(), ()>) -> HashMap<&str, &Result<Taken, Error>> {
    let answered = plan.answered.iter();
    answered
        .map(|(take, (), answer)| (take.session.as_str(), answer))
        .collect()
}

fn planned_write(plan: Plan<(), ()>) -> Write<(), ()> {
    match plan.next {
        Next::Write(write) => write,
        other => panic!("expected a write, planned {other:?}"),
    }
}

fn waits(plan: &Plan<(), ()>) -> bool {
    matches!(plan.next, Next::Wait)
}

#[test]
fn takes_and_gives_in_one_round() {
    let before = snapshot(Some((7, 2, &["a", "b"])), &["a", "b"]);
    let c_and_d = vec![take("c", 2, SECOND), take("d", 2, SECOND)];
    let mut rig = Rig::new(c_and_d, vec![give("a")]);
    let plan = rig.fresh(&before, Duration::ZERO);
    assert!(plan.answered.is_empty() && plan.given.is_empty());
    let write = planned_write(plan);
    // a's slot goes to c in the same write; d waits for the next free slot.
    assert_eq!(leaving(&write.gives), ["a"]);
    assert_eq!(admitted(&write), ["c"]);
    assert!(!write.admits[0].relock);
    let value = LockValue {
        limit: 2,
        holders: holders(&["b", "c"]),
    };
    let cas_index = 7;
    assert_eq!(write.lock, Some(LockWrite { cas_index, value }));

    // Planned again on the state the write leads to, without reading: d still waits.
    let after = write.applied_to(&before, 108, 108, &[3]);
    assert_eq!(after.index, 108);
    assert_eq!(after.live_holders(), holders(&["b", "c"]));
    assert_eq!(after.contenders.get("c"), Some(&3));
    assert!(!after.live.contains("a"));
    let plan = rig.derived(&after, Duration::ZERO);
    assert!(plan.answered.is_empty() && waits(&plan));
    assert_eq!(rig.wake(), None);
}

#[test]
fn a_dead_holder_keeps_its_slot_within_its_settle_time_and_is_pruned_after() {
    // a's session is gone (its contender key with it); b is alive.
    let full = snapshot(Some((7, 2, &["a", "b"])), &["b"]);
    let settle = 2 * SECOND;
    let mut rig = Rig::new(vec![take("c", 2, settle)], Vec::new());
    for after in [Duration::ZERO, SECOND, settle - Duration::from_nanos(1)] {
        assert!(waits(&rig.fresh(&full, after)), "at {after:?}");
        assert_eq!(rig.wake(), Some(settle));
        assert!(!rig.planner.at_rest());
    }
    // A take that must not wait is told so meanwhile.
    rig.queue.push_take(once("e", 2), ());
    let plan = rig.fresh(&full, SECOND);
    assert!(matches!(answers(&plan)["e"], Ok(Taken::Full)));

    let write = planned_write(rig.fresh(&full, settle));
    assert_eq!(admitted(&write), ["c"]);
    let lock = write.lock.expect("the holder set changes");
    assert_eq!(lock.value.holders, holders(&["b", "c"]));
    assert_eq!(rig.wake(), None);
}

#[test]
fn an_idle_round_prunes_a_dead_holder_once_its_settle_time_is_over() {
    let with_dead = snapshot(Some((7, 2, &["a", "b"])), &["b"]);
    // The last request is b's give-back (keeping its key for the pool); then nothing waits.
    let pooled = Give {
        delete_contender: false,
        settle: SECOND,
        ..give("b")
    };
    let mut rig = Rig::new(Vec::new(), vec![pooled]);
    let lock = planned_write(rig.fresh(&with_dead, Duration::ZERO)).lock;
    let lock = lock.expect("b leaves");
    assert_eq!(lock.value.holders, holders(&["a"]), "a keeps its slot");
    assert_eq!(rig.wake(), Some(SECOND));

    let only_dead = snapshot(Some((9, 2, &["a"])), &["b"]);
    let plan = rig.fresh(&only_dead, SECOND / 2);
    assert!(matches!(plan.next, Next::Idle));
    let lock = planned_write(rig.fresh(&only_dead, SECOND)).lock;
    let lock = lock.expect("a is pruned");
    assert_eq!((lock.cas_index, lock.value.holders), (9, holders(&[])));
    let pruned = snapshot(Some((10, 2, &[])), &["b"]);
    assert!(matches!(rig.fresh(&pruned, SECOND).next, Next::Idle));
    assert!(rig.planner.at_rest());
}

#[test]
fn limit_mismatch_is_refused_and_the_rest_planned() {
    let stored = snapshot(Some((7, 2, &["a"])), &["a"]);
    let x_then_y = vec![take("x", 3, SECOND), take("y", 2, SECOND)];
    let mut rig = Rig::new(x_then_y, Vec::new());
    let plan = rig.fresh(&stored, Duration::ZERO);
    assert!(matches!(
        answers(&plan)["x"],
        Err(Error::LimitMismatch { key, stored: 2, requested: 3 }) if key == "p"
    ));
    assert_eq!(admitted(&planned_write(plan)), ["y"]);

    // With no lock key yet, the first take's limit creates it; the others wait, then are refused.
    let none = snapshot(None, &[]);
    let two_then_three = vec![take("x", 2, SECOND), take("y", 3, SECOND)];
    let mut rig = Rig::new(two_then_three, Vec::new());
    let write = planned_write(rig.fresh(&none, Duration::ZERO));
    let lock = write.lock.as_ref().expect("created");
    assert_eq!((lock.cas_index, lock.value.limit), (0, 2));
    let created = write.applied_to(&none, 101, 101, &[1]);
    let plan = rig.derived(&created, Duration::ZERO);
    let refused = answers(&plan)["y"];
    let expected = (2, 3);
    assert!(
        matches!(refused, Err(Error::LimitMismatch { stored, requested, .. }) if (*stored, *requested) == expected)
    );
    assert!(matches!(plan.next, Next::Idle));
}

#[test]
fn a_deleted_lock_with_live_contenders_admits_nobody_for_the_settle_time() {
    // `.lock` is gone, but a and b still hold their contender keys: they may still be running.
    let orphaned = snapshot(None, &["a", "b"]);
    let mut rig = Rig::new(vec![take("c", 2, SECOND)], Vec::new());
    rig.planner.observe(&orphaned, |_| false, rig.t0);
    assert!(waits(&rig.fresh(&orphaned, SECOND / 2)));
    assert_eq!(rig.wake(), Some(SECOND));

    // The old holders learn the loss and clean up (their sessions and keys go) before their
    // work has surely stopped: still nobody is admitted.
    let cleaned_up = snapshot(None, &[]);
    assert!(waits(&rig.fresh(&cleaned_up, SECOND * 3 / 4)));
    assert_eq!(rig.wake(), Some(SECOND));

    let lock = planned_write(rig.fresh(&cleaned_up, SECOND)).lock;
    let lock = lock.expect("recreated");
    assert_eq!((lock.cas_index, lock.value.holders), (0, holders(&["c"])));

    // A missing lock key under no other contender (here: only a waiting pooled session) is a
    // new semaphore: admitted at once.
    let pooled = snapshot(None, &["c"]);
    let mut rig = Rig::new(vec![take("c", 2, SECOND)], Vec::new());
    let write = planned_write(rig.fresh(&pooled, Duration::ZERO));
    assert!(write.admits[0].relock, "a pooled session re-locks its key");
    assert!(rig.planner.at_rest());
}

/// A `.lock` we last saw with holders, found deleted after they had already cleaned up (a holder
/// removes its contender key the moment it learns the loss, before its work has surely stopped):
/// the settle still runs. (Seen under load: our own release's write, then the deletion, then the
/// other holders' clean-up, then our read; we admitted 12 ms after the deletion.)
#[test]
fn a_lock_deleted_under_holders_we_saw_settles_after_they_cleaned_up() {
    let held = snapshot(Some((7, 3, &["a", "b"])), &["a", "b"]);
    let mut rig = Rig::new(vec![take("c", 3, SECOND)], Vec::new());
    rig.planner.observe(&held, |_| false, rig.t0);
    let cleaned_up = snapshot(None, &["c"]);
    assert!(waits(&rig.fresh(&cleaned_up, SECOND / 10)));
    assert_eq!(rig.wake(), Some(SECOND + SECOND / 10));
    let lock = planned_write(rig.fresh(&cleaned_up, SECOND + SECOND / 10)).lock;
    assert_eq!(lock.expect("re-created").value.holders, holders(&["c"]));
}

/// `consul lock -n` re-creates a deleted `.lock` at once, with its own holder: our contenders
/// still settle for the full time from the deletion, and are admitted after it if a slot is
/// free.
#[test]
fn a_lock_key_recreated_by_another_writer_does_not_end_the_settle() {
    let orphaned = snapshot(None, &["a", "b"]);
    let mut rig = Rig::new(vec![take("c", 2, SECOND)], Vec::new());
    assert!(waits(&rig.fresh(&orphaned, Duration::ZERO)));
    // Another library's contender `x` re-creates `.lock` with itself as the only holder.
    let recreated = snapshot(Some((9, 2, &["x"])), &["x"]);
    assert!(waits(&rig.fresh(&recreated, SECOND / 10)));
    assert_eq!(rig.wake(), Some(SECOND));
    assert!(!rig.planner.at_rest());
    let lock = planned_write(rig.fresh(&recreated, SECOND)).lock;
    let lock = lock.expect("admitted beside x");
    assert_eq!(
        (lock.cas_index, lock.value.holders),
        (9, holders(&["c", "x"]))
    );
    assert!(rig.planner.at_rest());
}

/// A `.lock` deleted and re-created by `consul lock -n` between two of our reads shows only as a
/// new creation index: our contenders settle all the same, but not after our own re-creation.
#[test]
fn a_lock_key_recreated_between_two_reads_settles_too() {
    let mut rig = Rig::new(vec![take("d", 2, SECOND)], Vec::new());
    let full = snapshot(Some((7, 2, &["a", "b"])), &["a", "b", "d"]);
    assert!(waits(&rig.fresh(&full, Duration::ZERO)));
    // Deleted under a and b, and re-created with x alone before our next read.
    let mut recreated = snapshot(Some((9, 2, &["x"])), &["x", "d"]);
    recreated.lock_created = Some(9);
    assert!(waits(&rig.fresh(&recreated, SECOND / 10)), "settling");
    assert_eq!(rig.wake(), Some(SECOND / 10 + SECOND));
    let write = planned_write(rig.fresh(&recreated, SECOND / 10 + SECOND));
    assert_eq!(admitted(&write), ["d"]);

    // Our own re-creation after a settle is no news.
    let mut rig = Rig::new(vec![take("e", 2, SECOND)], Vec::new());
    let gone = snapshot(None, &["e"]);
    let write = planned_write(rig.fresh(&gone, Duration::ZERO));
    let ours = write.applied_to(&gone, 20, 20, &[1]);
    assert_eq!(ours.lock_created, Some(20));
    rig.queue.push_take(take("f", 2, SECOND), ());
    let write = planned_write(rig.derived(&ours, SECOND / 10));
    assert_eq!(admitted(&write), ["f"], "no settle after our own creation");
}

#[test]
fn a_take_that_must_not_wait_is_refused_only_on_a_fresh_read() {
    let full = snapshot(Some((7, 1, &["a"])), &["a"]);
    let holds_nothing = Give {
        delete_contender: false,
        ..give("z")
    };
    let mut rig = Rig::new(vec![once("b", 1)], vec![holds_nothing]);
    let plan = rig.derived(&full, Duration::ZERO);
    assert!(plan.answered.is_empty() && plan.given.is_empty());
    assert!(matches!(plan.next, Next::Reread));
    assert!(!rig.queue.is_empty(), "everything is planned again");

    let plan = rig.fresh(&full, Duration::ZERO);
    assert!(matches!(answers(&plan)["b"], Ok(Taken::Full)));
    // z held nothing: its give-back needs no write.
    assert_eq!(leaving(&plan.given), ["z"]);
    assert!(matches!(plan.next, Next::Idle));
}

#[test]
fn a_take_already_recorded_is_answered_without_a_write() {
    let mut recorded = snapshot(Some((7, 2, &["a"])), &["a"]);
    recorded.contenders.insert("a".to_owned(), 4);
    let mut rig = Rig::new(vec![take("a", 2, SECOND)], Vec::new());
    let plan = rig.derived(&recorded, Duration::ZERO);
    let answer = answers(&plan)["a"];
    let expected = (4, 100);
    assert!(
        matches!(answer, Ok(Taken::Admitted { lock_index, index }) if (*lock_index, *index) == expected)
    );
    assert!(matches!(plan.next, Next::Idle));

    // Not while a give-back of the same session waits beyond this round's batch.
    let gives = (0..=MAX_GIVES).map(|_| give("a")).collect();
    let mut rig = Rig::new(vec![take("a", 2, SECOND)], gives);
    let plan = rig.derived(&recorded, Duration::ZERO);
    assert!(plan.answered.is_empty());
    assert_eq!(planned_write(plan).gives.len(), MAX_GIVES);
}

#[test]
fn an_unreadable_lock_key_refuses_takes_and_is_never_rewritten() {
    let mut foreign = snapshot(None, &["a"]);
    foreign.lock = Err(Unreadable::Flags(0x2ddc_cbc0_58a5_0c18));
    let mut rig = Rig::new(vec![take("b", 2, SECOND)], vec![give("a")]);
    let plan = rig.fresh(&foreign, Duration::ZERO);
    assert!(matches!(
        answers(&plan)["b"],
        Err(Error::FlagsConflict { key, .. }) if key == "p/.lock"
    ));
    let write = planned_write(plan);
    assert_eq!(leaving(&write.gives), ["a"]);
    assert_eq!(write.lock, None);
}

#[test]
fn a_round_admits_at_most_a_transaction_s_worth() {
    let empty = snapshot(Some((7, 100, &[])), &[]);
    let takes = (0..30).map(|i| take(&format!("s{i:02}"), 100, SECOND));
    let mut rig = Rig::new(takes.collect(), Vec::new());
    let write = planned_write(rig.fresh(&empty, Duration::ZERO));
    assert_eq!(write.admits.len(), MAX_TAKES);
    assert_eq!(admitted(&write)[0], "s00", "in arrival order");
    let after = write.applied_to(&empty, 101, 101, &[1; MAX_TAKES]);
    let write = planned_write(rig.derived(&after, Duration::ZERO));
    assert_eq!(write.admits.len(), 30 - MAX_TAKES);
    assert_eq!(write.lock.expect("admitted").value.holders.len(), 30);
}

/// A second deletion restarts the settle, however long ago the first one's ran out: the
/// planner observes only on its rounds, so the first settle may still be on record, expired, when
/// the second deletion is seen.
#[test]
fn a_second_deletion_settles_in_full_after_an_expired_first() {
    let mut rig = Rig::new(vec![take("d", 2, SECOND)], Vec::new());
    let full = snapshot(Some((7, 2, &["a", "b"])), &["a", "b", "d"]);
    assert!(waits(&rig.fresh(&full, Duration::ZERO)));
    // Deleted under a and b, re-created by x: the first settle starts.
    let mut first = snapshot(Some((9, 2, &["x"])), &["x", "d"]);
    first.lock_created = Some(9);
    assert!(waits(&rig.fresh(&first, SECOND / 10)));
    // Deleted again long after that settle ran out, with no round in between, and re-created by y.
    let mut second = snapshot(Some((12, 2, &["y"])), &["y", "d"]);
    second.lock_created = Some(12);
    let at = 5 * SECOND;
    assert!(waits(&rig.fresh(&second, at)), "settling again");
    assert_eq!(rig.wake(), Some(at + SECOND));

    // The same for a deletion seen as a missing `.lock`.
    let mut rig = Rig::new(vec![take("d", 2, SECOND)], Vec::new());
    let gone = snapshot(None, &["a", "d"]);
    assert!(waits(&rig.fresh(&full, Duration::ZERO)));
    assert!(waits(&rig.fresh(&gone, SECOND / 10)));
    let mut recreated = snapshot(Some((9, 2, &["x"])), &["a", "x", "d"]);
    recreated.lock_created = Some(9);
    assert!(waits(&rig.fresh(&recreated, SECOND / 2)));
    assert!(waits(&rig.fresh(&gone, at)), "gone again: settling again");
    assert_eq!(rig.wake(), Some(at + SECOND));
}
