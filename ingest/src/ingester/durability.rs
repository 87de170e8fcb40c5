//! The durability of each write a batch makes: its stages before the last, and its rollups.

use store::Durability;

/// The durability of a batch's stages before its last (see `write_events`): one log
/// flushed in order makes them durable with the last stage, except across a failover, which
/// only `majority` survives.
pub(super) fn interim_durability(d: Durability) -> Durability {
    match d {
        Durability::Majority => Durability::Majority,
        d => d.min(Durability::Acknowledged),
    }
}

/// The durability of a batch's rollups, written after its events. Rollups that fell behind
/// the events are rebuilt from the stored events when tailrace starts (`recover_source`).
/// Where a later synced events commit makes the rollups before it durable too
/// ([`store::Capped::syncs_earlier_commits_of`]: the embedded engine, one journal synced in
/// order), an unsynced rollups commit is lost only with the process (a power cut, an OS
/// crash: tailrace restarts and rebuilds), so the rollups need no sync of their own, and a
/// crash leaves at most the last three batches' to rebuild (the rollups stage runs up to two
/// batches behind the events stage). That halves the syncs of a slow stream (one per event
/// instead of two). A server (MongoDB) can lose writes it did not journal and restart while
/// tailrace runs on, with nothing to rebuild them: there the rollups keep the configured
/// durability.
pub(super) fn rollups_durability(d: Durability, synced_by_later_events: bool) -> Durability {
    match (synced_by_later_events, d) {
        (true, Durability::Journaled | Durability::Majority) => Durability::Acknowledged,
        (_, d) => d,
    }
}
