//! Which sequence numbers the store refused: asked of the dead letters, so that a feed tells a
//! number the store refused (kept as a dead letter with its number) from one that is lost.
//!
//! The ingester writes the dead letter of a refused event before any later event of the
//! batch (`ingest::ingester`: hand-over order holds for refusals too). So when a feed meets
//! event `n` of a source after a gap `[from, n)`, the letters of the gap's refused numbers
//! are already stored: one bounded question finds them, the newest letters of that source
//! with reason `store_rejected` and a number in the gap, at most as many as the gap holds.
//!
//! A question, not a tail: a tail of the dead letters would wait at their end, and a waiting
//! cursor is what a MongoDB-compatible server without awaiting tails (FerretDB) holds a
//! connection for. Gaps are rare, and a gap wider than [`MAX_GAP`] (a feed overtaken by
//! eviction, which records a gap of its own) is not looked up: it counts as missing.

use std::collections::BTreeSet;

use serde_json::{Value, json};
use store::{Capped, Filter, StoreError};

/// The reason the ingester gives a dead letter of an event the store refused.
pub const STORE_REJECTED: &str = "store_rejected";

/// The widest gap looked up.
pub const MAX_GAP: u64 = 10_000;

/// How many of `source`'s numbers in `[from, to)` the store refused, by the letters in
/// `letters` (the `dead_letters` collection).
pub async fn in_gap(
    letters: &dyn Capped,
    source: &str,
    from: u64,
    to: u64,
) -> Result<u64, StoreError> {
    let wide = to.saturating_sub(from);
    if wide == 0 || wide > MAX_GAP {
        return Ok(0);
    }
    let filter = Filter::parse(&json!({
        "source": source,
        "reason": STORE_REJECTED,
        "seq": {"$gte": from, "$lt": to},
    }))
    .map_err(|e| StoreError::Invalid(format!("the refused numbers' filter: {e}")))?;
    let found = letters
        .newest_matching(&filter, usize::try_from(wide).unwrap_or(usize::MAX))
        .await?;
    // Each number once, should a letter have been written twice (a retried write).
    let numbers: BTreeSet<u64> = found
        .records
        .iter()
        .filter_map(|r| r.doc.get("seq").and_then(Value::as_u64))
        .filter(|n| (from..to).contains(n))
        .collect();
    Ok(numbers.len() as u64)
}
