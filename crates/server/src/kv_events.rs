//! KV-cache events for routers (vLLM's KV event publisher's wire format): the engine's
//! prefix-cache changes ([`KvEvent`]) published on a ZeroMQ PUB socket, so that a router's
//! KV-aware policy (`vllm-router --policy kv_aware --kv-event-source URL=tcp://HOST:PORT`) sends
//! a request to the replica that already holds its prefix.
//!
//! Each engine batch is one message of three frames: the topic (empty), an 8-byte big-endian
//! sequence number (from 0, +1 per batch) and a msgpack payload
//! `[ts, [event, ...], data_parallel_rank]`, each event a map: `{"type": "BlockStored",
//! "block_hashes": [h], "parent_block_hash": p | nil, "token_ids": [...], "block_size": n,
//! "lora_id": nil, "lora_name": nil, "medium": "GPU"}` or `{"type": "BlockRemoved",
//! "block_hashes": [h], "medium": "GPU"}`. Hashes are the engine's own block hashes cut to 63
//! bits (a router reads them as signed integers; it hashes `token_ids` itself for matching).
//! docs/scale-out.md describes the contract, which tests/routers/kv_events_contract.py checks
//! against the pinned router.
//!
//! ZeroMQ's wire protocol (ZMTP 3.0, NULL security) is spoken here directly rather than through
//! a binding: a PUB socket only writes a greeting, a READY command naming its type, and
//! length-prefixed frames, and reads its subscribers' frames (their subscriptions, which it
//! ignores: every subscriber gets every batch, and a SUB filters by topic itself).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tandem_engine::block_manager::KvEvent;

/// Binds `endpoint` (`tcp://HOST:PORT`; `*` for every interface) and publishes every batch
/// `events` yields, until its sender is dropped. Returns the bound address.
pub fn spawn(endpoint: &str, events: Receiver<Vec<KvEvent>>, block_size: usize) -> io::Result<SocketAddr> {
    let hostport = endpoint.strip_prefix("tcp://").ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("KV events endpoint `{endpoint}`: expected tcp://HOST:PORT"),
        )
    })?;
    let hostport = hostport.replacen('*', "0.0.0.0", 1);
    let addr = hostport
        .to_socket_addrs()
        .map_err(|e| io::Error::new(e.kind(), format!("KV events endpoint `{endpoint}`: {e}")))?
        .next()
        .ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("KV events endpoint `{endpoint}`: no address"))
        })?;
    let listener = TcpListener::bind(addr)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot listen for KV event subscribers on {addr}: {e}")))?;
    let local = listener.local_addr()?;
    let subscribers: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
    let subs = subscribers.clone();
    std::thread::Builder::new().name("kv-events-accept".into()).spawn(move || {
        for stream in listener.incoming().flatten() {
            let subs = subs.clone();
            // The handshake waits on the peer: off the accepting thread.
            let _ = std::thread::Builder::new().name("kv-events-peer".into()).spawn(move || match handshake(&stream) {
                Ok(()) => {
                    let Ok(reader) = stream.try_clone() else { return };
                    let peer = stream.peer_addr().map_or_else(|_| "?".to_string(), |a| a.to_string());
                    subs.lock().unwrap_or_else(|e| e.into_inner()).push(stream);
                    tracing::info!("KV events: a subscriber joined from {peer}");
                    drain(reader);
                }
                Err(e) => tracing::debug!("KV events: a subscriber's handshake failed: {e}"),
            });
        }
    })?;
    std::thread::Builder::new().name("kv-events-publish".into()).spawn(move || {
        // Sequence numbers from 0, one per batch.
        for (seq, batch) in (0u64..).zip(events) {
            let payload = encode_batch(&batch, block_size);
            let mut subs = subscribers.lock().unwrap_or_else(|e| e.into_inner());
            // A subscriber that cannot keep up or left is dropped (it sees a gap if it returns).
            subs.retain_mut(|s| send_message(s, &[b"", &seq.to_be_bytes(), &payload]).is_ok());
        }
    })?;
    tracing::info!("KV events: publishing on tcp://{local}");
    Ok(local)
}

/// ZMTP 3.0 greeting and READY, as the PUB side with NULL security.
fn handshake(stream: &TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut s = stream;
    let mut greeting = [0u8; 64];
    greeting[0] = 0xFF;
    greeting[9] = 0x7F;
    greeting[10] = 3; // version 3.0
    greeting[12..16].copy_from_slice(b"NULL");
    s.write_all(&greeting)?;
    let mut peer = [0u8; 64];
    s.read_exact(&mut peer)?;
    if peer[0] != 0xFF || peer[9] != 0x7F || peer[10] < 3 || &peer[12..16] != b"NULL" {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not a ZMTP 3 peer with NULL security"));
    }
    let mut ready = vec![5u8];
    ready.extend_from_slice(b"READY");
    ready.push(11);
    ready.extend_from_slice(b"Socket-Type");
    ready.extend_from_slice(&3u32.to_be_bytes());
    ready.extend_from_slice(b"PUB");
    write_frame(&mut s, 0x04, &ready)?;
    // The peer's READY command.
    let (flags, _) = read_frame(&mut s)?;
    if flags & 0x04 == 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "expected the peer's READY command"));
    }
    stream.set_read_timeout(None)?;
    Ok(())
}

/// Reads (and ignores) a subscriber's frames until it leaves.
fn drain(mut s: TcpStream) {
    while read_frame(&mut s).is_ok() {}
}

fn read_frame(s: &mut impl Read) -> io::Result<(u8, Vec<u8>)> {
    let mut flags = [0u8; 1];
    s.read_exact(&mut flags)?;
    let len = if flags[0] & 0x02 != 0 {
        let mut b = [0u8; 8];
        s.read_exact(&mut b)?;
        u64::from_be_bytes(b)
    } else {
        let mut b = [0u8; 1];
        s.read_exact(&mut b)?;
        b[0] as u64
    };
    if len > 1 << 20 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "frame too large for a subscription"));
    }
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body)?;
    Ok((flags[0], body))
}

fn write_frame(s: &mut impl Write, flags: u8, body: &[u8]) -> io::Result<()> {
    if body.len() > 255 {
        s.write_all(&[flags | 0x02])?;
        s.write_all(&(body.len() as u64).to_be_bytes())?;
    } else {
        s.write_all(&[flags, body.len() as u8])?;
    }
    s.write_all(body)
}

fn send_message(s: &mut TcpStream, frames: &[&[u8]]) -> io::Result<()> {
    let mut buf = Vec::with_capacity(frames.iter().map(|f| f.len() + 9).sum());
    for (i, f) in frames.iter().enumerate() {
        let more = if i + 1 < frames.len() { 0x01 } else { 0x00 };
        write_frame(&mut buf, more, f)?;
    }
    s.write_all(&buf)
}

/// The engine's u64 hash as a non-negative i64 (routers read signed integers).
fn wire_hash(h: u64) -> u64 {
    h & (i64::MAX as u64)
}

/// `[ts, [events], 0]` in msgpack.
pub fn encode_batch(batch: &[KvEvent], block_size: usize) -> Vec<u8> {
    let mut m = Vec::with_capacity(64 + batch.len() * (40 + 3 * block_size));
    array(&mut m, 3);
    let ts = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    m.push(0xcb);
    m.extend_from_slice(&ts.to_bits().to_be_bytes());
    array(&mut m, batch.len());
    for e in batch {
        match e {
            KvEvent::Stored { hash, parent, tokens } => {
                map(&mut m, 8);
                str(&mut m, "type");
                str(&mut m, "BlockStored");
                str(&mut m, "block_hashes");
                array(&mut m, 1);
                uint(&mut m, wire_hash(*hash));
                str(&mut m, "parent_block_hash");
                match parent {
                    Some(p) => uint(&mut m, wire_hash(*p)),
                    None => m.push(0xc0),
                }
                str(&mut m, "token_ids");
                array(&mut m, tokens.len());
                for &t in tokens {
                    uint(&mut m, t as u64);
                }
                str(&mut m, "block_size");
                uint(&mut m, block_size as u64);
                str(&mut m, "lora_id");
                m.push(0xc0);
                str(&mut m, "lora_name");
                m.push(0xc0);
                str(&mut m, "medium");
                str(&mut m, "GPU");
            }
            KvEvent::Removed { hash } => {
                map(&mut m, 3);
                str(&mut m, "type");
                str(&mut m, "BlockRemoved");
                str(&mut m, "block_hashes");
                array(&mut m, 1);
                uint(&mut m, wire_hash(*hash));
                str(&mut m, "medium");
                str(&mut m, "GPU");
            }
        }
    }
    uint(&mut m, 0);
    m
}

fn array(m: &mut Vec<u8>, n: usize) {
    if n < 16 {
        m.push(0x90 | n as u8);
    } else if n <= 0xffff {
        m.push(0xdc);
        m.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        m.push(0xdd);
        m.extend_from_slice(&(n as u32).to_be_bytes());
    }
}

fn map(m: &mut Vec<u8>, n: usize) {
    debug_assert!(n < 16);
    m.push(0x80 | n as u8);
}

fn str(m: &mut Vec<u8>, s: &str) {
    let n = s.len();
    if n < 32 {
        m.push(0xa0 | n as u8);
    } else {
        m.push(0xd9);
        m.push(n as u8);
    }
    m.extend_from_slice(s.as_bytes());
}

fn uint(m: &mut Vec<u8>, v: u64) {
    if v < 128 {
        m.push(v as u8);
    } else if v <= 0xff {
        m.extend_from_slice(&[0xcc, v as u8]);
    } else if v <= 0xffff {
        m.push(0xcd);
        m.extend_from_slice(&(v as u16).to_be_bytes());
    } else if v <= 0xffff_ffff {
        m.push(0xce);
        m.extend_from_slice(&(v as u32).to_be_bytes());
    } else {
        m.push(0xcf);
        m.extend_from_slice(&v.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_in_msgpack_map_form() {
        let b = encode_batch(
            &[KvEvent::Stored { hash: u64::MAX, parent: None, tokens: vec![1, 300] }, KvEvent::Removed { hash: 5 }],
            2,
        );
        // [ts, [ {8 entries}, {3 entries} ], 0]
        assert_eq!(b[0], 0x93);
        assert_eq!(b[1], 0xcb);
        assert_eq!(b[10], 0x92);
        assert_eq!(b[11], 0x88);
        let tail = &b[11..];
        let find = |pat: &[u8]| tail.windows(pat.len()).position(|w| w == pat);
        assert!(find(b"\xabBlockStored").is_some());
        // The hash cut to 63 bits, as a uint64; the first block has no parent.
        assert!(find(&[0x91, 0xcf, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]).is_some());
        assert!(find(b"\xb1parent_block_hash\xc0").is_some());
        assert!(find(b"\xa9token_ids\x92\x01\xcd\x01\x2c").is_some());
        assert!(find(b"\xacBlockRemoved\xacblock_hashes\x91\x05").is_some());
        assert_eq!(*b.last().unwrap(), 0x00, "data_parallel_rank 0");
    }

    #[test]
    fn a_bad_endpoint_is_an_error_naming_it() {
        let (_tx, rx) = std::sync::mpsc::channel();
        let e = spawn("ipc:///tmp/x", rx, 16).unwrap_err();
        assert!(e.to_string().contains("tcp://HOST:PORT"), "{e}");
    }
}
