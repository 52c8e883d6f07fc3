//! A [`Stream`] as tokio's `AsyncRead` + `AsyncWrite`, for code that speaks a protocol over
//! a tunnel stream itself (the HTTP layer's backend connections) instead of relaying a
//! socket's bytes.
//!
//! The relay does not use this: it moves bytes between a socket and a stream directly. A
//! chunk read is copied once, from the stream's own buffer into the caller's (the stream
//! keeps the chunk until its next read); a write is copied into the adapter's buffer, then
//! sent. Semantics follow the stream's:
//! * the peer's end of stream is EOF; a reset or a cut stream is an error
//!   (`ConnectionReset` / `ConnectionAborted`), never EOF, so a cut response never looks
//!   complete;
//! * `poll_shutdown` finishes our direction (half-close);
//! * dropping the adapter drops the stream: QUIC resets it, TCP closes its channel, and
//!   the peer sees a cut.
//!
//! One write is in flight at a time: `poll_write` copies up to [`WRITE_CHUNK`] bytes, starts
//! sending them and returns; the next write (or flush) waits for that send, which is the
//! backpressure.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::ReusableBoxFuture;

use super::stream::{Chunk, Stream, StreamError, StreamReader, StreamWriter};

/// Most bytes one `poll_write` takes.
pub const WRITE_CHUNK: usize = 64 * 1024;

/// The reader back from a read: `Ok(true)` when it holds a chunk, `Ok(false)` at the end.
type ReadDone = (StreamReader, io::Result<bool>);
type WriteDone = (StreamWriter, Vec<u8>, Result<(), StreamError>);

// The reader lives in the state it is idle in; boxing it would cost an allocation per
// adapter for nothing (the adapter is already per backend connection).
#[allow(clippy::large_enum_variant)]
enum ReadState {
    /// Between reads; the reader's last chunk is handed out from `StreamIo::read_pos`.
    Idle(StreamReader),
    /// A read is in flight in `StreamIo::reading`.
    Busy,
    /// The peer ended its direction.
    Eof,
    /// The stream failed; every later read fails the same way.
    Failed(io::ErrorKind),
}

#[allow(clippy::large_enum_variant)]
enum WriteState {
    Idle(StreamWriter, Vec<u8>),
    /// A send (or the finish, with `finishing`) is in flight in `StreamIo::writing`.
    Busy {
        finishing: bool,
    },
    /// Our direction is finished.
    Finished,
    Failed(io::ErrorKind),
}

/// A tunnel stream as a byte pipe (see the module doc).
pub struct StreamIo {
    read: ReadState,
    /// How much of the reader's last chunk is handed out.
    read_pos: usize,
    reading: Option<ReusableBoxFuture<'static, ReadDone>>,
    write: WriteState,
    writing: Option<ReusableBoxFuture<'static, WriteDone>>,
    /// Counts the bytes each way, when metered.
    meter: Option<crate::metrics::Meter>,
}

impl StreamIo {
    /// Wraps an opened stream.
    pub fn new(stream: Stream) -> StreamIo {
        StreamIo {
            read: ReadState::Idle(stream.reader),
            read_pos: 0,
            reading: None,
            write: WriteState::Idle(stream.writer, Vec::new()),
            writing: None,
            meter: None,
        }
    }

    /// Counts the bytes written (`to_tunnel`) and read (`to_local`) on `meter`.
    pub fn metered(mut self, meter: crate::metrics::Meter) -> StreamIo {
        self.meter = Some(meter);
        self
    }

    fn poll_writer_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            match &self.write {
                WriteState::Idle(..) => return Poll::Ready(Ok(())),
                WriteState::Finished => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        "the tunnel stream was already finished",
                    )));
                }
                WriteState::Failed(kind) => return Poll::Ready(Err((*kind).into())),
                WriteState::Busy { finishing } => {
                    let finishing = *finishing;
                    let Some(future) = self.writing.as_mut() else {
                        self.write = WriteState::Failed(io::ErrorKind::Other);
                        continue;
                    };
                    let (writer, buf, result) = ready!(future.poll(cx));
                    match result {
                        Ok(()) if finishing => {
                            drop(writer);
                            self.write = WriteState::Finished;
                            return Poll::Ready(Ok(()));
                        }
                        Ok(()) => self.write = WriteState::Idle(writer, buf),
                        Err(error) => {
                            let error = io_error(error);
                            self.write = WriteState::Failed(error.kind());
                            return Poll::Ready(Err(error));
                        }
                    }
                }
            }
        }
    }

    fn start_write(&mut self, finishing: bool, bytes: &[u8]) {
        let WriteState::Idle(mut writer, mut buf) =
            std::mem::replace(&mut self.write, WriteState::Busy { finishing })
        else {
            unreachable!("start_write is called only when the writer is idle");
        };
        buf.clear();
        buf.extend_from_slice(bytes);
        let future = async move {
            let result = if finishing {
                writer.finish().await
            } else {
                writer.send(&buf).await
            };
            (writer, buf, result)
        };
        match &mut self.writing {
            Some(slot) => slot.set(future),
            None => self.writing = Some(ReusableBoxFuture::new(future)),
        }
    }
}

/// Reads one chunk, left in the reader ([`StreamReader::last_data`]): `Ok(true)` with data,
/// `Ok(false)` at the peer's end.
async fn read_chunk(reader: &mut StreamReader) -> io::Result<bool> {
    match reader.read().await {
        Ok(Chunk::Data(_)) => Ok(true),
        Ok(Chunk::End) => Ok(false),
        Ok(Chunk::Reset(reason)) => Err(io::Error::new(
            io::ErrorKind::ConnectionReset,
            format!("the tunnel stream was reset: {reason}"),
        )),
        Err(error) => Err(io_error(error)),
    }
}

fn io_error(error: StreamError) -> io::Error {
    match error {
        StreamError::Cut => io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "the tunnel stream was cut (its session ended)",
        ),
        other => io::Error::other(other),
    }
}

impl AsyncRead for StreamIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if let ReadState::Idle(reader) = &this.read
                && let Some(chunk) = reader.last_data().get(this.read_pos..)
                && !chunk.is_empty()
            {
                let n = out.remaining().min(chunk.len());
                out.put_slice(&chunk[..n]);
                this.read_pos += n;
                if let Some(meter) = &this.meter {
                    meter.to_local(n as u64);
                }
                return Poll::Ready(Ok(()));
            }
            match std::mem::replace(&mut this.read, ReadState::Busy) {
                ReadState::Eof => {
                    this.read = ReadState::Eof;
                    return Poll::Ready(Ok(()));
                }
                ReadState::Failed(kind) => {
                    this.read = ReadState::Failed(kind);
                    return Poll::Ready(Err(kind.into()));
                }
                ReadState::Idle(mut reader) => {
                    let future = async move {
                        let result = read_chunk(&mut reader).await;
                        (reader, result)
                    };
                    match &mut this.reading {
                        Some(slot) => slot.set(future),
                        None => this.reading = Some(ReusableBoxFuture::new(future)),
                    }
                }
                ReadState::Busy => {
                    let Some(future) = this.reading.as_mut() else {
                        this.read = ReadState::Failed(io::ErrorKind::Other);
                        continue;
                    };
                    let (reader, result) = match future.poll(cx) {
                        Poll::Ready(done) => done,
                        Poll::Pending => {
                            this.read = ReadState::Busy;
                            return Poll::Pending;
                        }
                    };
                    this.read_pos = 0;
                    match result {
                        Ok(true) => this.read = ReadState::Idle(reader),
                        Ok(false) => this.read = ReadState::Eof,
                        Err(error) => {
                            this.read = ReadState::Failed(error.kind());
                            return Poll::Ready(Err(error));
                        }
                    }
                }
            }
        }
    }
}

impl AsyncWrite for StreamIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_writer_idle(cx))?;
        let n = bytes.len().min(WRITE_CHUNK);
        if n == 0 {
            return Poll::Ready(Ok(0));
        }
        this.start_write(false, &bytes[..n]);
        if let Some(meter) = &this.meter {
            meter.to_tunnel(n as u64);
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match this.write {
            WriteState::Finished => Poll::Ready(Ok(())),
            _ => this.poll_writer_idle(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            match this.write {
                WriteState::Finished => return Poll::Ready(Ok(())),
                WriteState::Idle(..) => this.start_write(true, &[]),
                _ => ready!(this.poll_writer_idle(cx))?,
            }
        }
    }
}
