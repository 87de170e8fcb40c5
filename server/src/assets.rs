//! The live page: `server/static/`, embedded in the binary at compile time (no build step, no
//! CDN, works offline), served at `/` and `/assets/...`.
//!
//! The page's own contract (`server/static-dev/README.md`): `.js` must be `text/javascript`
//! (browsers refuse a module script of another type), and the page loads nothing else.
//!
//! The page reads `/api/status` once, then two change streams: `stats` with
//! `include_initial` (each feed's document, with its notification latency `notify_us`, and the
//! `ingest` document of [`ingest::live`]) and `events` with the filter box; its question box
//! (`query.js`) posts pipelines to `/api/aggregate`.
//! Its map (`map.js`) draws world-atlas' country outlines (`vendor/countries-110m.json`, read
//! with `vendor/topojson-client.min.js`), follows `events` and starts its counts from
//! `/api/geo`; `iso3166.json` turns the outlines' ISO numeric ids into the alpha-2 codes events
//! carry, and is checked here against the codes the ingester stamps (`keshvar`'s).
//! `tailrace/tests/page.rs` drives it in headless Chromium against the real binary.

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::error;

/// One embedded file.
struct Asset {
    /// The path under `/assets/`.
    path: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const HTML: &str = "text/html; charset=utf-8";
const JSON: &str = "application/json";
const TEXT: &str = "text/plain; charset=utf-8";

/// `/`.
const INDEX: Asset = Asset {
    path: "index.html",
    content_type: HTML,
    body: include_bytes!("../static/index.html"),
};

/// Everything under `/assets/`.
const ASSETS: [Asset; 14] = [
    INDEX,
    Asset {
        path: "app.js",
        content_type: JS,
        body: include_bytes!("../static/app.js"),
    },
    Asset {
        path: "map.js",
        content_type: JS,
        body: include_bytes!("../static/map.js"),
    },
    Asset {
        path: "iso3166.json",
        content_type: JSON,
        body: include_bytes!("../static/iso3166.json"),
    },
    Asset {
        path: "query.js",
        content_type: JS,
        body: include_bytes!("../static/query.js"),
    },
    Asset {
        path: "sse.js",
        content_type: JS,
        body: include_bytes!("../static/sse.js"),
    },
    Asset {
        path: "style.css",
        content_type: CSS,
        body: include_bytes!("../static/style.css"),
    },
    Asset {
        path: "vendor/uPlot.iife.min.js",
        content_type: JS,
        body: include_bytes!("../static/vendor/uPlot.iife.min.js"),
    },
    Asset {
        path: "vendor/uPlot.min.css",
        content_type: CSS,
        body: include_bytes!("../static/vendor/uPlot.min.css"),
    },
    // uPlot's MIT license travels with it.
    Asset {
        path: "vendor/LICENSE",
        content_type: TEXT,
        body: include_bytes!("../static/vendor/LICENSE"),
    },
    Asset {
        path: "vendor/topojson-client.min.js",
        content_type: JS,
        body: include_bytes!("../static/vendor/topojson-client.min.js"),
    },
    Asset {
        path: "vendor/countries-110m.json",
        content_type: JSON,
        body: include_bytes!("../static/vendor/countries-110m.json"),
    },
    // Their ISC licenses travel with them.
    Asset {
        path: "vendor/LICENSE.topojson-client",
        content_type: TEXT,
        body: include_bytes!("../static/vendor/LICENSE.topojson-client"),
    },
    Asset {
        path: "vendor/LICENSE.world-atlas",
        content_type: TEXT,
        body: include_bytes!("../static/vendor/LICENSE.world-atlas"),
    },
];

fn serve(a: &Asset) -> Response {
    (
        [
            (header::CONTENT_TYPE, a.content_type),
            // Revalidated on each load, so a new binary's page is never mixed with old files.
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        a.body,
    )
        .into_response()
}

/// `GET /`.
pub(super) async fn index() -> Response {
    serve(&INDEX)
}

/// `GET /assets/{*path}`.
pub(super) async fn asset(Path(path): Path<String>) -> Response {
    match ASSETS.iter().find(|a| a.path == path) {
        Some(a) => serve(a),
        None => error(StatusCode::NOT_FOUND, format!("no asset {path:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_of_the_page_is_embedded_with_its_type() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("static");
        let mut on_disk = Vec::new();
        let mut stack = vec![dir.clone()];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let p = entry.path();
                if p.is_dir() {
                    stack.push(p);
                } else if let Ok(rel) = p.strip_prefix(&dir) {
                    on_disk.push(rel.to_string_lossy().replace('\\', "/"));
                }
            }
        }
        for file in &on_disk {
            if file == "vendor/README.md" {
                continue; // where the vendored files came from, for people, not for the page
            }
            let a = ASSETS.iter().find(|a| a.path == file);
            assert!(
                a.is_some(),
                "server/static/{file} is not embedded; add it to ASSETS"
            );
            if let Some(a) = a {
                let want = match file.rsplit('.').next() {
                    Some("js") => JS,
                    Some("css") => CSS,
                    Some("html") => HTML,
                    Some("json") => JSON,
                    _ => a.content_type,
                };
                assert_eq!(a.content_type, want, "{file}");
                assert_eq!(
                    a.body.len() as u64,
                    std::fs::metadata(dir.join(file))
                        .map(|m| m.len())
                        .unwrap_or(0),
                    "{file}: the embedded copy is the file"
                );
            }
        }
    }

    /// `iso3166.json` is the ingester's country list (`keshvar`'s codes), numeric to alpha-2,
    /// byte for byte: never a table typed by hand. After a `keshvar` upgrade, write it again
    /// with `TAILRACE_WRITE_ISO3166=1 cargo test -p server iso3166`.
    #[test]
    fn iso3166_json_is_the_ingesters_country_list() {
        let mut pairs: Vec<(&str, &str)> = ingest::geo::countries()
            .iter()
            .map(|c| (c.numeric, c.code.as_str()))
            .collect();
        pairs.sort_unstable();
        let body: Vec<String> = pairs
            .iter()
            .map(|(numeric, code)| format!("  \"{numeric}\": \"{code}\""))
            .collect();
        let want = format!("{{\n{}\n}}\n", body.join(",\n"));
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("static/iso3166.json");
        if std::env::var_os("TAILRACE_WRITE_ISO3166").is_some() {
            std::fs::write(&path, &want).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "{} is not the ingester's country list; write it again with \
             TAILRACE_WRITE_ISO3166=1 cargo test -p server iso3166",
            path.display()
        );
        let parsed: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&have).unwrap_or_default();
        assert_eq!(
            parsed.len(),
            pairs.len(),
            "one entry per country, valid JSON"
        );
    }
}
