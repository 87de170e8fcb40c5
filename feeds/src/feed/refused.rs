//! Which sequence numbers the store refused: read from the dead letters, so that a feed tells
//! a number the store refused (kept as a dead letter with its number) from one that is lost.
//!
//! The ingester writes the dead letter of a refused event before any later event of the
//! batch (`ingest::ingester`: hand-over order holds for refusals too). So when a feed meets
//! event `n` of a source after a gap `[from, n)`, the letters of the refused numbers in the
//! gap are already stored, before the letter of any number of that source from `n` on: the
//! reader reads the dead letters forward, from where it stopped, until it has read one of
//! that source at `n` or beyond, or the newest. Each source's letters come in the order of
//! their numbers, so what it holds of a source below `n` after that is all there is.
//!
//! Bounded: numbers behind the feed are dropped as gaps are settled, and at most
//! [`MAX_HELD`] letters are held (the oldest go first; a gap they would have excused counts
//! as missing, the honest side to err on).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::StreamExt;
use serde_json::Value;
use store::{Capped, Position, Start, StoreError};

/// The reason the ingester gives a dead letter of an event the store refused.
pub const STORE_REJECTED: &str = "store_rejected";

/// Letters held at most (numbers of sources not yet settled by a gap).
pub const MAX_HELD: usize = 100_000;

/// Letters read per call of the store.
const READ_AT_ONCE: u64 = 1_024;

/// The refused numbers of the dead letters, read forward.
pub struct Refused {
    letters: Arc<dyn Capped>,
    /// The last letter read.
    after: Option<Position>,
    /// Refused numbers read and not yet settled, by source.
    held: BTreeMap<String, BTreeSet<u64>>,
    count: usize,
}

impl Refused {
    /// Reads the refused numbers of `letters` (the `dead_letters` collection).
    pub fn new(letters: Arc<dyn Capped>) -> Self {
        Refused {
            letters,
            after: None,
            held: BTreeMap::new(),
            count: 0,
        }
    }

    /// How many of `source`'s numbers in `[from, to)` the store refused; settles them (and
    /// every held number of `source` below `to`).
    pub async fn in_gap(&mut self, source: &str, from: u64, to: u64) -> Result<u64, StoreError> {
        while !self.reached(source, to) {
            if !self.read_more().await? {
                break;
            }
        }
        let Some(held) = self.held.get_mut(source) else {
            return Ok(0);
        };
        let refused = held.range(from..to).count();
        let rest = held.split_off(&to);
        self.count -= held.len();
        *held = rest;
        Ok(refused as u64)
    }

    /// Whether a letter of `source` at `to` or beyond has been read.
    fn reached(&self, source: &str, to: u64) -> bool {
        self.held
            .get(source)
            .and_then(|h| h.last())
            .is_some_and(|last| *last >= to)
    }

    /// Reads the next letters; `false` once there are none after the last read.
    async fn read_more(&mut self) -> Result<bool, StoreError> {
        let Some(bounds) = self.letters.bounds().await? else {
            return Ok(false);
        };
        let first = match self.after {
            Some(p) if p >= bounds.newest => return Ok(false),
            Some(p) => Position(p.0 + 1).max(bounds.oldest),
            None => bounds.oldest,
        };
        let last = Position(
            bounds
                .newest
                .0
                .min(first.0.saturating_add(READ_AT_ONCE - 1)),
        );
        let fields: Arc<[String]> = ["source", "reason", "seq"].map(String::from).into();
        if let Some(mut scan) = self.letters.scan(first, last, Some(fields)) {
            while let Some(records) = scan.next().await {
                for r in records? {
                    self.hold(&r.doc);
                }
            }
        } else {
            let start = if first > bounds.oldest {
                Start::After(Position(first.0 - 1))
            } else {
                Start::Oldest
            };
            let mut tail = self.letters.tail(start);
            while let Some(r) = tail.next().await {
                let r = r?;
                if r.position > last {
                    break;
                }
                self.hold(&r.doc);
                if r.position >= last {
                    break;
                }
            }
        }
        self.after = Some(last);
        Ok(true)
    }

    fn hold(&mut self, letter: &store::Document) {
        if letter.get("reason").and_then(Value::as_str) != Some(STORE_REJECTED) {
            return;
        }
        let (Some(source), Some(seq)) = (
            letter.get("source").and_then(Value::as_str),
            letter.get("seq").and_then(Value::as_u64),
        ) else {
            return;
        };
        if self.held.entry(source.to_owned()).or_default().insert(seq) {
            self.count += 1;
        }
        while self.count > MAX_HELD {
            // The source holding the most gives up its lowest number.
            let Some((_, most)) = self.held.iter_mut().max_by_key(|(_, h)| h.len()) else {
                break;
            };
            most.pop_first();
            self.count -= 1;
        }
    }
}
