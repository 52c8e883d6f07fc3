//! Zero-copy relaying for plaintext channels (Linux `splice`).
//!
//! With the `none` cipher a record's payload needs no processing, so it need not enter this
//! process at all: the payload moves socket → pipe → socket inside the kernel, and only the
//! 4-byte record header is written or read here. That saves the two copies a read/write
//! relay makes per byte. Hand-written because it is the plaintext fast path; the pipes come
//! from a small pool and are held only while bytes flow, like the record buffers.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Mutex, PoisonError};

use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags, fcntl, splice};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Pipes kept for reuse, process-wide.
const POOL_CAP: usize = 64;
/// Pipe capacity asked for: one full record fits, so a fill never blocks on the pipe.
const PIPE_SIZE: i32 = 256 * 1024;

static PIPES: Mutex<Vec<Pipe>> = Mutex::new(Vec::new());

/// A kernel pipe used as the zero-copy buffer between two sockets. Always empty when it is
/// not inside one of the functions below.
pub struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    /// A pipe from the pool, or a new one.
    ///
    /// # Errors
    /// `pipe2` failures (e.g. out of file descriptors).
    pub fn take() -> io::Result<Pipe> {
        if let Some(pipe) = PIPES.lock().unwrap_or_else(PoisonError::into_inner).pop() {
            return Ok(pipe);
        }
        let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
        // Best effort: a smaller pipe only means more, shorter splices.
        let _ = fcntl(&write, FcntlArg::F_SETPIPE_SZ(PIPE_SIZE));
        Ok(Pipe { read, write })
    }

    /// Returns an empty pipe to the pool.
    pub fn give(self) {
        let mut pool = PIPES.lock().unwrap_or_else(PoisonError::into_inner);
        if pool.len() < POOL_CAP {
            pool.push(self);
        }
    }
}

fn flags() -> SpliceFFlags {
    SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK
}

/// Moves up to `max` bytes that `src` has now into the (empty) pipe; 0 at EOF,
/// `WouldBlock` when `src` has nothing yet.
///
/// # Errors
/// Socket errors and `WouldBlock`.
pub fn try_fill(pipe: &Pipe, src: &TcpStream, max: usize) -> io::Result<usize> {
    src.try_io(Interest::READABLE, || {
        splice(src.as_fd(), None, pipe.write.as_fd(), None, max, flags()).map_err(io::Error::from)
    })
}

/// Like [`try_fill`], waiting for `src` to be readable.
///
/// # Errors
/// Socket errors.
pub async fn fill(pipe: &Pipe, src: &TcpStream, max: usize) -> io::Result<usize> {
    loop {
        src.readable().await?;
        match try_fill(pipe, src, max) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

/// Moves exactly `len` bytes from `src` into the pipe (the payload of one record).
///
/// # Errors
/// Socket errors; `UnexpectedEof` if `src` ends first.
pub async fn fill_exact(pipe: &Pipe, src: &TcpStream, mut len: usize) -> io::Result<()> {
    while len > 0 {
        match fill(pipe, src, len).await? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => len -= n,
        }
    }
    Ok(())
}

/// Moves `len` bytes, all the pipe holds, into `dst`, waiting for `dst` to be writable.
///
/// # Errors
/// Socket errors.
pub async fn drain(pipe: &Pipe, dst: &TcpStream, mut len: usize) -> io::Result<()> {
    while len > 0 {
        dst.writable().await?;
        match dst.try_io(Interest::WRITABLE, || {
            splice(pipe.read.as_fd(), None, dst.as_fd(), None, len, flags())
                .map_err(io::Error::from)
        }) {
            Ok(n) => len -= n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes a record header that the payload spliced next will follow: `MSG_MORE` lets the
/// kernel put both into the same segments.
///
/// # Errors
/// Socket errors.
pub async fn send_header(dst: &TcpStream, header: &[u8]) -> io::Result<()> {
    let mut sent = 0;
    while sent < header.len() {
        dst.writable().await?;
        match dst.try_io(Interest::WRITABLE, || {
            socket2::SockRef::from(dst).send_with_flags(
                &header[sent..],
                nix::libc::MSG_MORE | nix::libc::MSG_NOSIGNAL,
            )
        }) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
