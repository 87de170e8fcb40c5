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

/// `/`.
const INDEX: Asset = Asset {
    path: "index.html",
    content_type: HTML,
    body: include_bytes!("../static/index.html"),
};

/// Everything under `/assets/`.
const ASSETS: [Asset; 8] = [
    INDEX,
    Asset {
        path: "app.js",
        content_type: JS,
        body: include_bytes!("../static/app.js"),
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
        content_type: "text/plain; charset=utf-8",
        body: include_bytes!("../static/vendor/LICENSE"),
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
                continue; // where uPlot came from, for people, not for the page
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
}
