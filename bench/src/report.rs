//! A scenario's result: the JSON written to `<out>/<scenario>.json`, the table printed, the
//! published figures printed beside ours, and the targets (reported, never asserted).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::floors::Floor;
use super::machine::{self, Machine};
use super::measure::{Summary, fmt_ratio};
use super::{Bench, Result, io_err};

/// Bumped when the JSON layout changes incompatibly.
pub const FORMAT_VERSION: u32 = 1;

/// One scenario's result.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    /// [`FORMAT_VERSION`].
    pub format: u32,
    /// `writes`, `reads`, ...
    pub scenario: String,
    /// One line saying what was measured.
    pub title: String,
    /// tailrace's version.
    pub tailrace_version: String,
    /// When the scenario started (RFC 3339, UTC).
    pub started_at: String,
    /// Whether this was a `--quick` run (tiny sizes: the numbers mean nothing).
    pub quick: bool,
    /// `embedded` or `mongodb`.
    pub engine: String,
    /// The configured durability (scenarios that vary it say so per series).
    pub durability: String,
    /// What the run was measured on.
    pub machine: Machine,
    /// Sizes and settings of this run.
    pub params: Value,
    /// The floors measured in the same run.
    pub floors: Vec<Floor>,
    /// One entry per measured configuration.
    pub series: Vec<Series>,
    /// Published figures of other systems, printed beside ours.
    pub references: Vec<Reference>,
    /// Goals, with whether this run met them.
    pub targets: Vec<Target>,
    /// What a reader must know to interpret the numbers (skipped steps, caveats).
    pub notes: Vec<String>,
    /// Plot files written beside the JSON.
    pub plots: Vec<String>,
}

/// One measured configuration (a durability level, a concurrency level, a feed kind...).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Series {
    /// Short name, unique within the scenario.
    pub name: String,
    /// What distinguishes it (durability, concurrency, rate, kind...).
    pub params: Value,
    /// Latency per operation, in microseconds.
    pub latency_us: Summary,
    /// Operations that succeeded.
    pub ops: u64,
    /// Operations that failed.
    pub failures: u64,
    /// Wall time of the measured run, in seconds.
    pub elapsed_secs: f64,
    /// Successful operations (or documents) per second.
    pub throughput_per_sec: f64,
    /// The floor this series is compared with, by name.
    pub floor: Option<String>,
    /// This series' median latency divided by the floor's median.
    pub ratio_to_floor: Option<f64>,
    /// Anything scenario-specific.
    pub extra: Value,
}

/// A published figure.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Reference {
    /// The system and version (`MongoDB 2.6`).
    pub system: String,
    /// What it measured (`journaled write`).
    pub what: String,
    /// The figure.
    pub value: f64,
    /// Its unit (`µs`, `docs/s`, `req/s`, `%`, `s`).
    pub unit: String,
}

/// A goal and whether this run met it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Target {
    /// What the goal is, in words (`journaled p50 ≤ 1.2× fdatasync floor`).
    pub goal: String,
    /// The measured figure.
    pub measured: f64,
    /// The bound.
    pub limit: f64,
    /// `×floor`, `µs`, `docs/s`, `failures`.
    pub unit: String,
    /// Whether the bound is an upper bound (measured must be ≤ limit) or a lower bound.
    pub at_most: bool,
    /// Whether it was met.
    pub met: bool,
}

impl Target {
    /// `measured ≤ limit`.
    pub fn at_most(goal: impl Into<String>, measured: f64, limit: f64, unit: &str) -> Target {
        Target {
            goal: goal.into(),
            measured,
            limit,
            unit: unit.into(),
            at_most: true,
            met: measured <= limit,
        }
    }

    /// `measured ≥ limit`.
    pub fn at_least(goal: impl Into<String>, measured: f64, limit: f64, unit: &str) -> Target {
        Target {
            goal: goal.into(),
            measured,
            limit,
            unit: unit.into(),
            at_most: false,
            met: measured >= limit,
        }
    }

    /// `met (1.05×)` or `MISSED by 35% (1.62× against 1.20×)`.
    pub fn verdict(&self) -> String {
        // A near miss must not read as "90 % against 90 %": one more decimal where whole
        // numbers would show the measure equal to the bound.
        let decimals = usize::from(
            !self.met && format!("{:.0}", self.measured) == format!("{:.0}", self.limit),
        );
        let show = |v: f64| match self.unit.as_str() {
            u if u.starts_with('×') => fmt_ratio(v),
            "µs" => super::measure::fmt_us(v),
            "docs/s" | "req/s" => super::measure::fmt_rate(v),
            _ => format!("{v:.decimals$} {}", self.unit),
        };
        if self.met {
            format!("met ({})", show(self.measured))
        } else {
            let by = if self.at_most {
                (self.measured / self.limit - 1.0) * 100.0
            } else {
                (1.0 - self.measured / self.limit) * 100.0
            };
            let by = if by.is_finite() && by < 1.0 {
                format!(" by {by:.1}%")
            } else if by.is_finite() {
                format!(" by {by:.0}%")
            } else {
                String::new()
            };
            format!(
                "MISSED{by} ({} against {})",
                show(self.measured),
                show(self.limit)
            )
        }
    }
}

impl Report {
    /// An empty report with the run's shared facts.
    pub fn new(bench: &Bench, scenario: &str, title: &str) -> Report {
        Report {
            format: FORMAT_VERSION,
            scenario: scenario.into(),
            title: title.into(),
            tailrace_version: env!("CARGO_PKG_VERSION").into(),
            started_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            quick: bench.args.quick,
            engine: bench.engine_name().into(),
            durability: bench.config.store.durability.as_str().into(),
            machine: machine::detect(&bench.data_root),
            params: Value::Null,
            floors: Vec::new(),
            series: Vec::new(),
            references: Vec::new(),
            targets: Vec::new(),
            notes: Vec::new(),
            plots: Vec::new(),
        }
    }

    /// The floor of this name.
    pub fn floor(&self, name: &str) -> Option<&Floor> {
        self.floors.iter().find(|f| f.name == name)
    }

    /// Adds published figures.
    pub fn references(&mut self, refs: &[(&str, &str, f64, &str)]) {
        self.references
            .extend(refs.iter().map(|(system, what, value, unit)| Reference {
                system: (*system).into(),
                what: (*what).into(),
                value: *value,
                unit: (*unit).into(),
            }));
    }

    /// Prints the header: title, machine, floors.
    pub fn print_header(&self) {
        let m = &self.machine;
        println!("\n== {} — {}", self.scenario, self.title);
        println!(
            "   engine {} · {} build · {} cores · {} · load {} · disk {} ({})",
            self.engine,
            m.build,
            m.cores,
            m.memory_bytes
                .map(|b| format!("{:.0} GiB", b as f64 / (1u64 << 30) as f64))
                .unwrap_or_else(|| "memory ?".into()),
            m.load_average
                .map(|l| format!("{:.2}", l[0]))
                .unwrap_or_else(|| "?".into()),
            m.disk.device.as_deref().unwrap_or("?"),
            m.disk.fs_type.as_deref().unwrap_or("?"),
        );
        for f in &self.floors {
            println!(
                "   floor {}: p50 {} p99 {} ({} samples) — {}",
                f.name,
                super::measure::fmt_us(f.latency_us.p50),
                super::measure::fmt_us(f.latency_us.p99),
                f.latency_us.count,
                f.what
            );
        }
    }

    /// Prints the published figures, the targets and the notes.
    pub fn print_footer(&self) {
        if !self.references.is_empty() {
            println!("   published figures (other systems, other hardware, other years):");
            for r in &self.references {
                let v = match r.unit.as_str() {
                    "µs" => super::measure::fmt_us(r.value),
                    "docs/s" | "rows/s" | "req/s" => format!(
                        "{} {}",
                        super::measure::thousands(r.value.round() as u64),
                        r.unit
                    ),
                    u => format!("{} {u}", r.value),
                };
                println!("     {:<28} {:<34} {v}", r.system, r.what);
            }
        }
        for t in &self.targets {
            println!("   target {}: {}", t.goal, t.verdict());
        }
        for n in &self.notes {
            println!("   note: {n}");
        }
    }

    /// Writes `<dir>/<scenario>.json`.
    pub fn write(&self, dir: &Path) -> Result<PathBuf> {
        let path = dir.join(format!("{}.json", self.scenario));
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(&path, text + "\n")
            .map_err(io_err(format!("writing {}", path.display())))?;
        Ok(path)
    }
}

/// A plain-text table: the first column left-aligned, the others right-aligned.
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub fn new(headers: &[&str]) -> Table {
        Table {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (missing cells print empty).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as text, one line per row, indented.
    pub fn render(&self) -> String {
        let cols = self.headers.len();
        let width = |i: usize| {
            self.rows
                .iter()
                .filter_map(|r| r.get(i))
                .chain(std::iter::once(&self.headers[i]))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..cols).map(width).collect();
        let line = |cells: &[String]| {
            let mut out = String::from("   ");
            for (i, w) in widths.iter().enumerate() {
                let c = cells.get(i).map(String::as_str).unwrap_or("");
                let pad = w.saturating_sub(c.chars().count());
                if i == 0 {
                    out.push_str(c);
                    out.push_str(&" ".repeat(pad));
                } else {
                    out.push_str("  ");
                    out.push_str(&" ".repeat(pad));
                    out.push_str(c);
                }
            }
            out.trim_end().to_string()
        };
        let mut text = line(&self.headers);
        text.push('\n');
        for r in &self.rows {
            text.push_str(&line(r));
            text.push('\n');
        }
        text
    }

    /// Prints it.
    pub fn print(&self) {
        print!("{}", self.render());
    }
}

/// The latency cells `p50 p99 p99.9 max mean` of a summary.
pub fn latency_cells(s: &Summary) -> Vec<String> {
    use super::measure::fmt_us;
    vec![
        fmt_us(s.p50),
        fmt_us(s.p99),
        fmt_us(s.p999),
        fmt_us(s.max),
        fmt_us(s.mean),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let mut t = Table::new(&["name", "p50"]);
        t.row(vec!["journaled".into(), "1.2 ms".into()]);
        t.row(vec!["ack".into(), "45 µs".into()]);
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "   name          p50");
        assert_eq!(lines[1], "   journaled  1.2 ms");
        assert_eq!(lines[2], "   ack         45 µs");
    }

    #[test]
    fn verdicts_say_by_how_much() {
        let cases = [
            (Target::at_most("x", 1.05, 1.2, "×floor"), "met (1.05×)"),
            (
                Target::at_most("x", 1.8, 1.2, "×floor"),
                "MISSED by 50% (1.80× against 1.20×)",
            ),
            (
                Target::at_least("x", 50_000.0, 100_000.0, "docs/s"),
                "MISSED by 50% (50,000/s against 100,000/s)",
            ),
            // A near miss keeps a decimal, so it never reads as equal to its bound.
            (
                Target::at_least("x", 89.6, 90.0, "%"),
                "MISSED by 0.4% (89.6 % against 90.0 %)",
            ),
            (
                Target::at_least("x", 78.2, 90.0, "%"),
                "MISSED by 13% (78 % against 90 %)",
            ),
        ];
        for (target, verdict) in cases {
            assert_eq!(target.verdict(), verdict);
        }
    }
}
