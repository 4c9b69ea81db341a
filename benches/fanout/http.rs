//! A minimal HTTP/1.1 keep-alive client over a tokio `TcpStream`: one request at a time
//! per connection, `Content-Length` and chunked responses, one reconnect when a reused
//! connection turns out to be closed. Enough for publishes and token mints, nothing more.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Bound of one request/response round trip.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);

pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

pub struct HttpClient {
    addr: SocketAddr,
    auth: Option<String>,
    conn: Option<TcpStream>,
    /// Bytes read from `conn` that belong to the next response.
    buf: Vec<u8>,
}

impl HttpClient {
    pub fn new(addr: SocketAddr, bearer: Option<&str>) -> Self {
        HttpClient {
            addr,
            auth: bearer.map(|k| format!("Authorization: Bearer {k}\r\n")),
            conn: None,
            buf: Vec::new(),
        }
    }

    pub async fn get(&mut self, path: &str) -> io::Result<Response> {
        self.request("GET", path, b"").await
    }

    pub async fn post(&mut self, path: &str, body: &[u8]) -> io::Result<Response> {
        self.request("POST", path, body).await
    }

    pub async fn request(&mut self, method: &str, path: &str, body: &[u8]) -> io::Result<Response> {
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        if let Some(a) = &self.auth {
            head.push_str(a);
        }
        if !body.is_empty() {
            head.push_str("Content-Type: application/json\r\n");
        }
        head.push_str("\r\n");
        let mut req = head.into_bytes();
        req.extend_from_slice(body);
        for attempt in 0..2 {
            let reused = self.conn.is_some();
            if self.conn.is_none() {
                let s = tokio::time::timeout(CALL_TIMEOUT, TcpStream::connect(self.addr))
                    .await
                    .map_err(|_| {
                    io::Error::new(io::ErrorKind::TimedOut, "connect timed out")
                })??;
                s.set_nodelay(true)?;
                self.conn = Some(s);
                self.buf.clear();
            }
            match tokio::time::timeout(CALL_TIMEOUT, self.round_trip(&req)).await {
                Ok(Ok((resp, keep))) => {
                    if !keep {
                        self.conn = None;
                    }
                    return Ok(resp);
                }
                Ok(Err((e, got_bytes))) => {
                    self.conn = None;
                    // A kept-alive connection the server closed meanwhile: retry once.
                    if reused && !got_bytes && attempt == 0 {
                        continue;
                    }
                    return Err(e);
                }
                Err(_) => {
                    self.conn = None;
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "request timed out"));
                }
            }
        }
        unreachable!()
    }

    /// Sends `req` and reads one response; the error says whether any response byte came.
    async fn round_trip(&mut self, req: &[u8]) -> Result<(Response, bool), (io::Error, bool)> {
        let conn = self.conn.as_mut().expect("connected");
        conn.write_all(req).await.map_err(|e| (e, false))?;
        let buf = &mut self.buf;
        let head_end = loop {
            if let Some(i) = memchr::memmem::find(buf, b"\r\n\r\n") {
                break i + 4;
            }
            if fill(conn, buf).await.map_err(|e| (e, !buf.is_empty()))? == 0 {
                return Err((eof(), !buf.is_empty()));
            }
        };
        let head =
            std::str::from_utf8(&buf[..head_end]).map_err(|_| (bad("head not UTF-8"), true))?;
        let status: u16 = head
            .split_ascii_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| (bad("no status"), true))?;
        let mut length = None;
        let mut chunked = false;
        let mut keep = true;
        for line in head.split("\r\n").skip(1) {
            let Some((name, value)) = line.split_once(':') else { continue };
            let value = value.trim();
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = value.parse::<usize>().ok(),
                "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
                "connection" => keep = !value.eq_ignore_ascii_case("close"),
                _ => {}
            }
        }
        buf.drain(..head_end);
        let body = if chunked {
            read_chunked(conn, buf).await.map_err(|e| (e, true))?
        } else if let Some(n) = length {
            while buf.len() < n {
                if fill(conn, buf).await.map_err(|e| (e, true))? == 0 {
                    return Err((eof(), true));
                }
            }
            buf.drain(..n).collect()
        } else if status == 204 || status == 304 || status / 100 == 1 {
            Vec::new()
        } else {
            keep = false;
            while fill(conn, buf).await.map_err(|e| (e, true))? > 0 {}
            std::mem::take(buf)
        };
        Ok((Response { status, body }, keep))
    }
}

async fn fill(conn: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<usize> {
    let mut chunk = [0u8; 8192];
    let n = conn.read(&mut chunk).await?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

async fn read_chunked(conn: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = loop {
            if let Some(i) = memchr::memmem::find(buf, b"\r\n") {
                break i;
            }
            if fill(conn, buf).await? == 0 {
                return Err(eof());
            }
        };
        let size_text = std::str::from_utf8(&buf[..line_end]).map_err(|_| bad("chunk size"))?;
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| bad("chunk size"))?;
        while buf.len() < line_end + 2 + size + 2 {
            if fill(conn, buf).await? == 0 {
                return Err(eof());
            }
        }
        body.extend_from_slice(&buf[line_end + 2..line_end + 2 + size]);
        buf.drain(..line_end + 2 + size + 2);
        if size == 0 {
            return Ok(body); // trailers are not used by the servers under test
        }
    }
}

fn eof() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed")
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("bad HTTP response: {what}"))
}
