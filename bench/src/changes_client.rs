//! A minimal external client of `/api/changes` for `tailrace bench notify`: one TCP connection
//! on 127.0.0.1 (`TCP_NODELAY`), an HTTP/1.1 request for NDJSON, the chunked body decoded by
//! hand, one JSON object per line. Nothing between the socket and the parsed event but this
//! file, so what it measures is the server and the loopback, not an HTTP client library.

use std::net::SocketAddr;

use futures::stream::{BoxStream, StreamExt};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{BenchError, Result};

fn err(what: impl Into<String>) -> BenchError {
    BenchError::Scenario(format!("/api/changes client: {}", what.into()))
}

/// The decoder's state: bytes read and not yet consumed.
struct Reader {
    sock: TcpStream,
    buf: Vec<u8>,
    /// Start of the unconsumed bytes in `buf`.
    at: usize,
    /// Decoded body bytes not yet split into lines.
    body: Vec<u8>,
}

impl Reader {
    /// Reads more from the socket; `false` at the end of the connection.
    async fn fill(&mut self) -> Result<bool> {
        if self.at > 0 && self.at == self.buf.len() {
            self.buf.clear();
            self.at = 0;
        }
        let mut chunk = [0u8; 64 * 1024];
        let n = self
            .sock
            .read(&mut chunk)
            .await
            .map_err(|e| err(format!("read: {e}")))?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n > 0)
    }

    /// The next line of the raw stream (head or chunk size), without its CRLF.
    async fn raw_line(&mut self) -> Result<String> {
        loop {
            if let Some(i) = self.buf[self.at..].windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8_lossy(&self.buf[self.at..self.at + i]).into_owned();
                self.at += i + 2;
                return Ok(line);
            }
            if !self.fill().await? {
                return Err(err("the server closed the connection"));
            }
        }
    }

    /// Exactly `n` raw bytes, appended to the decoded body.
    async fn raw_bytes(&mut self, n: usize) -> Result<()> {
        while self.buf.len() - self.at < n {
            if !self.fill().await? {
                return Err(err("the server closed the connection mid-chunk"));
            }
        }
        self.body.extend_from_slice(&self.buf[self.at..self.at + n]);
        self.at += n;
        Ok(())
    }

    /// The next NDJSON line of the body (empty lines are keep-alives: skipped).
    async fn next_line(&mut self) -> Result<Option<Value>> {
        loop {
            if let Some(i) = self.body.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.body.drain(..=i).collect();
                let line = &line[..line.len() - 1];
                if line.is_empty() {
                    continue;
                }
                return serde_json::from_slice(line)
                    .map(Some)
                    .map_err(|e| err(format!("not JSON: {e}")));
            }
            let size = self.raw_line().await?;
            let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| err(format!("bad chunk size {size:?}")))?;
            if size == 0 {
                return Ok(None);
            }
            self.raw_bytes(size).await?;
            let crlf = self.raw_line().await?;
            if !crlf.is_empty() {
                return Err(err("a chunk without its CRLF"));
            }
        }
    }
}

/// Opens `GET /api/changes?{query}` as NDJSON on `addr`, checks the 200 and the chunked
/// encoding, and returns the stream of events (each line's JSON object).
pub async fn open(addr: SocketAddr, query: &str) -> Result<BoxStream<'static, Result<Value>>> {
    let mut sock = TcpStream::connect(addr)
        .await
        .map_err(|e| err(format!("connect: {e}")))?;
    sock.set_nodelay(true)
        .map_err(|e| err(format!("nodelay: {e}")))?;
    let request = format!(
        "GET /api/changes?{query} HTTP/1.1\r\nHost: {addr}\r\nAccept: application/x-ndjson\r\n\r\n"
    );
    sock.write_all(request.as_bytes())
        .await
        .map_err(|e| err(format!("write: {e}")))?;
    let mut r = Reader {
        sock,
        buf: Vec::with_capacity(128 * 1024),
        at: 0,
        body: Vec::with_capacity(64 * 1024),
    };
    let status = r.raw_line().await?;
    if !status.starts_with("HTTP/1.1 200") {
        return Err(err(format!("answered {status:?}")));
    }
    let mut chunked = false;
    loop {
        let header = r.raw_line().await?;
        if header.is_empty() {
            break;
        }
        let lower = header.to_ascii_lowercase();
        if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
            chunked = true;
        }
    }
    if !chunked {
        return Err(err("expected a chunked response"));
    }
    Ok(futures::stream::unfold(Some(r), |state| async move {
        let mut r = state?;
        match r.next_line().await {
            Ok(Some(v)) => Some((Ok(v), Some(r))),
            Ok(None) => None,
            Err(e) => Some((Err(e), None)),
        }
    })
    .boxed())
}
