//! `tailrace query`: a pipeline in MongoDB's aggregation language, asked of a running
//! pipeline (`POST /api/aggregate`), printed as a table for people or NDJSON for programs.
//!
//! ```text
//! tailrace query '[{"$group": {"_id": "$lang", "n": {"$sum": 1}}}, {"$sort": {"n": -1}}]'
//! _id  n
//! en   812
//! ja   355
//! (3 of 3 rows · read 1,790 from events in 12 ms · $group, $sort ran in tailrace)
//! ```

use anyhow::Context;
use serde_json::{Value, json};
use unicode_width::UnicodeWidthStr;

/// The widest a table cell is printed; longer values are cut with `…`.
const MAX_CELL: usize = 40;

/// How the answer is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns, one per top-level field, and a line saying how it ran (stderr).
    Table,
    /// One JSON document per line, nothing else on stdout.
    Ndjson,
}

/// Sends `pipeline` (JSON text) over `collection` to the pipeline at `base` and prints the
/// answer.
pub async fn query(
    base: &str,
    collection: &str,
    pipeline: &str,
    format: Format,
) -> anyhow::Result<()> {
    // Checked here, sent as typed: the text keeps the order of a `$sort`'s keys.
    let pipeline: &serde_json::value::RawValue = serde_json::from_str(pipeline)
        .context("the pipeline is not JSON (an array of stages, e.g. '[{\"$match\": {}}]')")?;
    let url = format!("{}/api/aggregate", base.trim_end_matches('/'));
    let client = ingest::source::http::client()
        .build()
        .context("building the HTTP client")?;
    let resp = client
        .post(&url)
        .header("content-type", "application/json")
        .body(format!(
            r#"{{"collection": {}, "pipeline": {}}}"#,
            json!(collection),
            pipeline.get()
        ))
        .send()
        .await
        .with_context(|| {
            format!(
                "connecting to {url}: is `tailrace run` running there? (--url sets the address)"
            )
        })?;
    let status = resp.status();
    let text = resp
        .text()
        .await
        .with_context(|| format!("reading the answer of {url}"))?;
    let body: Value = serde_json::from_str(&text)
        .with_context(|| format!("the answer of {url} is not JSON: {}", text.trim()))?;
    if !status.is_success() {
        let message = body["error"].as_str().unwrap_or("no reason given");
        anyhow::bail!("{status}: {message}");
    }
    let docs = body["docs"].as_array().cloned().unwrap_or_default();
    match format {
        Format::Ndjson => {
            for d in &docs {
                println!("{d}");
            }
        }
        Format::Table => print!("{}", table(&docs)),
    }
    eprintln!("{}", summary(&body, docs.len()));
    Ok(())
}

/// The documents as aligned columns: one per top-level field, in order of first appearance.
pub fn table(docs: &[Value]) -> String {
    let mut columns: Vec<String> = Vec::new();
    for d in docs {
        for k in d.as_object().into_iter().flat_map(|o| o.keys()) {
            if !columns.contains(k) {
                columns.push(k.clone());
            }
        }
    }
    if columns.is_empty() {
        return if docs.is_empty() {
            "(no documents)\n".to_owned()
        } else {
            docs.iter().map(|d| format!("{d}\n")).collect()
        };
    }
    let cells: Vec<Vec<String>> = docs
        .iter()
        .map(|d| columns.iter().map(|c| cell(d.get(c))).collect())
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            cells
                .iter()
                .map(|row| row[i].width())
                .chain([c.width()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |row: &[String]| {
        let mut out = String::new();
        for (i, (v, w)) in row.iter().zip(&widths).enumerate() {
            out.push_str(v);
            if i + 1 < row.len() {
                out.push_str(&" ".repeat(w.saturating_sub(v.width()) + 2));
            }
        }
        // No trailing spaces after a short last cell.
        let mut out = out.trim_end().to_owned();
        out.push('\n');
        out
    };
    let mut out = line(&columns);
    for row in &cells {
        out.push_str(&line(row));
    }
    out
}

/// A value as one table cell: strings bare, dates as their text, the rest as JSON, on one line.
fn cell(v: Option<&Value>) -> String {
    let text = match v {
        None => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(o)) if o.len() == 1 && o.get("$date").is_some_and(Value::is_string) => {
            o["$date"].as_str().unwrap_or_default().to_owned()
        }
        Some(other) => other.to_string(),
    };
    let text = text.replace(['\n', '\r', '\t'], " ");
    if text.chars().count() > MAX_CELL {
        let cut: String = text.chars().take(MAX_CELL - 1).collect();
        format!("{cut}…")
    } else {
        text
    }
}

/// `(3 rows · read 1,790 from events in 12 ms · $group, $sort ran in tailrace)`.
fn summary(body: &Value, rows: usize) -> String {
    let stages: Vec<String> = body["stages"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            format!(
                "{} in {}",
                s["stage"].as_str().unwrap_or("?"),
                s["ran"].as_str().unwrap_or("?")
            )
        })
        .collect();
    format!(
        "({rows} row{} · read {} from {} in {:.0} ms{}{})",
        if rows == 1 { "" } else { "s" },
        body["read"],
        body["collection"].as_str().unwrap_or("?"),
        body["took_ms"].as_f64().unwrap_or(0.0),
        if stages.is_empty() { "" } else { " · " },
        stages.join(", ")
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_table_has_a_column_per_field_and_keeps_each_row_on_one_line() {
        let docs = vec![
            json!({"_id": "ja", "n": 2}),
            json!({"_id": {"$date": "2026-12-06T14:00:00.000Z"}, "n": 10, "extra": "a\nb"}),
            json!({"_id": "🌍", "n": 1, "extra": "x".repeat(100)}),
        ];
        let t = table(&docs);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert_eq!(lines[0], "_id                       n   extra");
        assert_eq!(lines[1], "ja                        2");
        assert_eq!(lines[2], "2026-12-06T14:00:00.000Z  10  a b");
        assert!(
            lines[3].starts_with("🌍                        1   xxx"),
            "{t}"
        );
        assert!(
            lines[3].ends_with('…') && lines[3].chars().count() <= 30 + MAX_CELL,
            "{t}"
        );
        assert_eq!(table(&[]), "(no documents)\n");
    }

    #[test]
    fn the_summary_says_where_each_stage_ran() {
        let body = json!({"collection": "events", "read": 1790, "took_ms": 12.4,
            "stages": [{"stage": "$group", "ran": "tailrace", "out": 3}, {"stage": "$sort", "ran": "server", "out": 3}]});
        assert_eq!(
            summary(&body, 3),
            "(3 rows · read 1790 from events in 12 ms · $group in tailrace, $sort in server)"
        );
    }
}
