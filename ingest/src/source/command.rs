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
use serde::{Deserialize, Serialize};
use store::backoff::Backoff;
use tokio::process::Command;
use tokio_util::codec::FramedRead;

use super::framing::{self, Frame, LineFramer};
use super::http::default_reconnect_max_ms;
use super::{BuildContext, Raw, Source, SourceError, SourceSettings};
use crate::config::problems::Problems;
use crate::telemetry::{self as t, ReconnectReason};

/// Longest stderr line logged (the rest of it is dropped).
const STDERR_LINE: usize = 2048;

fn default_restart() -> bool {
    true
}

/// Settings of a command source (`kind = "command"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandConfig {
    /// The program to run, looked up in PATH (required).
    pub program: String,
    /// Its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Start the program again (with backoff) when it exits; with false, the source ends
    /// when the program exits.
    #[serde(default = "default_restart")]
    pub restart: bool,
    /// The longest wait between restarts (ms); waits double from 100 ms up to this.
    #[serde(default = "default_reconnect_max_ms")]
    pub reconnect_max_ms: u64,
}

impl SourceSettings for CommandConfig {
    fn validate(&self, at: &str, p: &mut Problems) {
        if self.program.trim().is_empty() {
            p.push(format!("{at}.program"), "must not be empty");
        }
        p.at_least(
            &format!("{at}.reconnect_max_ms"),
            self.reconnect_max_ms,
            100,
        );
    }

    fn build(&self, name: &str, ctx: &BuildContext) -> Result<Box<dyn Source>, SourceError> {
        let o = CommandOptions {
            program: self.program.clone(),
            args: self.args.clone(),
            restart: self.restart,
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_millis(self.reconnect_max_ms),
            max_line: ctx.max_line,
        };
        Ok(Box::new(CommandSource::new(name, o)))
    }

    fn describe(&self) -> String {
        self.program.clone()
    }
}

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
        let running = t::SourceLink::new(&name);
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
                    let detail = format!("cannot start the program: {e}");
                    if !o.restart {
                        t::SourceProblem { source: &name, error_type: t::SourceErrorType::Setup, detail, ends: true }.emit();
                        return;
                    }
                    let delay = backoff.next_wait();
                    t::SourceReconnecting { source: &name, target: &o.program, reason: ReconnectReason::Exited, detail, delay }.emit();
                    tokio::time::sleep(delay).await;
                    continue;
                }
            };
            running.up();
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
            running.down();
            let detail = match &status {
                Ok(s) if s.success() => "program exited".to_owned(),
                Ok(s) => format!("program failed ({s})"),
                Err(e) => format!("cannot wait for the program: {e}"),
            };
            if !o.restart {
                if matches!(&status, Ok(s) if s.success()) {
                    // A program run once ends its source when it exits: not a problem.
                    tracing::info!(source = %name, program = %o.program, "{detail}; the source ends");
                } else {
                    t::SourceProblem { source: &name, error_type: t::SourceErrorType::Program, detail, ends: true }.emit();
                }
                return;
            }
            let delay = backoff.next_wait();
            t::SourceReconnecting { source: &name, target: &o.program, reason: ReconnectReason::Exited, detail, delay }.emit();
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
                    reason: crate::source::RejectReason::Truncated
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
