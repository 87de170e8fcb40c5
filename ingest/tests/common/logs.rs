//! The process's log, captured: a tracing subscriber that writes into a string, and a watch
//! channel that says when it grew, so a test waits for a line instead of sleeping.

use std::io::Write;
use std::sync::{Mutex, OnceLock};

use tokio::sync::watch;

use super::T;

pub struct Logs {
    text: Mutex<String>,
    changed: watch::Sender<()>,
}

/// Installs the capture (once per process) and returns it; call it before anything logs.
pub fn logs() -> &'static Logs {
    static LOGS: OnceLock<&'static Logs> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs: &'static Logs = Box::leak(Box::new(Logs {
            text: Mutex::new(String::new()),
            changed: watch::channel(()).0,
        }));
        struct W(&'static Logs);
        impl Write for W {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0
                    .text
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(buf));
                self.0.changed.send_replace(());
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        // Everything at trace, except tungstenite's handshake module: at trace it prints the
        // raw upgrade request, header values and query included (see the report: the binary's
        // log filter must keep it at debug or above).
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "trace,tungstenite::handshake=debug",
            ))
            .with_ansi(false)
            .with_writer(move || W(logs))
            .try_init();
        logs
    })
}

/// Everything logged so far.
pub fn log_text() -> String {
    logs().text.lock().unwrap().clone()
}

/// Waits until the log has a line containing every one of `parts`.
pub async fn log_line(parts: &[&str]) -> String {
    let mut rx = logs().changed.subscribe();
    let find = || {
        log_text()
            .lines()
            .find(|l| parts.iter().all(|p| l.contains(p)))
            .map(str::to_owned)
    };
    tokio::time::timeout(T, async {
        loop {
            if let Some(l) = find() {
                return l;
            }
            rx.changed().await.unwrap();
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no log line with {parts:?} within {T:?}:\n{}", log_text()))
}
