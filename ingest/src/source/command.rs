//! The `command` source: runs a program and reads NDJSON from its standard output, so a source
//! can be written in any language. Its standard error goes to the log, one line per line
//! (prefixed with the source's name). When the program exits it is started again after a
//! backoff (100 ms doubling up to `reconnect_max_ms`, reset once it produced a record), unless
//! `restart = false`: then the source ends with it.
//!
//! The child is killed when the source is dropped (shutdown), and gets no standard input.

use std::process::Stdio;
use std::time::Duration;

use futures::stream::{BoxStream, Stream, StreamExt};
use metrics::{counter, gauge};
use tokio::process::Command;
use tokio_util::codec::FramedRead;

use super::framing::{self, Frame, LineFramer};
use super::{Backoff, Raw, Source};
use crate::telemetry as t;

/// Longest stderr line logged (the rest of it is dropped).
const STDERR_LINE: usize = 2048;

/// Settings of a command source.
#[derive(Clone, Debug)]
pub struct CommandOptions {
    /// The program (looked up in PATH).
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Start it again when it exits.
    pub restart: bool,
    /// First wait before a restart.
    pub reconnect_min: Duration,
    /// Longest wait before a restart.
    pub reconnect_max: Duration,
    /// Longest line in bytes.
    pub max_line: usize,
}

/// The command source.
pub struct CommandSource {
    name: String,
    options: CommandOptions,
}

impl CommandSource {
    /// A command source.
    pub fn new(name: impl Into<String>, options: CommandOptions) -> Self {
        CommandSource {
            name: name.into(),
            options,
        }
    }
}

impl Source for CommandSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &str {
        "command"
    }

    fn records(self: Box<Self>) -> BoxStream<'static, Raw> {
        run(self.name, self.options).boxed()
    }
}

fn run(name: String, o: CommandOptions) -> impl Stream<Item = Raw> + Send + 'static {
    async_stream::stream! {
        let mut backoff = Backoff::new(o.reconnect_min, o.reconnect_max);
        let running = gauge!(t::SOURCE_CONNECTED, "source" => name.clone());
        loop {
            let spawned = Command::new(&o.program)
                .args(&o.args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn();
            let mut child = match spawned {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(source = %name, program = %o.program, error = %e, "cannot start the program");
                    if !o.restart {
                        return;
                    }
                    counter!(t::SOURCE_RECONNECTS, "source" => name.clone(), "reason" => "exited").increment(1);
                    let delay = backoff.next_wait();
                    tracing::info!(source = %name, "starting it again in {:.1} s", delay.as_secs_f64());
                    tokio::time::sleep(delay).await;
                    continue;
                }
            };
            running.set(1.0);
            tracing::info!(source = %name, program = %o.program, pid = child.id().unwrap_or(0), "program started");
            if let Some(stderr) = child.stderr.take() {
                let name = name.clone();
                tokio::spawn(async move {
                    let mut lines = FramedRead::new(stderr, LineFramer::new(STDERR_LINE));
                    while let Some(Ok(frame)) = lines.next().await {
                        let line = match frame {
                            Frame::Line(l) | Frame::Partial(l) => l,
                            Frame::TooLong(mut l) => {
                                l.extend_from_slice("…".as_bytes());
                                l
                            }
                        };
                        if !line.is_empty() {
                            tracing::info!(source = %name, "stderr: {}", String::from_utf8_lossy(&line));
                        }
                    }
                });
            }
            if let Some(stdout) = child.stdout.take() {
                let mut records = std::pin::pin!(framing::ndjson_records(stdout, o.max_line, name.clone()));
                let mut any = false;
                while let Some(raw) = records.next().await {
                    if !any {
                        any = true;
                        backoff.reset();
                    }
                    yield raw;
                }
            }
            // Standard output closed: the program exited or is about to.
            let status = child.wait().await;
            running.set(0.0);
            match &status {
                Ok(s) if s.success() => tracing::info!(source = %name, program = %o.program, "program exited"),
                Ok(s) => tracing::warn!(source = %name, program = %o.program, status = %s, "program failed"),
                Err(e) => tracing::warn!(source = %name, program = %o.program, error = %e, "cannot wait for the program"),
            }
            if !o.restart {
                return;
            }
            counter!(t::SOURCE_RECONNECTS, "source" => name.clone(), "reason" => "exited").increment(1);
            let delay = backoff.next_wait();
            tracing::info!(source = %name, "starting it again in {:.1} s", delay.as_secs_f64());
            tokio::time::sleep(delay).await;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(20);

    fn sh(script: &str, restart: bool) -> BoxStream<'static, Raw> {
        Box::new(CommandSource::new(
            "c",
            CommandOptions {
                program: "sh".into(),
                args: vec!["-c".into(), script.into()],
                restart,
                reconnect_min: Duration::from_millis(10),
                reconnect_max: Duration::from_millis(50),
                max_line: 100,
            },
        ))
        .records()
    }

    #[tokio::test]
    async fn reads_stdout_until_the_program_exits() {
        let got: Vec<Raw> = tokio::time::timeout(
            T,
            sh("echo '{\"a\":1}'; echo oops >&2; printf '{\"a\":'", false).collect(),
        )
        .await
        .unwrap();
        assert_eq!(
            got,
            vec![
                Raw::Bytes(b"{\"a\":1}".to_vec()),
                Raw::Invalid {
                    bytes: b"{\"a\":".to_vec(),
                    reason: "truncated"
                }
            ]
        );
    }

    #[tokio::test]
    async fn restarts_the_program_when_it_exits() {
        let s = sh("echo '{\"run\":1}'; exit 3", true);
        let got: Vec<Raw> = tokio::time::timeout(T, s.take(3).collect()).await.unwrap();
        assert_eq!(got, vec![Raw::Bytes(b"{\"run\":1}".to_vec()); 3]);
    }

    #[tokio::test]
    async fn a_missing_program_ends_a_non_restarting_source() {
        let s = Box::new(CommandSource::new(
            "c",
            CommandOptions {
                program: "/nonexistent/program".into(),
                args: vec![],
                restart: false,
                reconnect_min: Duration::from_millis(10),
                reconnect_max: Duration::from_millis(50),
                max_line: 100,
            },
        ))
        .records();
        let got: Vec<Raw> = tokio::time::timeout(T, s.collect()).await.unwrap();
        assert!(got.is_empty());
    }
}
