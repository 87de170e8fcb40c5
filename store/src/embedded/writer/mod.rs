//! The single writer: stages whatever is queued, writes it as one journal record (group
//! commit), syncs it when any write of the group asked for `journaled`, then applies it (the
//! capped collections' positions and indexes, the keyed state in the tree), publishes it to
//! the live readers and answers every caller.
//!
//! Every job is queued, and the writer thread ([`run`]) commits everything queued together,
//! in the order it was queued: the writes, syncs, segment rolls and expiries of a commit never
//! run on a caller's thread (an async runtime's, which must not block). The [`Writer`] sits
//! behind a lock ([`WriterCell`]) that the maintenance thread and setup take too.
//!
//! Each job is staged on its own against what the group staged before it, and joins the group
//! only if it succeeds: one bad job (a refused document, an `$inc` of a string) fails alone. A
//! failed write fails the whole group, and nothing of it is applied.
//!
//! One file per job:
//! - `ops`: what callers ask (operations, answers, the queued job);
//! - `cell`: the writer behind its lock, and the writer thread's loop (grouping, the wait for
//!   flushes, the timer that syncs commits that did not ask for it);
//! - `core`: the writer's state, and its start from what recovery found;
//! - `stage`: staging a job into its group (documents, updates, sets, deletes);
//! - `expire`: the expiry of idle keys;
//! - `collections`: creating collections, validation rules, a new index's backfill;
//! - `commit`: writing the group as one record, syncing it, applying it, showing it to
//!   readers once synced, and stopping after a failed sync;
//! - `meta`: after a write, the segment table, seek points and index entries, and the index
//!   files of finished segments;
//! - `hub`: the live broadcast to tails and change streams, bounded by bytes;
//! - `cache`: keyed documents as last written (hot keys need no read);
//! - `import`: the conversion of an earlier layout.

mod cache;
mod cell;
mod collections;
mod commit;
mod core;
mod expire;
mod hub;
mod import;
mod meta;
mod ops;
mod stage;

pub(crate) use cache::{Kv, KvRef};
pub(crate) use cell::{WriterCell, run};
pub(crate) use core::{Links, Writer, index_hashes};
pub(crate) use hub::{Commit, Hub};
pub(crate) use ops::{Job, Op, Reply};
