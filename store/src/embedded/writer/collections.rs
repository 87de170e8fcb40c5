//! Creating collections, and their validation rules.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use super::core::{WCapped, Writer, lock_err};
use crate::embedded::catalog;
use crate::embedded::state;
use crate::{CappedSpec, Filter, Result, StoreError};

impl Writer {
    pub(crate) fn create_capped(&mut self, name: &str, spec: &CappedSpec) -> Result<()> {
        let mut new_fields = Vec::new();
        {
            let mut catalog = self.catalog.lock().map_err(lock_err)?;
            let entry = catalog
                .collections
                .entry(name.to_owned())
                .or_insert_with(|| catalog::Collection::new(catalog::Kind::Capped));
            if entry.kind != catalog::Kind::Capped {
                return Err(StoreError::Incompatible {
                    collection: name.to_string(),
                    problem: "exists as a keyed collection, not a capped one".into(),
                });
            }
            for field in &spec.indexes {
                crate::names::check_field(field)?;
                if !entry.indexes.contains(field) {
                    entry.indexes.push(field.clone());
                    new_fields.push(field.clone());
                }
            }
            // Limits may change between runs: the new ones apply from the next append.
            entry.max_docs = spec.max_docs;
            entry.max_bytes = spec.max_bytes;
            let indexes = entry.indexes.clone();
            let validator = entry
                .validator
                .as_ref()
                .map(Filter::parse)
                .transpose()
                .map_err(|e| StoreError::Invalid(e.to_string()))?;
            catalog.save(&*self.fs, &self.dir)?;
            let c = self
                .capped
                .entry(name.to_owned())
                .or_insert_with(|| WCapped {
                    max_docs: spec.max_docs,
                    max_bytes: spec.max_bytes,
                    indexes: Vec::new(),
                    validator: None,
                    oldest: 1,
                    next: 1,
                    sizes: VecDeque::new(),
                    count: 0,
                    bytes: 0,
                    newest: Arc::new(AtomicU64::new(0)),
                    last_seek: None,
                });
            c.max_docs = spec.max_docs;
            c.max_bytes = spec.max_bytes;
            c.indexes = indexes;
            c.validator = validator;
        }
        {
            let mut shared = self.shared.write().map_err(lock_err)?;
            shared
                .capped
                .entry(name.to_owned())
                .or_insert_with(|| state::CappedView {
                    oldest: 1,
                    next: 1,
                    journal_from: 1,
                    ..Default::default()
                });
        }
        if !new_fields.is_empty() {
            crate::embedded::recover::backfill_index(
                &*self.fs,
                &self.jdir,
                &self.shared,
                &self.tree,
                name,
                &new_fields,
            )?;
        }
        Ok(())
    }

    pub(crate) fn create_keyed(&mut self, name: &str) -> Result<()> {
        let mut catalog = self.catalog.lock().map_err(lock_err)?;
        match catalog.collections.get(name) {
            Some(c) if c.kind == catalog::Kind::Keyed => Ok(()),
            Some(_) => Err(StoreError::Incompatible {
                collection: name.to_string(),
                problem: "exists as a capped collection, not a keyed one".into(),
            }),
            None => {
                catalog.collections.insert(
                    name.to_owned(),
                    catalog::Collection::new(catalog::Kind::Keyed),
                );
                catalog.save(&*self.fs, &self.dir)
            }
        }
    }

    pub(super) fn set_validator(&mut self, coll: &str, rule: Option<Filter>) -> Result<()> {
        let mut catalog = self.catalog.lock().map_err(lock_err)?;
        let entry = catalog
            .collections
            .get_mut(coll)
            .ok_or_else(|| StoreError::Invalid(format!("collection {coll} does not exist")))?;
        entry.validator = rule.as_ref().map(|r| r.as_json().clone());
        let kind = entry.kind;
        catalog.save(&*self.fs, &self.dir)?;
        match kind {
            catalog::Kind::Capped => {
                if let Some(c) = self.capped.get_mut(coll) {
                    c.validator = rule;
                }
            }
            catalog::Kind::Keyed => match rule {
                Some(r) => {
                    self.keyed_validators.insert(coll.to_owned(), r);
                }
                None => {
                    self.keyed_validators.remove(coll);
                }
            },
        }
        Ok(())
    }
}
