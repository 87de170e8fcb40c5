//! Running a pipeline over a collection: the documents are read on the caller's runtime and
//! handed, a few at a time, to the evaluation on a blocking thread of its own, so a long
//! query never holds a runtime thread (the feeds' and the ingester's) and a full `$limit`
//! stops the reading.

use std::sync::Arc;

use futures::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;

use super::{Answer, Limits, Pipeline, QueryError};
use crate::{Capped, Document, Keyed, Start, StoreError};

/// Documents in flight between the reading and the evaluation.
const IN_FLIGHT: usize = 256;

/// What a query reads.
#[derive(Clone)]
pub enum Input {
    /// The documents a capped collection retains, oldest first, each with its position as
    /// `_id` (as the MongoDB engine stores it), up to the newest when the query starts.
    Capped(Arc<dyn Capped>),
    /// A keyed collection's documents, by key, as of one moment.
    Keyed(Arc<dyn Keyed>),
}

/// Why a query over a collection failed.
#[derive(Debug, thiserror::Error)]
pub enum AggregateError {
    /// The pipeline was refused or failed on a document (the client's to fix).
    #[error(transparent)]
    Query(#[from] QueryError),
    /// The collection could not be read.
    #[error("reading the collection: {0}")]
    Store(#[from] StoreError),
}

/// Runs `pipeline` over what `input` holds.
pub async fn aggregate(
    input: Input,
    pipeline: Pipeline,
    limits: Limits,
) -> Result<Answer, AggregateError> {
    let (tx, mut rx) = mpsc::channel::<Document>(IN_FLIGHT);
    let eval = tokio::task::spawn_blocking(move || {
        pipeline.run(std::iter::from_fn(move || rx.blocking_recv()), limits)
    });
    let read = read(input, tx).await;
    let answer = eval
        .await
        .map_err(|e| StoreError::Invalid(format!("the query's evaluation stopped: {e}")))?;
    read?;
    Ok(answer?)
}

/// Sends every document of `input` until the evaluation stops taking them.
async fn read(input: Input, tx: mpsc::Sender<Document>) -> Result<(), StoreError> {
    match input {
        Input::Capped(c) => {
            let Some(bounds) = c.bounds().await? else {
                return Ok(());
            };
            let mut tail = c.tail(Start::Oldest);
            while let Some(record) = tail.next().await {
                let record = record?;
                let mut doc = Document::clone(&record.doc);
                doc.insert("_id".to_owned(), Value::from(record.position.0));
                if tx.send(doc).await.is_err() || record.position >= bounds.newest {
                    break;
                }
            }
        }
        Input::Keyed(k) => {
            let mut snapshot = k.snapshot(None).await?;
            while let Some(doc) = snapshot.docs.next().await {
                if tx.send(doc?.doc).await.is_err() {
                    break;
                }
            }
        }
    }
    Ok(())
}
