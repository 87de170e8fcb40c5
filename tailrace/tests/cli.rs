//! What the binary says about itself and how it writes its logs: `--help` tells a user what
//! tailrace is and shows the common commands; logs to a pipe carry no colour codes; with
//! `--log-format json` every line on stderr is one JSON object.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

/// Runs the binary on its own data directory; returns (succeeded, stdout, stderr).
fn run(data: &Path, env: &[(&str, &str)], args: &[&str]) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tailrace"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("TAILRACE_") || k == "NO_COLOR") {
        cmd.env_remove(k);
    }
    cmd.envs(common::base_env(data))
        .envs(env.iter().copied())
        .args(args)
        .stdin(Stdio::null());
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A pipeline that ends by itself: one file source of three events.
fn finite_run(dir: &Path, args: &[&str]) -> (bool, String) {
    let file = dir.join("events.ndjson");
    std::fs::write(&file, "{\"n\":1}\n{\"n\":2}\n{\"n\":3}\n").unwrap();
    let sources = format!(
        "[{{ name = \"f\", kind = \"file\", path = \"{}\" }}]",
        file.display()
    );
    let data = dir.join(format!("data-{}", args.len()));
    let (ok, _, stderr) = run(&data, &[("TAILRACE_SOURCES", sources.as_str())], args);
    (ok, stderr)
}

#[test]
fn help_says_what_tailrace_is_and_shows_the_common_commands() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, help, _) = run(dir.path(), &[], &["--help"]);
    assert!(ok);
    for want in [
        "reads live streams of JSON events",
        "Common commands:",
        "tailrace check-config",
        "tailrace --config my.toml",
        "--log-format",
    ] {
        assert!(help.contains(want), "--help lacks {want:?}:\n{help}");
    }
    for internal in ["the library", "feature `app`", "(feature"] {
        assert!(
            !help.contains(internal),
            "--help speaks of the code ({internal:?}):\n{help}"
        );
    }
}

#[test]
fn logs_to_a_pipe_have_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, stderr) = finite_run(dir.path(), &["run"]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("stopped cleanly"), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "stderr is a pipe here: no ANSI escape codes, saw {stderr:?}"
    );
}

#[test]
fn json_logs_are_one_object_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, stderr) = finite_run(dir.path(), &["--log-format", "json", "run"]);
    assert!(ok, "{stderr}");
    let lines: Vec<Value> = stderr
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let messages: Vec<&str> = lines
        .iter()
        .map(|l| {
            assert!(l["level"].is_string() && l["timestamp"].is_string(), "{l}");
            l["fields"]["message"].as_str().unwrap_or("")
        })
        .collect();
    for want in [
        "tailrace started",
        "every source ended; stopping",
        "stopped cleanly",
    ] {
        assert!(messages.contains(&want), "no {want:?} among {messages:?}");
    }
}
