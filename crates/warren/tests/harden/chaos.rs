//! A userspace chaos relay: sits between the client and the server on loopback and, per
//! TCP connection and direction, delays and coalesces chunks, flips one byte at a chosen
//! offset, or cuts every connection (with a reset) on command.
//!
//! TCP segments cannot be reordered inside a byte stream, so "reorder" here means holding
//! chunks back for random delays and releasing them coalesced or split at other
//! boundaries. The relay keeps listening after a cut, so the client can reconnect.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Which way bytes travel through the relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Client to server.
    Up,
    /// Server to client.
    Down,
}

/// What the relay does to the bytes.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Each chunk waits a random 0..=`max_delay` before it is forwarded (order kept).
    pub max_delay: Duration,
    /// Chunks are re-split into random pieces of at most this many bytes (0: unchanged).
    pub max_piece: usize,
    /// Flip one byte (XOR 0x01) at this offset of the first connection in this direction
    /// that carries that many bytes (once per relay).
    pub flip: Option<(Dir, u64)>,
}

/// A running relay. Dropping it stops it and resets its connections.
pub struct ChaosRelay {
    addr: SocketAddr,
    stop: CancellationToken,
    /// Cancelled and replaced by [`ChaosRelay::cut`].
    generation: Arc<std::sync::Mutex<CancellationToken>>,
    flipped: Arc<AtomicBool>,
    connections: Arc<AtomicU64>,
}

impl ChaosRelay {
    /// Starts a relay on 127.0.0.1 (port 0) towards `target`.
    pub async fn start(target: SocketAddr, plan: Plan) -> ChaosRelay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = listener.local_addr().expect("relay addr");
        let stop = CancellationToken::new();
        let generation = Arc::new(std::sync::Mutex::new(CancellationToken::new()));
        let flipped = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(AtomicU64::new(0));
        let plan = Arc::new(plan);
        {
            let stop = stop.clone();
            let generation = Arc::clone(&generation);
            let flipped = Arc::clone(&flipped);
            let connections = Arc::clone(&connections);
            tokio::spawn(async move {
                loop {
                    let accepted = tokio::select! {
                        () = stop.cancelled() => return,
                        accepted = listener.accept() => accepted,
                    };
                    let Ok((inbound, _)) = accepted else { continue };
                    connections.fetch_add(1, Ordering::Relaxed);
                    let cut = generation.lock().expect("lock").clone();
                    let (stop, plan, flipped) =
                        (stop.clone(), Arc::clone(&plan), Arc::clone(&flipped));
                    tokio::spawn(async move {
                        let Ok(outbound) = TcpStream::connect(target).await else {
                            reset(inbound);
                            return;
                        };
                        relay_pair(inbound, outbound, plan, flipped, cut, stop).await;
                    });
                }
            });
        }
        ChaosRelay {
            addr,
            stop,
            generation,
            flipped,
            connections,
        }
    }

    /// Where the client should connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Resets every connection open now (both sides); new ones are relayed again.
    pub fn cut(&self) {
        let mut current = self.generation.lock().expect("lock");
        current.cancel();
        *current = CancellationToken::new();
    }

    /// Whether the planned flip happened.
    pub fn flipped(&self) -> bool {
        self.flipped.load(Ordering::SeqCst)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }
}

impl Drop for ChaosRelay {
    fn drop(&mut self) {
        self.stop.cancel();
        self.cut();
    }
}

fn reset(stream: TcpStream) {
    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    drop(stream);
}

async fn relay_pair(
    mut inbound: TcpStream,
    mut outbound: TcpStream,
    plan: Arc<Plan>,
    flipped: Arc<AtomicBool>,
    cut: CancellationToken,
    stop: CancellationToken,
) {
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let cut_short = {
        let (in_r, in_w) = inbound.split();
        let (out_r, out_w) = outbound.split();
        let up = pump(in_r, out_w, Dir::Up, &plan, &flipped);
        let down = pump(out_r, in_w, Dir::Down, &plan, &flipped);
        // A pump that reaches EOF half-closes its writer, so a FIN passes through; the pair
        // ends when both did. An error on one side resets both, as a broken path would.
        tokio::select! {
            (a, b) = async { tokio::join!(up, down) } => !(a && b),
            () = cut.cancelled() => true,
            () = stop.cancelled() => true,
        }
    };
    if cut_short {
        reset(inbound);
        reset(outbound);
    }
}

/// Copies `from` to `to` under the plan; `true` when `from` reached EOF and the FIN was
/// forwarded, `false` on an error.
async fn pump(
    mut from: tokio::net::tcp::ReadHalf<'_>,
    mut to: tokio::net::tcp::WriteHalf<'_>,
    dir: Dir,
    plan: &Plan,
    flipped: &AtomicBool,
) -> bool {
    let mut buf = vec![0u8; 64 * 1024];
    let mut offset: u64 = 0;
    loop {
        let Ok(n) = from.read(&mut buf).await else {
            return false;
        };
        if n == 0 {
            return to.shutdown().await.is_ok();
        }
        let chunk = &mut buf[..n];
        if let Some((flip_dir, at)) = plan.flip
            && flip_dir == dir
            && at >= offset
            && at < offset + n as u64
            && !flipped.swap(true, Ordering::SeqCst)
        {
            chunk[(at - offset) as usize] ^= 0x01;
        }
        offset += n as u64;
        let mut rest: &[u8] = chunk;
        while !rest.is_empty() {
            let (piece_len, delay) = {
                let mut rng = rand::rng();
                let piece = if plan.max_piece == 0 {
                    rest.len()
                } else {
                    rng.random_range(1..=plan.max_piece.min(rest.len()))
                };
                let delay = if plan.max_delay.is_zero() {
                    Duration::ZERO
                } else {
                    plan.max_delay.mul_f64(rng.random::<f64>())
                };
                (piece, delay)
            };
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if to.write_all(&rest[..piece_len]).await.is_err() {
                return false;
            }
            rest = &rest[piece_len..];
        }
    }
}
