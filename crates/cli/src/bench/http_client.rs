//! A minimal streaming HTTP/1.1 client for loopback benchmarks (hyper's connection API, one
//! connection per request, as vLLM's benchmark client opens them), and a server-sent-events
//! splitter. Only 127.0.0.1 / localhost / ::1 are accepted: this tool must not load anyone's
//! server but our own.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;

/// The loopback address for `host`, or an error for anything else.
pub fn loopback(host: &str, port: u16) -> Result<SocketAddr> {
    let ip: IpAddr = match host {
        "localhost" => Ipv4Addr::LOCALHOST.into(),
        h => h
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .map_err(|_| anyhow!("--host {host}: only 127.0.0.1, ::1 or localhost are allowed"))?,
    };
    if !ip.is_loopback() {
        bail!("--host {host}: not a loopback address; this benchmark only loads a server on this machine");
    }
    Ok(SocketAddr::new(ip, port))
}

async fn connect(addr: SocketAddr) -> Result<http1::SendRequest<Full<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(addr).await.with_context(|| format!("connecting to {addr}"))?;
    stream.set_nodelay(true)?;
    let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// GET `path`; the status code.
pub async fn get_status(addr: SocketAddr, path: &str) -> Result<u16> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let (mut sender, conn) = http1::handshake::<_, Empty<Bytes>>(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = hyper::Request::get(path).header("host", addr.to_string()).body(Empty::new())?;
    let resp = sender.send_request(req).await?;
    Ok(resp.status().as_u16())
}

/// Waits until `GET /health` answers 200.
pub async fn wait_healthy(addr: SocketAddr, timeout: Duration) -> Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Ok(200) = get_status(addr, "/health").await {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("the server at {addr} was not healthy within {} s", timeout.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A streamed POST: the status, then each event's data as it arrives, via `on_event`.
/// Returns the body text when the status is not 200 (the error the server gave).
pub async fn post_stream(addr: SocketAddr, path: &str, body: String, mut on_event: impl FnMut(&str)) -> Result<()> {
    let mut sender = connect(addr).await?;
    let req = hyper::Request::post(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .header("accept", "text/event-stream")
        .body(Full::new(Bytes::from(body)))?;
    let resp = sender.send_request(req).await?;
    let status = resp.status();
    let mut body = resp.into_body();
    if !status.is_success() {
        let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        bail!("HTTP {status}: {}", String::from_utf8_lossy(&bytes).trim());
    }
    let mut sse = SseSplitter::default();
    while let Some(frame) = body.frame().await {
        let frame = frame.context("reading the response stream")?;
        if let Some(data) = frame.data_ref() {
            for ev in sse.push(data) {
                on_event(&ev);
            }
        }
    }
    Ok(())
}

/// Splits a server-sent-event byte stream into events' `data` fields, whatever the chunking.
#[derive(Default)]
pub struct SseSplitter {
    buf: Vec<u8>,
}

impl SseSplitter {
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(bytes);
        let mut out = vec![];
        while let Some(end) = find_blank_line(&self.buf) {
            let event: Vec<u8> = self.buf.drain(..end.0 + end.1).collect();
            let text = String::from_utf8_lossy(&event[..end.0]);
            let data: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            if !data.is_empty() {
                out.push(data.join("\n"));
            }
        }
        out
    }
}

/// (start, length) of the first blank line (`\n\n` or `\r\n\r\n`) that ends an event.
fn find_blank_line(b: &[u8]) -> Option<(usize, usize)> {
    let lf = b.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = b.windows(4).position(|w| w == b"\r\n\r\n").map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(c)) => Some(if a.0 <= c.0 { a } else { c }),
        (a, c) => a.or(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv6Addr;

    #[test]
    fn only_loopback_hosts_are_accepted() {
        assert_eq!(loopback("127.0.0.1", 80).unwrap(), "127.0.0.1:80".parse().unwrap());
        assert_eq!(loopback("localhost", 8000).unwrap().ip(), IpAddr::from(Ipv4Addr::LOCALHOST));
        assert!(loopback("::1", 1).unwrap().ip().is_loopback());
        assert!(loopback("[::1]", 1).is_ok());
        assert!(loopback(&Ipv6Addr::LOCALHOST.to_string(), 1).is_ok());
        for bad in ["10.0.0.1", "0.0.0.0", "example.com", "8.8.8.8", "192.168.1.2"] {
            assert!(loopback(bad, 80).is_err(), "{bad} must be refused");
        }
    }

    #[test]
    fn events_split_whatever_the_chunking() {
        let stream = b"data: {\"a\":1}\n\ndata: {\"b\":2}\r\n\r\n: comment\n\ndata: [DONE]\n\n";
        for cut in 0..stream.len() {
            let mut s = SseSplitter::default();
            let mut ev = s.push(&stream[..cut]);
            ev.extend(s.push(&stream[cut..]));
            assert_eq!(ev, vec!["{\"a\":1}", "{\"b\":2}", "[DONE]"], "cut at {cut}");
        }
        // An event not yet ended is held back.
        let mut s = SseSplitter::default();
        assert!(s.push(b"data: partial").is_empty());
        assert_eq!(s.push(b"\n\n"), vec!["partial"]);
    }
}
