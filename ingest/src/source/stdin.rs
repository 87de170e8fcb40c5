//! The `stdin` source: NDJSON on standard input (`producer | tailrace`). The end of the input
//! ends the source; when it was the last one, the pipeline flushes and stops cleanly.
//!
//! Standard input is read on a thread of its own, not tokio's: tokio reads stdin with a
//! blocking read that cannot be cancelled, which would hold the runtime's shutdown until the
//! producer writes or closes. A plain thread blocked in `read` does not keep the process alive.

use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use tokio::sync::mpsc;
use tokio_util::io::StreamReader;

use serde::{Deserialize, Serialize};

use super::framing;
use super::{BuildContext, Raw, Source, SourceError, SourceSettings};
use crate::config::problems::Problems;
use crate::telemetry as t;

/// Settings of the stdin source (`kind = "stdin"`): none beyond the name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StdinConfig {}

impl SourceSettings for StdinConfig {
    fn validate(&self, _at: &str, _p: &mut Problems) {}

    fn build(&self, name: &str, ctx: &BuildContext) -> Result<Box<dyn Source>, SourceError> {
        Ok(Box::new(StdinSource::new(name, ctx.max_line)))
    }
}

/// Bytes read from stdin at a time.
const CHUNK: usize = 64 * 1024;

/// The stdin source.
pub struct StdinSource {
    name: String,
    max_line: usize,
}

impl StdinSource {
    /// A stdin source with lines of at most `max_line` bytes.
    pub fn new(name: impl Into<String>, max_line: usize) -> Self {
        StdinSource {
            name: name.into(),
            max_line,
        }
    }
}

impl Source for StdinSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &str {
        "stdin"
    }

    fn records(self: Box<Self>) -> BoxStream<'static, Raw> {
        // Two chunks in flight at most: reading waits for the pipeline (backpressure).
        let (tx, rx) = mpsc::channel::<std::io::Result<Bytes>>(2);
        let name = self.name.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("stdin-{name}"))
            .spawn(move || {
                use std::io::Read;
                let mut stdin = std::io::stdin().lock();
                let mut buf = vec![0u8; CHUNK];
                loop {
                    let item = match stdin.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => Ok(Bytes::copy_from_slice(&buf[..n])),
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(e) => Err(e),
                    };
                    let failed = item.is_err();
                    if tx.blocking_send(item).is_err() || failed {
                        break;
                    }
                }
            });
        if let Err(e) = spawned {
            t::SourceProblem {
                source: &name,
                error_type: t::SourceErrorType::Setup,
                detail: format!("cannot start the stdin reader: {e}"),
                ends: true,
            }
            .emit();
            return futures::stream::empty().boxed();
        }
        tracing::info!(source = %name, "reading standard input");
        let chunks =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) });
        let done = name.clone();
        framing::ndjson_records(StreamReader::new(chunks.boxed()), self.max_line, name)
            .chain(
                futures::stream::once(async move {
                    tracing::info!(source = %done, "end of standard input");
                })
                .filter_map(|()| std::future::ready(None)),
            )
            .boxed()
    }
}
