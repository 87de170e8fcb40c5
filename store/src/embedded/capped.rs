//! A capped collection's handle on the embedded engine: appends become the writer's jobs,
//! reads go to the journal ([`super::read`]) and tails to the hub.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use super::keyed::EmbeddedKeyed;
use super::writer::{self, Op, Reply};
use super::{CappedShared, Inner, format, lock_err, read, timeline, values};
use crate::{
    Bounds, Capped, Document, Durability, Filter, KeyUpdate, Keyed, NewestMatching, Position,
    Record, RecordStream, Result, Start, StoreError, TimeSpan, Usage, ValueGroup,
};

/// A capped collection of the embedded engine.
pub(super) struct EmbeddedCapped {
    pub(super) name: String,
    pub(super) inner: Arc<Inner>,
    pub(super) shared: Arc<CappedShared>,
}

impl EmbeddedCapped {
    /// The append of `docs`, their JSON encoded and their index values hashed here (on the
    /// caller's thread, not the writer's).
    fn append_op(&self, docs: Arc<[Arc<Document>]>) -> Result<Op> {
        // Each body starts with room for the previous one's size and a little more: a batch's
        // documents are mostly alike in size, and a buffer grown by doubling from a guess
        // copies itself two or three times per document.
        let mut room = 128;
        let mut bodies = Vec::with_capacity(docs.len());
        for d in docs.iter() {
            let mut body = Vec::with_capacity(room);
            format::write_doc(d, &mut body)?;
            room = (body.len() + body.len() / 8).max(128);
            bodies.push(body);
        }
        let indexed = self.shared.indexes.clone();
        let hashes = writer::index_hashes(&self.name, &indexed, docs.iter());
        Ok(Op::Append {
            coll: self.name.clone(),
            bodies,
            docs: docs.into(),
            indexed,
            hashes,
        })
    }

    /// Whether `keyed` is a collection of this very store (one writer, one journal).
    fn same_store(&self, keyed: &dyn Keyed) -> bool {
        keyed
            .as_any()
            .downcast_ref::<EmbeddedKeyed>()
            .is_some_and(|k| Arc::ptr_eq(&k.inner, &self.inner))
    }
}

#[async_trait]
impl Capped for EmbeddedCapped {
    fn name(&self) -> &str {
        &self.name
    }

    async fn append(&self, docs: Vec<Document>, durability: Durability) -> Result<Vec<Position>> {
        if docs.is_empty() {
            return Ok(Vec::new());
        }
        self.append_shared(docs.into_iter().map(Arc::new).collect(), durability)
            .await
    }

    async fn append_shared(
        &self,
        docs: Arc<[Arc<Document>]>,
        durability: Durability,
    ) -> Result<Vec<Position>> {
        if docs.is_empty() {
            return Ok(Vec::new());
        }
        match self.inner.submit(self.append_op(docs)?, durability).await? {
            Reply::Positions(p) => Ok(p),
            _ => Ok(Vec::new()),
        }
    }

    fn commits_with(&self, keyed: &dyn Keyed) -> bool {
        self.same_store(keyed)
    }

    fn syncs_earlier_commits_of(&self, keyed: &dyn Keyed) -> bool {
        // One journal, synced in order: a commit is synced with every one before it.
        self.same_store(keyed)
    }

    async fn append_with_updates(
        &self,
        docs: Arc<[Arc<Document>]>,
        keyed: &dyn Keyed,
        updates: Vec<KeyUpdate>,
        durability: Durability,
    ) -> Result<Vec<Position>> {
        if !self.same_store(keyed) {
            return crate::contract::append_then_update(self, docs, keyed, updates, durability)
                .await;
        }
        let mut ops = Vec::with_capacity(2);
        if !docs.is_empty() {
            ops.push(self.append_op(docs)?);
        }
        if !updates.is_empty() {
            ops.push(Op::Update {
                coll: keyed.name().to_owned(),
                updates,
            });
        }
        match self.inner.submit(Op::Together(ops), durability).await? {
            Reply::Positions(p) => Ok(p),
            _ => Ok(Vec::new()),
        }
    }

    fn tail(&self, start: Start) -> RecordStream {
        read::tail_stream(
            self.inner.clone(),
            self.name.clone(),
            self.shared.newest.clone(),
            start,
        )
    }

    async fn newest_matching(&self, filter: &Filter, limit: usize) -> Result<NewestMatching> {
        let (coll, filter) = (self.name.clone(), filter.clone());
        self.inner
            .read(move |i| read::newest_matching(i, &coll, &filter, limit))
            .await
    }

    async fn get(&self, position: Position) -> Result<Option<Record>> {
        let coll = self.name.clone();
        self.inner
            .read(move |i| Ok(read::read_docs(i, &coll, position.0, position.0, 1)?.pop()))
            .await
    }

    async fn latest(&self, field: &str, value: &Value, limit: usize) -> Result<Vec<Record>> {
        if !self.shared.spec.indexes.iter().any(|f| f == field) {
            return Err(StoreError::NotIndexed {
                collection: self.name.clone(),
                field: field.to_string(),
            });
        }
        if !matches!(value, Value::String(_) | Value::Number(_) | Value::Bool(_)) {
            return Err(StoreError::Invalid(format!(
                "latest() compares scalars only, not {value}"
            )));
        }
        let (coll, field, value) = (self.name.clone(), field.to_string(), value.clone());
        self.inner
            .read(move |i| read::latest(i, &coll, &field, &value, limit))
            .await
    }

    async fn bounds(&self) -> Result<Option<Bounds>> {
        self.inner.caught_up().await?;
        let shared = self.inner.shared.read().map_err(lock_err)?;
        Ok(shared.capped.get(&self.name).and_then(|v| {
            (v.next > v.oldest && v.count > 0).then(|| Bounds {
                oldest: Position(v.oldest),
                newest: Position(v.next - 1),
            })
        }))
    }

    fn scan(
        &self,
        from: Position,
        to: Position,
        fields: Option<Arc<[String]>>,
    ) -> Option<futures::stream::BoxStream<'static, Result<Vec<Record>>>> {
        Some(read::scan(
            self.inner.clone(),
            self.name.clone(),
            from.0,
            to.0,
            fields,
        ))
    }

    async fn time_span(&self, from_ms: i64, to_ms: i64) -> Result<Option<TimeSpan>> {
        let coll = self.name.clone();
        self.inner
            .read(move |i| timeline::span(i, &coll, from_ms, to_ms).map(Some))
            .await
    }

    fn value_groups(
        &self,
        field: &str,
        from: Position,
        to: Position,
        each: &mut dyn FnMut(ValueGroup<'_>),
    ) -> Result<Vec<(Position, Position)>> {
        // Finished segments whose positions of this collection lie within the range; the
        // segment being written has no values file.
        let segments: Vec<(values::Tie, u64, u64)> = {
            let shared = self.inner.shared.read().map_err(lock_err)?;
            let newest = shared.segments.keys().next_back().copied();
            shared
                .segments
                .iter()
                .filter(|(seq, _)| Some(**seq) != newest)
                .filter_map(|(seq, info)| {
                    let c = info.colls.get(&self.name)?;
                    let whole = c.end > c.first && c.first >= from.0 && c.end - 1 <= to.0;
                    whole.then_some((
                        values::Tie {
                            seq: *seq,
                            end: info.end,
                            last_lsn: info.last_lsn,
                        },
                        c.first,
                        c.end - 1,
                    ))
                })
                .collect()
        };
        let jdir = self.inner.dir.join(super::journal::DIR);
        let mut covered = Vec::new();
        for (tie, first, last) in segments {
            let mut hand = |g: values::Group<'_>| {
                each(ValueGroup {
                    value: g.value,
                    first: Position(g.first),
                    count: g.count,
                });
            };
            let path = values::path(&jdir, tie.seq);
            if values::read(&*self.inner.fs, &path, tie, &self.name, field, &mut hand) {
                covered.push((Position(first), Position(last)));
            }
        }
        Ok(covered)
    }

    fn received_runs(
        &self,
        from: Position,
        to: Position,
        each: &mut dyn FnMut(crate::ReceivedRun),
    ) -> Result<()> {
        timeline::runs(&self.inner, &self.name, from.0, to.0, each)
    }

    async fn usage(&self) -> Result<Usage> {
        self.inner.caught_up().await?;
        let shared = self.inner.shared.read().map_err(lock_err)?;
        Ok(shared
            .capped
            .get(&self.name)
            .map_or(Usage::default(), |v| Usage {
                docs: v.count,
                bytes: v.bytes,
            }))
    }
}
