//! A small process-wide pool of record buffers.
//!
//! Channels hold a buffer only while bytes flow and hand it back the moment their socket has
//! nothing more to read, so an idle connection holds no buffer at all (that is where memory
//! per connection is won). The pool makes that cheap on busy streams: taking a buffer back is
//! a mutex round trip, not an allocation and a 128 KiB memset. It keeps at most
//! `POOL_CAP` buffers of each kind; more are freed.

use std::sync::{Mutex, PoisonError};

use crate::crypto::record::MAX_RECORD_LEN;

/// Buffers of each kind kept for reuse (at most ~12 MiB in all).
const POOL_CAP: usize = 64;

/// Length of a read buffer: two full records, so one `read` can drain a lot.
pub const READ_BUF_LEN: usize = 2 * MAX_RECORD_LEN;

static READ_BUFFERS: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
static WRITE_BUFFERS: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// A zero-initialised read buffer of [`READ_BUF_LEN`] bytes (contents unspecified).
pub fn take_read() -> Vec<u8> {
    let reused = READ_BUFFERS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .pop();
    reused.unwrap_or_else(|| vec![0u8; READ_BUF_LEN])
}

/// Returns a read buffer to the pool.
pub fn give_read(buf: Vec<u8>) {
    if buf.len() == READ_BUF_LEN {
        give(&READ_BUFFERS, buf);
    }
}

/// An empty write buffer with capacity for one full record.
pub fn take_write() -> Vec<u8> {
    let reused = WRITE_BUFFERS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .pop();
    reused.unwrap_or_else(|| Vec::with_capacity(MAX_RECORD_LEN))
}

/// Returns a write buffer to the pool.
pub fn give_write(mut buf: Vec<u8>) {
    if buf.capacity() >= MAX_RECORD_LEN {
        buf.clear();
        give(&WRITE_BUFFERS, buf);
    }
}

fn give(pool: &Mutex<Vec<Vec<u8>>>, buf: Vec<u8>) {
    let mut pool = pool.lock().unwrap_or_else(PoisonError::into_inner);
    if pool.len() < POOL_CAP {
        pool.push(buf);
    }
}
