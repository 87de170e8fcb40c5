//! What a feed reads, and how far behind it is: one exhaustive `match` on the kind of stream
//! in each question, so a new kind of feed makes the compiler point at every place to extend.

use std::sync::{Arc, Mutex};

use futures::stream::{BoxStream, StreamExt};
use store::{
    Capped, Change, ChangeFilter, ChangeStart, Document, Record, ResumeToken, Start, Store,
    StoreError,
};

use super::{FeedKind, FeedPosition};

/// What a feed reads.
pub enum FeedSource {
    /// A tailable cursor on a capped collection.
    Tail(Arc<dyn Capped>),
    /// A change stream on changefeed-backed collections, with a filter.
    Changes(ChangeFilter),
    /// The op-log watcher: the same changes, read at the log level.
    Oplog(ChangeFilter),
}

impl FeedSource {
    /// The kind of feed this is (the config's `kind`).
    pub fn kind(&self) -> FeedKind {
        match self {
            FeedSource::Tail(_) => FeedKind::Tailable,
            FeedSource::Changes(_) => FeedKind::Changes,
            FeedSource::Oplog(_) => FeedKind::Oplog,
        }
    }
}

/// One entry of a feed's stream.
pub(super) enum Item {
    Record(Record),
    Change(Change),
}

impl Item {
    pub(super) fn position(&self) -> FeedPosition {
        match self {
            Item::Record(r) => FeedPosition::Tail(r.position),
            Item::Change(c) => FeedPosition::Token(c.token.clone()),
        }
    }

    pub(super) fn committed_at_us(&self) -> Option<i64> {
        match self {
            Item::Record(r) => r.committed_at_us,
            Item::Change(c) => Some(c.committed_at_us),
        }
    }

    /// The document the statistics read: the record, or the change's post-image (pre-image
    /// for a delete).
    pub(super) fn doc(&self) -> Option<&Document> {
        match self {
            Item::Record(r) => Some(&r.doc),
            Item::Change(c) => c.after.as_ref().or(c.before.as_ref()),
        }
    }
}

/// An open stream, and (change feeds) how far it has read past entries its filter skipped.
pub(super) struct Opened {
    pub stream: BoxStream<'static, Result<Item, StoreError>>,
    pub read_up_to: Option<Arc<Mutex<Option<ResumeToken>>>>,
}

/// Opens the stream right after `after` (from the oldest entry when `None`).
pub(super) fn open(source: &FeedSource, store: &dyn Store, after: Option<&FeedPosition>) -> Opened {
    let token = |after: Option<&FeedPosition>| match after {
        Some(FeedPosition::Token(t)) => ChangeStart::After(t.clone()),
        _ => ChangeStart::Oldest,
    };
    let changes = |s: store::ChangeStream| {
        let read_up_to = Some(s.resume_cell());
        Opened {
            stream: s.map(|c| c.map(Item::Change)).boxed(),
            read_up_to,
        }
    };
    match source {
        FeedSource::Tail(capped) => {
            let start = match after {
                Some(FeedPosition::Tail(p)) => Start::After(*p),
                _ => Start::Oldest,
            };
            Opened {
                stream: capped.tail(start).map(|r| r.map(Item::Record)).boxed(),
                read_up_to: None,
            }
        }
        FeedSource::Changes(filter) => changes(store.changes(post_images(filter), token(after))),
        FeedSource::Oplog(filter) => changes(store.oplog(post_images(filter), token(after))),
    }
}

/// `filter` without the pre-images [`Item::doc`] never reads (it takes a change's post-image,
/// a delete's pre-image), so the store neither decodes nor copies them.
fn post_images(filter: &ChangeFilter) -> ChangeFilter {
    ChangeFilter {
        post_images_only: true,
        ..filter.clone()
    }
}

/// How far a feed is behind the newest write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Lag {
    /// Exactly this many entries.
    Entries(u64),
    /// Behind, by an amount the engine cannot tell cheaply (a feed that has not read anything
    /// yet while changes exist).
    Behind,
    /// The engine cannot tell.
    Unknown,
}

impl Lag {
    /// The number of entries, when known.
    pub(super) fn entries(self) -> Option<u64> {
        match self {
            Lag::Entries(n) => Some(n),
            Lag::Behind | Lag::Unknown => None,
        }
    }
}

/// How far a feed at `at` is behind.
pub(super) async fn lag(source: &FeedSource, store: &dyn Store, at: Option<&FeedPosition>) -> Lag {
    match source {
        FeedSource::Tail(capped) => match capped.bounds().await {
            Ok(Some(b)) => {
                let at = match at {
                    Some(FeedPosition::Tail(p)) => p.0,
                    _ => 0,
                };
                Lag::Entries(b.newest.0.saturating_sub(at))
            }
            Ok(None) => Lag::Entries(0),
            Err(_) => Lag::Unknown,
        },
        FeedSource::Changes(_) | FeedSource::Oplog(_) => match at {
            Some(FeedPosition::Token(t)) => match store.changes_after(t).await {
                Ok(Some(n)) => Lag::Entries(n),
                Ok(None) | Err(_) => Lag::Unknown,
            },
            Some(FeedPosition::Tail(_)) => Lag::Unknown,
            None => match store.newest_change().await {
                Ok(Some(_)) => Lag::Behind,
                Ok(None) => Lag::Entries(0),
                Err(_) => Lag::Unknown,
            },
        },
    }
}

/// The commit time of the oldest retained entry: how far back a stopped feed can resume.
pub(super) async fn oldest_entry_us(source: &FeedSource, store: &dyn Store) -> Option<i64> {
    match source {
        FeedSource::Tail(capped) => {
            let oldest = capped.bounds().await.ok()??.oldest;
            capped.get(oldest).await.ok()??.committed_at_us
        }
        FeedSource::Changes(_) | FeedSource::Oplog(_) => store.oldest_change_at().await.ok()?,
    }
}
