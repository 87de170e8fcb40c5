//! Unit tests of `mod.rs`.

use super::*;

/// Earlier stages skip the sync the last stage makes for them, except under `majority`,
/// where a failover between stages would lose them.
#[test]
fn earlier_stages_skip_the_sync_except_under_majority() {
    for (d, interim) in [
        (Durability::Unacknowledged, Durability::Unacknowledged),
        (Durability::Acknowledged, Durability::Acknowledged),
        (Durability::Journaled, Durability::Acknowledged),
        (Durability::Majority, Durability::Majority),
    ] {
        assert_eq!(interim_durability(d), interim, "{d:?}");
    }
}

/// Rollups skip the sync where the next events commit makes them durable (the embedded
/// engine; a crash's loss is rebuilt at startup); a server's keep the durability asked.
#[test]
fn rollups_skip_the_sync_only_where_later_events_sync_them() {
    for (d, embedded) in [
        (Durability::Unacknowledged, Durability::Unacknowledged),
        (Durability::Acknowledged, Durability::Acknowledged),
        (Durability::Journaled, Durability::Acknowledged),
        (Durability::Majority, Durability::Acknowledged),
    ] {
        assert_eq!(rollups_durability(d, true), embedded, "{d:?}");
        assert_eq!(rollups_durability(d, false), d, "{d:?}");
    }
}

/// A lone record goes at once when no wait is asked (a timer of "now" would hold it until
/// the timers' next millisecond tick), and after the whole `max_wait` otherwise;
/// what is queued is taken without waiting, up to `max`.
#[tokio::test(start_paused = true)]
async fn a_batch_waits_for_company_only_as_long_as_asked() {
    let (tx, mut rx) = mpsc::channel::<u32>(16);
    let mut batch = Vec::new();
    // Between two of the timers' ticks, as a real clock nearly always is.
    tokio::time::advance(Duration::from_micros(300)).await;
    tx.send(1).await.unwrap();
    let start = tokio::time::Instant::now();
    assert!(gather(&mut rx, &mut batch, 8, Duration::ZERO).await);
    assert_eq!(batch, [1]);
    assert_eq!(start.elapsed(), Duration::ZERO, "no wait asked");

    batch.clear();
    tx.send(2).await.unwrap();
    let start = tokio::time::Instant::now();
    assert!(gather(&mut rx, &mut batch, 8, Duration::from_millis(5)).await);
    assert_eq!(batch, [2]);
    assert!(
        start.elapsed() >= Duration::from_millis(5),
        "{:?}",
        start.elapsed()
    );

    // Queued records join the first without a wait, up to `max`.
    for n in 1..=5 {
        tx.send(n).await.unwrap();
    }
    for (wait, expected) in [
        (Duration::from_millis(5), vec![1, 2, 3]),
        (Duration::ZERO, vec![4, 5]),
    ] {
        batch.clear();
        let start = tokio::time::Instant::now();
        assert!(gather(&mut rx, &mut batch, 3, wait).await);
        assert_eq!(batch, expected);
        // Full, or nothing more to wait for.
        assert_eq!(start.elapsed(), Duration::ZERO, "max_wait {wait:?}");
    }
    drop(tx);
    batch.clear();
    assert!(!gather(&mut rx, &mut batch, 3, Duration::ZERO).await);
    assert!(batch.is_empty());
}
