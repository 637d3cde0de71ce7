use std::time::Duration;

use super::*;

fn entry(key: &str, modify_index: u64) -> KvEntry {
    KvEntry {
        key: key.into(),
        flags: 0,
        value: None,
        session: None,
        lock_index: 0,
        modify_index,
        create_index: modify_index,
    }
}

#[test]
fn only_changed_keys_are_reported() {
    let old = [entry("a", 1), entry("b", 2), entry("c", 3)];
    let new = [entry("a", 1), entry("b", 5), entry("d", 6)];
    assert_eq!(changed_keys(&old, &new), ["b", "c", "d"]);
    assert!(changed_keys(&new, &new).is_empty());
}

#[test]
fn a_prefix_is_found_among_sorted_changed_keys() {
    let changed = ["d/a", "d/b/1", "d/c", "e"];
    assert!(any_under(&changed, "d/b/"));
    assert!(any_under(&changed, "d/"));
    assert!(any_under(&changed, ""));
    assert!(!any_under(&changed, "d/ba"));
    assert!(!any_under(&changed, "c"));
    assert!(!any_under(&changed, "f"));
    assert!(!any_under(&[], "d/"));
}

/// Registers a watcher of `interest` and returns what it is sent.
fn watcher(watchers: &mut Watchers, interest: Interest, id: u64) -> watch::Receiver<View> {
    watcher_wanting(watchers, interest, id, Arc::default())
}

fn watcher_wanting(
    watchers: &mut Watchers,
    interest: Interest,
    id: u64,
    wants: Arc<AtomicU64>,
) -> watch::Receiver<View> {
    let (sender, view) = watch::channel(View::Pending);
    let troubles = false;
    watchers.insert(
        interest,
        Watcher {
            id,
            troubles,
            sender,
            wants,
            fence: None,
        },
    );
    view
}

/// A key created and deleted between two listings looks unchanged; a holder that acquired it
/// at index 5 and waits for a listing of index 5 or later is woken by the first such listing
/// all the same (it used to wait for the next change of its key, possibly forever).
#[test]
fn the_first_listing_past_the_wanted_index_wakes_the_watcher_even_if_its_key_did_not_change() {
    let mut watchers = Watchers::default();
    let key = Interest::Key("k".into());
    let wants = Arc::new(AtomicU64::new(0));
    let mut holder = watcher_wanting(&mut watchers, key.clone(), 0, Arc::clone(&wants));
    let mut bystander = watcher(&mut watchers, key, 1);
    watchers.publish(Listing::new(vec![entry("other", 1)], 3));
    holder.mark_unchanged();
    bystander.mark_unchanged();
    wants.store(5, Ordering::Release);
    // Below the wanted index, and `k` unchanged (absent): nobody is woken.
    watchers.publish(Listing::new(vec![entry("other", 4)], 4));
    assert!(!holder.has_changed().unwrap() && !bystander.has_changed().unwrap());
    // `k` was created at 5 and deleted at 6: absent in both listings, but 6 >= 5.
    watchers.publish(Listing::new(vec![entry("other", 4)], 6));
    assert!(
        holder.has_changed().unwrap(),
        "the holder waiting for index 5 was not woken"
    );
    assert!(!bystander.has_changed().unwrap());
    holder.mark_unchanged();
    // Once past it, only changes wake it again.
    watchers.publish(Listing::new(vec![entry("other", 4)], 7));
    assert!(!holder.has_changed().unwrap());
}

#[test]
fn a_listing_wakes_only_the_watchers_of_changed_keys_and_prefixes() {
    let mut watchers = Watchers::default();
    let key = |k: &str| Interest::Key(k.into());
    let prefix = |p: &str| Interest::Prefix(p.into());
    let mut a = watcher(&mut watchers, key("d/a"), 0);
    let mut b = watcher(&mut watchers, key("d/b"), 1);
    let mut sem = watcher(&mut watchers, prefix("d/s/"), 2);
    let mut sem_too = watcher(&mut watchers, prefix("d/s/"), 3);
    let mut other = watcher(&mut watchers, prefix("d/t/"), 4);
    let listing = |entries| Listing::new(entries, 1);
    watchers.publish(listing(vec![entry("d/a", 1), entry("d/s/x", 1)]));
    for view in [&mut a, &mut b, &mut sem, &mut sem_too, &mut other] {
        assert!(view.has_changed().unwrap(), "the first listing goes to all");
        view.mark_unchanged();
    }
    watchers.publish(listing(vec![entry("d/a", 1), entry("d/s/x", 2)]));
    let woken = |views: [&mut watch::Receiver<View>; 5]| {
        views.map(|v| {
            // A removed watcher's sender is gone: it is never woken again.
            let woken = v.has_changed().unwrap_or(false);
            v.mark_unchanged();
            woken
        })
    };
    assert_eq!(
        woken([&mut a, &mut b, &mut sem, &mut sem_too, &mut other]),
        [false, false, true, true, false]
    );
    // A new key wakes its watcher, a deleted one its prefix's.
    watchers.publish(listing(vec![entry("d/a", 1), entry("d/b", 3)]));
    assert_eq!(
        woken([&mut a, &mut b, &mut sem, &mut sem_too, &mut other]),
        [false, true, true, true, false]
    );
    // A removed watcher is not woken; the others of its prefix still are.
    watchers.remove(&prefix("d/s/"), 2);
    assert!(sem.has_changed().is_err(), "a removed watcher is dropped");
    watchers.publish(listing(vec![entry("d/b", 3), entry("d/s/y", 4)]));
    assert_eq!(
        woken([&mut a, &mut b, &mut sem, &mut sem_too, &mut other]),
        [true, false, false, true, false]
    );
    watchers.remove(&prefix("d/s/"), 3);
    assert!(
        !watchers.prefixes.contains_key("d/s/"),
        "emptied prefixes go"
    );
    assert_eq!(watchers.drain().count(), 3);
    assert!(watchers.is_empty());
}

/// While nothing reads a group, the fences of its leases are suspended from when that began
/// (a lease that joins meanwhile from when it joined); a listing lifts it, and a lease that
/// leaves takes its fence along unsuspended.
#[tokio::test(start_paused = true)]
async fn fences_are_suspended_while_their_group_is_unread() {
    let mut watchers = Watchers {
        unread_since: Some(Instant::now()),
        ..Watchers::default()
    };
    let fence = || Fence::new(Duration::from_secs(10), Instant::now());
    let (a, b) = (fence(), fence());
    let started = Instant::now();
    let with_fence = |id, fence: &Fence| {
        let (sender, _) = watch::channel(View::Pending);
        Watcher {
            id,
            troubles: false,
            sender,
            wants: Arc::default(),
            fence: Some(fence.clone()),
        }
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    watchers.insert(Interest::Key("a".into()), with_fence(0, &a));
    assert_eq!(a.suspended_since(), Some(started + Duration::from_secs(1)));
    watchers.publish(Listing::new(vec![entry("a", 1)], 1));
    watchers.read();
    assert_eq!(a.suspended_since(), None);

    // A read failed: it covered the group until `failed`.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let failed = Instant::now();
    watchers.insert(Interest::Key("b".into()), with_fence(1, &b));
    assert_eq!(b.suspended_since(), None, "a read covers the group");
    tokio::time::sleep(Duration::from_secs(1)).await;
    watchers.unread(failed);
    watchers.unread(Instant::now());
    assert_eq!(a.suspended_since(), Some(failed));
    assert_eq!(b.suspended_since(), Some(failed));
    // Renewals no longer move the deadline: the lease self-fences 10 s after the failure.
    a.confirm(Instant::now());
    assert_eq!(a.deadline(), Some(failed + Duration::from_secs(10)));

    watchers.remove(&Interest::Key("b".into()), 1);
    assert_eq!(b.suspended_since(), None, "a lease that left");
    watchers.read();
    assert_eq!(a.suspended_since(), None);
    assert_eq!(a.deadline(), Some(Instant::now() + Duration::from_secs(10)));
}

#[test]
fn listings_find_keys_and_prefixes() {
    let listing = Listing::new(
        vec![
            entry("s/b", 1),
            entry("s/a/x", 1),
            entry("s/a/.lock", 1),
            entry("s/ab", 1),
        ],
        7,
    );
    assert_eq!(listing.get("s/b").map(|e| e.key.as_str()), Some("s/b"));
    assert!(listing.get("s/c").is_none());
    let under: Vec<_> = listing.under("s/a/").iter().map(|e| &e.key).collect();
    assert_eq!(under, ["s/a/.lock", "s/a/x"]);
}
