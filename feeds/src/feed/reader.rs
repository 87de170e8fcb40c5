//! What a feed reads, and how far behind it is: the [`Reader`] each kind of feed implements
//! (in its own file under [`crate::kind`]), and the entries, streams and lags they share.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::stream::BoxStream;
use store::{Capabilities, Capability, Change, Document, Record, ResumeToken, Store, StoreError};

use super::FeedPosition;

/// What a feed reads, and how far behind it is: one implementation per kind of feed, in the
/// kind's own file ([`crate::kind`]).
#[async_trait]
pub trait Reader: Send + Sync + 'static {
    /// The kind's name (the config's `kind`), saved with the checkpoint: a checkpoint saved
    /// by another kind is not resumed.
    fn kind(&self) -> &'static str;

    /// What the store must support for this kind of feed, beyond capped and keyed
    /// collections (checked when the feed starts).
    fn needs(&self) -> Option<Capability> {
        None
    }

    /// What to do instead when the store's server lacks what [`Reader::needs`] (the end of
    /// the startup error), given what the server does support.
    fn instead(&self, caps: &Capabilities) -> &'static str {
        let _ = caps;
        "the tailable kind works on any server"
    }

    /// The capped collection its records come from, for kinds that read one (a change names
    /// its own collection).
    fn collection(&self) -> Option<&str> {
        None
    }

    /// The stream, right after `after` (from the oldest entry when `None`).
    fn open(&self, store: &dyn Store, after: Option<&FeedPosition>) -> Opened;

    /// How far a feed at `at` is behind the newest write.
    async fn lag(&self, store: &dyn Store, at: Option<&FeedPosition>) -> Lag;

    /// The commit time of the oldest retained entry: how far back a stopped feed can resume.
    async fn oldest_entry_us(&self, store: &dyn Store) -> Option<i64>;
}

/// One entry of a feed's stream.
pub enum Item {
    /// A record of a capped collection.
    Record(Record),
    /// A change of a keyed collection.
    Change(Change),
}

impl Item {
    /// Where the feed is once it has processed this entry.
    pub fn position(&self) -> FeedPosition {
        match self {
            Item::Record(r) => FeedPosition::Tail(r.position),
            Item::Change(c) => FeedPosition::Token(c.token.clone()),
        }
    }

    /// When the entry was committed, where the engine says.
    pub fn committed_at_us(&self) -> Option<i64> {
        match self {
            Item::Record(r) => r.committed_at_us,
            Item::Change(c) => Some(c.committed_at_us),
        }
    }

    /// The document the statistics read: the record, or the change's post-image (pre-image
    /// for a delete).
    pub fn doc(&self) -> Option<&Document> {
        match self {
            Item::Record(r) => Some(&r.doc),
            Item::Change(c) => c.after.as_deref().or(c.before.as_deref()),
        }
    }
}

/// An open stream, and (change feeds) how far it has read past entries its filter skipped.
pub struct Opened {
    /// The entries.
    pub stream: BoxStream<'static, Result<Item, StoreError>>,
    /// Change feeds: the stream's resume token, which moves past skipped entries too.
    pub read_up_to: Option<Arc<Mutex<Option<ResumeToken>>>>,
}

/// How far a feed is behind the newest write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lag {
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
    pub fn entries(self) -> Option<u64> {
        match self {
            Lag::Entries(n) => Some(n),
            Lag::Behind | Lag::Unknown => None,
        }
    }
}
