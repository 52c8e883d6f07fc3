//! WebSocket frames as the `ws`/`wss` transports read them (`transport::ws`): arbitrary
//! bytes from the peer, delivered in arbitrary chunk sizes, read by both roles into buffers
//! of arbitrary sizes. Invariants: no panic, and the reader ends (EOF or an error) within a
//! bounded number of reads, however the bytes are cut.
#![no_main]

use std::io;
use std::task::{Context, Poll};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use warren::transport::wire::Source;
use warren::transport::ws::{self, Role};

#[derive(Debug, Arbitrary)]
struct Input {
    server: bool,
    /// Bytes per read of the underlying stream (1..=256).
    chunk: u8,
    /// The reader's buffer size (1..=4096).
    buf: u16,
    bytes: Vec<u8>,
}

/// The peer's bytes, handed out `chunk` at a time.
struct Peer {
    bytes: Vec<u8>,
    at: usize,
    chunk: usize,
}

impl Source for Peer {
    fn poll_read_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.chunk).min(self.bytes.len() - self.at);
        buf[..n].copy_from_slice(&self.bytes[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

fuzz_target!(|input: Input| {
    let role = if input.server {
        Role::Server
    } else {
        Role::Client
    };
    let peer = Peer {
        chunk: usize::from(input.chunk).max(1),
        at: 0,
        bytes: input.bytes,
    };
    // Every read either moves at least one byte of the peer's stream or ends the loop.
    let max_reads = peer.bytes.len() + 2;
    let (mut reader, _writer) = ws::framed(peer, tokio::io::sink(), role);
    let mut buf = vec![0u8; usize::from(input.buf).clamp(1, 4096)];
    for _ in 0..max_reads {
        match reader.try_read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => assert!(n <= buf.len()),
        }
    }
    panic!("the reader neither ended nor failed after {max_reads} reads");
});
