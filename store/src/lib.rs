//! # store — where tailrace keeps events
//!
//! Documents, positions, durability, the store contract and its engines. It knows nothing of
//! sources or feeds.
//!
//! Two kinds of collection, one contract each ([`Capped`], [`Keyed`]), created by a [`Store`]:
//! - a **capped collection** is bounded by count and bytes, insertion-ordered, oldest evicted
//!   first, and can be tailed ([`Capped::tail`]) like MongoDB's tailable cursors;
//! - a **changefeed-backed collection** publishes every insert, update, replace and delete
//!   ([`Keyed::changes`], [`Store::changes`] for the op log across collections), resumable from
//!   a [`ResumeToken`].
//!
//! Engines: [`embedded::EmbeddedStore`] (a segmented journal, with an LSM tree for keyed
//! state; the default, no server), and
//! `mongo::MongoStore` (MongoDB through the official driver; cargo feature `mongodb`), each
//! registered in [`Engine`] with its `[store]` settings ([`EngineSettings`]: keys, rules,
//! open, data location). The contract test suite in `tests/contract/` runs against every
//! engine.
//!
//! Reading for clients ([`Capped::tail_matching`], [`Capped::newest_matching`],
//! [`Keyed::snapshot`], change streams with a [`ChangeFilter::filter`]) takes a document
//! [`Filter`] in MongoDB query syntax, evaluated on the MongoDB server or in-process by the
//! embedded engine with the same meaning.
//!
//! What it is not: a general database. There are no ad-hoc queries beyond `latest` on an
//! indexed field and the document filters above (no sorts, projections or aggregations), no
//! multi-document transactions in the contract, no deletes in capped collections (eviction
//! only).
//!
//! ```no_run
//! # async fn demo() -> store::Result<()> {
//! use store::{embedded::{EmbeddedOptions, EmbeddedStore}, CappedSpec, Durability, Start, Store};
//! use futures::StreamExt;
//! let store = EmbeddedStore::open("data", EmbeddedOptions::default())?;
//! let spec = CappedSpec { max_docs: 1000, max_bytes: 1 << 20, indexes: vec![] };
//! let events = store.capped("events", &spec).await?;
//! let mut tail = events.tail(Start::Oldest);
//! let doc = serde_json::json!({"text": "hello"}).as_object().cloned().unwrap_or_default();
//! events.append(vec![doc], Durability::Journaled).await?;
//! let first = tail.next().await;
//! # Ok(()) }
//! ```

pub mod backoff;
mod capabilities;
pub mod clock;
mod contract;
pub mod date;
pub mod embedded;
mod engine;
mod error;
pub mod filter;
#[cfg(feature = "mongodb")]
pub mod mongo;
/// Without the `mongodb` feature, only the engine's settings: `engine = "mongodb"` is still
/// read, and opening it says how to get a build that has it.
#[cfg(not(feature = "mongodb"))]
pub mod mongo {
    mod settings;
    pub use settings::MongoSettings;
}
pub mod names;
pub mod query;
pub mod redact;
mod stamp;
mod telemetry;
mod types;
pub mod update;
mod wire;

pub use capabilities::{Capabilities, Capability, Support};
pub use contract::{Capped, ChangeStream, Keyed, RecordStream, Store};
pub use engine::{Engine, EngineSettings, OpenWith};
pub use error::{Result, StoreError};
pub use filter::Filter;
pub use names::MAX_KEY_BYTES;
pub use stamp::{GEO_FIELD, GEO_PATH, RECEIVED_PATH, STAMP_FIELD, STAMP_SOURCE_PATH, Stamp};
pub use types::{
    Bounds, CappedSpec, Change, ChangeFilter, ChangeOp, ChangeStart, Document, Durability,
    KeyUpdate, KeyedDoc, KeyedSnapshot, NewestMatching, Position, ReceivedRun, Record, ResumeToken,
    Start, TimeSpan, Update, Usage, ValueGroup, WriteId,
};
