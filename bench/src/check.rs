//! `--quick`: checks that a scenario's output is well-formed — the JSON reads back as a
//! [`Report`], every series has samples and ordered quantiles, the floors the scenario needs
//! are there, and every plot it lists is a complete SVG file. Not a timing check.

use std::path::Path;

use super::measure::Summary;
use super::report::Report;
use super::{BenchError, Result};

/// The floors each scenario must report.
fn floors_needed(scenario: &str) -> &'static [&'static str] {
    match scenario {
        "writes" => &[
            "fdatasync_512b",
            "fdatasync_overwrite_4k",
            "sqlite_insert_full",
            "sqlite_insert_normal",
            "sqlite_insert_normal_indexed",
            "sqlite_insert_full_indexed",
        ],
        "insert" => &["fdatasync_512b"],
        "notify" => &["task_wake"],
        "outbox" => &["loopback_rtt"],
        _ => &[],
    }
}

fn check_summary(what: &str, s: &Summary) -> Result<()> {
    let ordered =
        s.min <= s.p50 && s.p50 <= s.p90 && s.p90 <= s.p99 && s.p99 <= s.p999 && s.p999 <= s.max;
    let finite = [s.mean, s.min, s.p50, s.p99, s.max]
        .iter()
        .all(|v| v.is_finite());
    if s.count == 0 || !ordered || !finite {
        return Err(BenchError::Check(format!(
            "{what}: expected samples with min ≤ p50 ≤ p90 ≤ p99 ≤ p99.9 ≤ max, got {s:?}"
        )));
    }
    Ok(())
}

/// Checks `<dir>/<scenario>.json` and the plots it lists; returns the report.
pub fn report_files(dir: &Path, scenario: &str) -> Result<Report> {
    let path = dir.join(format!("{scenario}.json"));
    let text = std::fs::read_to_string(&path)
        .map_err(|e| BenchError::Check(format!("{}: {e}", path.display())))?;
    let report: Report = serde_json::from_str(&text)
        .map_err(|e| BenchError::Check(format!("{}: not a bench report: {e}", path.display())))?;
    if report.scenario != scenario {
        return Err(BenchError::Check(format!(
            "{}: scenario {:?}, expected {scenario:?}",
            path.display(),
            report.scenario
        )));
    }
    if report.series.is_empty() {
        return Err(BenchError::Check(format!("{}: no series", path.display())));
    }
    for s in &report.series {
        check_summary(&format!("{scenario} series {}", s.name), &s.latency_us)?;
        if s.ops == 0 {
            return Err(BenchError::Check(format!(
                "{scenario} series {}: no successful operation",
                s.name
            )));
        }
    }
    for name in floors_needed(scenario) {
        let floor = report
            .floor(name)
            .ok_or_else(|| BenchError::Check(format!("{scenario}: floor {name} missing")))?;
        check_summary(&format!("{scenario} floor {name}"), &floor.latency_us)?;
    }
    if report.plots.len() < 2 {
        return Err(BenchError::Check(format!(
            "{scenario}: expected at least a latency and a CDF plot, got {:?}",
            report.plots
        )));
    }
    for plot in &report.plots {
        let p = dir.join(plot);
        let svg = std::fs::read_to_string(&p)
            .map_err(|e| BenchError::Check(format!("{}: {e}", p.display())))?;
        let complete = svg.starts_with("<svg")
            && svg.trim_end().ends_with("</svg>")
            && svg.contains("<polyline");
        if !complete {
            return Err(BenchError::Check(format!(
                "{}: not a complete SVG plot with a line",
                p.display()
            )));
        }
    }
    Ok(report)
}
