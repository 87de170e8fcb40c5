//! A parser of the Prometheus text exposition format (the subset the exporter writes).
//!
//! One copy for two crates' tests: `ingest`'s source tests read the in-process recorder with
//! it, and `tailrace/tests/common` includes this file by `#[path]` to read the binary's
//! `/metrics`.

use std::collections::BTreeMap;

/// A parsed Prometheus text exposition.
#[derive(Debug, Default)]
pub struct Metrics {
    /// (name, labels, value) in exposition order.
    pub samples: Vec<(String, BTreeMap<String, String>, f64)>,
    /// `# HELP` texts by metric family.
    pub help: BTreeMap<String, String>,
    /// `# TYPE` by metric family.
    pub types: BTreeMap<String, String>,
}

impl Metrics {
    /// Parses the text format (the subset the exporter writes).
    pub fn parse(text: &str) -> Metrics {
        let mut m = Metrics::default();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
                m.help.insert(name.into(), help.into());
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, ty) = rest.split_once(' ').unwrap_or((rest, ""));
                m.types.insert(name.into(), ty.into());
                continue;
            }
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').unwrap();
            let value: f64 = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse().unwrap_or(f64::NAN),
            };
            let (name, labels) = match series.split_once('{') {
                Some((n, l)) => (n, parse_labels(l.trim_end_matches('}'))),
                None => (series, BTreeMap::new()),
            };
            m.samples.push((name.into(), labels, value));
        }
        m
    }

    /// Samples of `name` whose labels include every `(key, value)` of `want`.
    pub fn find(&self, name: &str, want: &[(&str, &str)]) -> Vec<f64> {
        self.samples
            .iter()
            .filter(|(n, l, _)| {
                n == name
                    && want
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, _, v)| *v)
            .collect()
    }

    /// The sum of matching samples (0 when none).
    pub fn sum(&self, name: &str, want: &[(&str, &str)]) -> f64 {
        self.find(name, want).iter().sum()
    }

    /// The single matching sample, if exactly one.
    pub fn one(&self, name: &str, want: &[(&str, &str)]) -> Option<f64> {
        let found = self.find(name, want);
        (found.len() == 1).then(|| found[0])
    }
}

fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = s;
    while let Some((key, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, n)) = chars.next() {
                        value.push(match n {
                            'n' => '\n',
                            other => other,
                        });
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        out.insert(key.trim_start_matches(',').trim().to_string(), value);
        rest = &after[end..];
    }
    out
}

#[test]
fn parses_the_exposition_format() {
    let m = Metrics::parse(
        "# HELP a_total Things.\n# TYPE a_total counter\na_total{x=\"1\",y=\"q\\\"uote\"} 3\nb 2.5\nc_bucket{le=\"+Inf\"} 4\n",
    );
    assert_eq!(m.one("a_total", &[("x", "1")]), Some(3.0));
    assert_eq!(m.find("a_total", &[("y", "q\"uote")]), vec![3.0]);
    assert_eq!(m.one("b", &[]), Some(2.5));
    assert_eq!(m.one("c_bucket", &[("le", "+Inf")]), Some(4.0));
    assert_eq!(m.types["a_total"], "counter");
}
