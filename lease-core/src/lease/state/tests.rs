use super::*;

/// A suspension lowers a deadline the holder task is already sleeping towards: it wakes at
/// the new one, not at the old.
#[tokio::test(start_paused = true)]
async fn a_suspended_fence_expires_one_interval_after_the_suspension() {
    let fence = Fence::new(Duration::from_secs(10), Instant::now());
    let started = Instant::now();
    let expiry = tokio::spawn({
        let fence = fence.clone();
        async move { fence.expiry().await }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    fence.confirm(Instant::now());
    fence.suspend(started + Duration::from_secs(1));
    // Renewals go on; they no longer count.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        fence.confirm(Instant::now());
    }
    let reason = expiry.await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(11));
    assert_eq!(
        reason,
        LostReason::SelfFenced {
            unconfirmed_for: Duration::from_secs(10)
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_resumed_fence_counts_its_confirmations_again() {
    let fence = Fence::new(Duration::from_secs(10), Instant::now());
    fence.suspend(Instant::now());
    fence.suspend(Instant::now() + Duration::from_secs(5));
    assert_eq!(
        fence.suspended_since(),
        Some(Instant::now()),
        "the earlier one stays"
    );
    tokio::time::sleep(Duration::from_secs(8)).await;
    fence.confirm(Instant::now());
    assert_eq!(
        fence.deadline(),
        Some(Instant::now() + Duration::from_secs(2))
    );
    fence.resume();
    assert_eq!(fence.suspended_since(), None);
    assert_eq!(
        fence.deadline(),
        Some(Instant::now() + Duration::from_secs(10))
    );
    let unbounded = Fence::unbounded();
    unbounded.suspend(Instant::now());
    assert_eq!(unbounded.deadline(), None);
    assert!(!unbounded.is_past());
}

/// The clock moved 20 s while nothing ran, as across a SIGSTOP: the fence's timer fires 11 s
/// after its deadline, and the loss names the pause, not the backend.
#[tokio::test(start_paused = true)]
async fn a_deadline_found_passed_long_after_it_fell_due_names_the_pause() {
    let fence = Fence::new(Duration::from_secs(9), Instant::now());
    let expiry = tokio::spawn({
        let fence = fence.clone();
        async move { fence.expiry().await }
    });
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_secs(20)).await;
    let reason = expiry.await.unwrap();
    assert_eq!(
        reason,
        LostReason::ProcessPaused {
            paused_for: Duration::from_secs(11),
            unconfirmed_for: Duration::from_secs(20),
        }
    );
    assert!(reason.is_self_fenced());
    assert_eq!(
        reason.to_string(),
        "this process was paused for at least 11.00 s (its timers ran 11.00 s late), leaving \
         the lease unconfirmed for 20.00 s; self-fenced before the session TTL could expire"
    );
    // A reader that comes first (a guarded work's next poll) says the same.
    let state = LeaseState::new(Fence::new(Duration::from_secs(9), Instant::now()));
    tokio::time::advance(Duration::from_secs(20)).await;
    assert!(!state.is_held());
    assert!(matches!(
        state.lost_reason(),
        Some(LostReason::ProcessPaused { paused_for, .. }) if paused_for == Duration::from_secs(11)
    ));
}

/// Late by up to the tolerance (a second, or a tenth of the fence) is a process that runs:
/// the backend went unconfirmed.
#[tokio::test(start_paused = true)]
async fn a_deadline_found_passed_within_the_tolerance_is_the_backends() {
    let fence = Fence::new(Duration::from_secs(9), Instant::now());
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(
        fence.expired(),
        Some(LostReason::SelfFenced {
            unconfirmed_for: Duration::from_secs(10)
        })
    );
    let long = Fence::new(Duration::from_secs(60), Instant::now());
    tokio::time::advance(Duration::from_secs(65)).await;
    assert!(
        matches!(long.expired(), Some(LostReason::SelfFenced { .. })),
        "5 s late is within a tenth of 60 s"
    );
}

/// A deadline set in the past (a suspension from long ago, a fence created from an old
/// confirmation) falls due when it is set: a timer set then is on time, so the backend is
/// named, not a pause.
#[tokio::test(start_paused = true)]
async fn a_deadline_set_in_the_past_is_due_when_it_is_set() {
    let created = Instant::now();
    tokio::time::advance(Duration::from_secs(30)).await;
    let old = Fence::new(Duration::from_secs(9), created);
    assert_eq!(
        old.expired(),
        Some(LostReason::SelfFenced {
            unconfirmed_for: Duration::from_secs(30)
        })
    );

    let fence = Fence::new(Duration::from_secs(9), Instant::now());
    let watched_until = Instant::now();
    for _ in 0..20 {
        tokio::time::advance(Duration::from_secs(1)).await;
        fence.confirm(Instant::now());
    }
    // The watch is found to have failed 20 s after it last saw the lease.
    fence.suspend(watched_until);
    let expiry = fence.expiry().await;
    assert_eq!(
        expiry,
        LostReason::SelfFenced {
            unconfirmed_for: Duration::from_secs(20)
        }
    );
    // Lateness counts from the suspension: found 20 s after it with nothing declared, the
    // deadline says this process did not run.
    tokio::time::advance(Duration::from_millis(500)).await;
    assert!(matches!(
        fence.expired(),
        Some(LostReason::SelfFenced { .. })
    ));
    tokio::time::advance(Duration::from_secs(20)).await;
    assert!(matches!(
        fence.expired(),
        Some(LostReason::ProcessPaused { .. })
    ));
}

/// A call's error met after a pause explains itself by the pause; one met while the fence holds,
/// or just after it passed on time, stays the call's.
#[tokio::test(start_paused = true)]
async fn an_error_met_after_a_pause_is_explained_by_the_pause() {
    let timed_out = || Error::Unreachable {
        backend: "etcd",
        address: "http://127.0.0.1:2379".into(),
        hint: "etcd or the network is overloaded",
        source: "Timeout expired".into(),
    };
    let denied = || Error::PermissionDenied {
        operation: "read".into(),
        message: "permission denied".into(),
        hint: "check the etcd user's role",
    };
    let fence = Fence::new(Duration::from_secs(9), Instant::now());
    assert!(matches!(
        fence.explain(timed_out()),
        Error::Unreachable { .. }
    ));
    tokio::time::advance(Duration::from_millis(9_500)).await;
    assert!(matches!(
        fence.explain(timed_out()),
        Error::Unreachable { .. }
    ));
    tokio::time::advance(Duration::from_secs(10)).await;
    assert!(matches!(
        fence.explain(timed_out()),
        Error::Lost(LostReason::ProcessPaused { .. })
    ));
    // What a retry cannot cure stays what it is, pause or not.
    assert!(matches!(
        fence.explain(denied()),
        Error::PermissionDenied { .. }
    ));
}
