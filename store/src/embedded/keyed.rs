//! A changefeed-backed (keyed) collection's handle on the embedded engine: updates become
//! the writer's jobs, reads go to the LSM tree ([`super::tree`]).

use std::sync::Arc;

use async_trait::async_trait;

use super::writer::{Op, Reply};
use super::{Inner, format, read, tree};
use crate::{
    ChangeFilter, ChangeStart, ChangeStream, Document, Durability, Filter, KeyUpdate, Keyed,
    KeyedDoc, KeyedSnapshot, Result,
};

/// A changefeed-backed collection of the embedded engine.
pub(super) struct EmbeddedKeyed {
    pub(super) name: String,
    pub(super) inner: Arc<Inner>,
}

#[async_trait]
impl Keyed for EmbeddedKeyed {
    fn name(&self) -> &str {
        &self.name
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    async fn update(&self, updates: Vec<KeyUpdate>, durability: Durability) -> Result<()> {
        if updates.is_empty() {
            return Ok(());
        }
        self.inner
            .submit(
                Op::Update {
                    coll: self.name.clone(),
                    updates,
                },
                durability,
            )
            .await?;
        Ok(())
    }

    async fn set(&self, key: &str, doc: Document, durability: Durability) -> Result<()> {
        self.inner
            .submit(
                Op::Set {
                    coll: self.name.clone(),
                    key: key.to_string(),
                    doc,
                },
                durability,
            )
            .await?;
        Ok(())
    }

    async fn delete(&self, key: &str, durability: Durability) -> Result<bool> {
        match self
            .inner
            .submit(
                Op::Delete {
                    coll: self.name.clone(),
                    key: key.to_string(),
                },
                durability,
            )
            .await?
        {
            Reply::Deleted(d) => Ok(d),
            _ => Ok(false),
        }
    }

    async fn expire(
        &self,
        prefix: &str,
        written_before_us: i64,
        limit: usize,
        durability: Durability,
    ) -> Result<u64> {
        crate::names::check_key(&self.name, prefix)?;
        match self
            .inner
            .submit(
                Op::Expire {
                    coll: self.name.clone(),
                    prefix: prefix.to_string(),
                    before: written_before_us,
                    limit,
                },
                durability,
            )
            .await?
        {
            Reply::Expired(n) => Ok(n),
            _ => Ok(0),
        }
    }

    async fn get(&self, key: &str) -> Result<Option<Document>> {
        if key.len() > crate::MAX_KEY_BYTES {
            // No such key is ever stored (and the tree asserts on one past its bound).
            return Ok(None);
        }
        let k = tree::doc_key(&self.name, key);
        self.inner
            .read(move |i| {
                let Some(v) = i.tree.get(&k)? else {
                    return Ok(None);
                };
                let (_, json) = tree::split_value(&v)?;
                Ok(Some(format::parse_doc(json)?))
            })
            .await
    }

    async fn scan(&self, prefix: &str) -> Result<Vec<KeyedDoc>> {
        crate::names::check_key(&self.name, prefix)?;
        let (coll, prefix) = (self.name.clone(), prefix.to_string());
        self.inner
            .read(move |i| read::scan_page(i, &coll, &prefix, None, usize::MAX, i.tree.visible()))
            .await
    }

    async fn scan_page(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<KeyedDoc>> {
        crate::names::check_key(&self.name, prefix)?;
        if let Some(after) = after {
            crate::names::check_key(&self.name, after)?;
        }
        let (coll, prefix, after) = (
            self.name.clone(),
            prefix.to_string(),
            after.map(str::to_string),
        );
        self.inner
            .read(move |i| {
                read::scan_page(i, &coll, &prefix, after.as_deref(), limit, i.tree.visible())
            })
            .await
    }

    async fn snapshot(&self, filter: Option<Filter>) -> Result<KeyedSnapshot> {
        read::snapshot(self.inner.clone(), self.name.clone(), filter).await
    }

    fn changes(&self, mut filter: ChangeFilter, start: ChangeStart) -> ChangeStream {
        filter.collections = vec![self.name.clone()];
        read::change_stream(self.inner.clone(), filter, start)
    }
}
