//! The MongoDB engine's keys of `[store]` (`engine = "mongodb"`): the connection string.
//! Compiled in every build, so that a build without the engine (cargo feature `mongodb` off)
//! still reads a configuration naming it and says how to get one that has it.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::engine::{EngineSettings, OpenWith};
use crate::redact::redact_url;
use crate::{Result, Store};

/// `[store]` with `engine = "mongodb"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MongoSettings {
    /// Connection string; change streams need a replica set (a single-node one will do).
    pub uri: String,
}

impl Default for MongoSettings {
    fn default() -> Self {
        MongoSettings {
            uri: "mongodb://localhost:27017/?replicaSet=rs0".to_owned(),
        }
    }
}

impl MongoSettings {
    /// The server at `uri`.
    pub fn at(uri: impl Into<String>) -> Self {
        MongoSettings { uri: uri.into() }
    }
}

impl EngineSettings for MongoSettings {
    fn problems(&self) -> Vec<(&'static str, String)> {
        let uri = self.uri.trim();
        if uri.is_empty() {
            return vec![(
                "uri",
                "required for engine = \"mongodb\" (e.g. \"mongodb://localhost:27017/?replicaSet=rs0\")"
                    .to_owned(),
            )];
        }
        if !(uri.starts_with("mongodb://") || uri.starts_with("mongodb+srv://")) {
            let scheme = match uri.split_once("://") {
                Some((scheme, _)) => format!("scheme {scheme:?}"),
                None => "no scheme".to_owned(),
            };
            return vec![(
                "uri",
                format!("must start with mongodb:// or mongodb+srv:// (got {scheme})"),
            )];
        }
        Vec::new()
    }

    #[cfg(feature = "mongodb")]
    fn open<'a>(&'a self, with: &'a OpenWith) -> BoxFuture<'a, Result<Arc<dyn Store>>> {
        Box::pin(async move {
            let options = super::MongoOptions {
                queue_capacity: with.queue_capacity,
                ..super::MongoOptions::default()
            };
            let store: Arc<dyn Store> =
                Arc::new(super::MongoStore::connect(&self.uri, &with.database, options).await?);
            Ok(store)
        })
    }

    #[cfg(not(feature = "mongodb"))]
    fn open<'a>(&'a self, _with: &'a OpenWith) -> BoxFuture<'a, Result<Arc<dyn Store>>> {
        Box::pin(async move {
            Err(crate::StoreError::Engine {
                engine: "mongodb",
                message: "this build has no MongoDB engine; rebuild with \
                          `cargo build --release --features mongodb`"
                    .to_owned(),
            })
        })
    }

    fn location(&self, database: &str) -> String {
        format!("{} (database {database})", redact_url(&self.uri))
    }

    fn redact(&mut self) {
        self.uri = redact_url(&self.uri);
    }
}
