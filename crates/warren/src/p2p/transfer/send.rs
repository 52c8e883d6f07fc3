//! The sending side: offer the manifest, stream what the receiver asked for on one data
//! stream, answer re-requests, and finish when the receiver has everything.
//!
//! Files go back to back in manifest order, one frame per 1 MiB chunk (a small file is
//! one frame), each chunk hashed with BLAKE3 right after it is read, so a file that
//! changes on disk mid-transfer is caught by the receiver's check rather than trusted.
//! Reads are positioned (`pread`), one chunk at a time, through
//! `on_disk` (`block_in_place`).
//!
//! The receiver's control messages (FileDone, Resend, Done, Cancel) are read by a task of
//! this transfer into a bounded queue, drained between frames; re-requested chunks go out
//! ahead of the rest.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;

use bytes::{Bytes, BytesMut};
use quinn::{RecvStream, SendStream};
use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;
use warren_proto::files::chunk::{CHUNK_SIZE, MAX_HEADER_LEN, chunk_count, chunk_len};
use warren_proto::files::control::PROTOCOL_VERSION;
use warren_proto::files::{ChunkHeader, ControlMessage, EntryKind, Need};

use super::error::TransferError;
use super::events::{Event, Events};
use super::sources::Sources;
use super::stream::{self, timed};
use super::{Summary, on_disk};

/// How long the receiver may take to say hello.
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the receiver's user may take to accept.
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(600);
/// How long the receiver may stay silent once all data went out.
const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long to wait for the receiver to close after Done.
pub(crate) const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);
/// Cap on one control read in the reader task: liveness comes from QUIC's idle timeout
/// (a dead peer ends the connection); this only guarantees the task ends.
const CONTROL_READ_LIMIT: Duration = Duration::from_secs(24 * 3600);
/// Control messages read ahead of the writer.
const CONTROL_QUEUE: usize = 64;
/// Re-requested chunks waiting to go out.
const MAX_PENDING_RESENDS: usize = 256;

/// Sends `sources` over `connection` to one receiver (either peer may have dialled).
///
/// # Errors
///
/// [`TransferError`]: the receiver declined or refused, the connection failed, a file
/// could not be read. The receiver is told why (a Cancel) before this returns.
pub async fn send(
    connection: &quinn::Connection,
    sources: &Sources,
    events: &Events,
) -> Result<Summary, TransferError> {
    let mut control = None;
    let result = run(connection, sources, events, &mut control).await;
    stream::conclude(connection, control.as_mut(), events, result).await
}

/// What the sender keeps about one file the receiver needs.
struct Wanted {
    size: u64,
    acked: bool,
}

/// The sender's running state.
struct State<'a> {
    sources: &'a Sources,
    events: &'a Events,
    wanted: HashMap<u32, Wanted>,
    resends: VecDeque<(u32, u64)>,
    acked: usize,
    files_done: usize,
    resumed_bytes: u64,
    sent_bytes: u64,
    resent_chunks: u64,
    done: bool,
}

async fn run(
    connection: &quinn::Connection,
    sources: &Sources,
    events: &Events,
    control: &mut Option<SendStream>,
) -> Result<Summary, TransferError> {
    let started = Instant::now();
    let manifest = sources.manifest();
    let (ctl, mut recv) = open_control(connection, control).await?;
    stream::write_message(
        ctl,
        &ControlMessage::Manifest(manifest.clone()),
        "offering the files",
    )
    .await?;
    expect_hello(&mut recv, "waiting for the receiver's hello").await?;
    let needs = match stream::read_message(
        &mut recv,
        ACCEPT_TIMEOUT,
        "waiting for the receiver to accept",
    )
    .await?
    {
        Some(ControlMessage::Accept(needs)) => needs,
        other => return Err(unexpected(other, "an accept")),
    };
    let mut state = State::new(sources, events, &needs)?;
    events
        .emit(Event::Started {
            files: manifest.file_count(),
            bytes: manifest.total_size(),
            resumed_bytes: state.resumed_bytes,
        })
        .await;

    let (queue, mut incoming) = mpsc::channel(CONTROL_QUEUE);
    let _reader = AbortOnDropHandle::new(tokio::spawn(read_control(recv, queue)));

    let mut data = timed(HELLO_TIMEOUT, "opening the data stream", async {
        connection
            .open_uni()
            .await
            .map_err(|e| TransferError::Lost {
                during: "opening the data stream",
                reason: e.to_string(),
            })
    })
    .await?;
    let mut frame = Frame::new();
    for need in &needs {
        let path = sources.path(need.file_id).ok_or_else(|| {
            TransferError::Protocol(format!("file {} is not a file", need.file_id))
        })?;
        let file = File::open(path).map_err(|source| TransferError::Read {
            path: path.to_owned(),
            source,
        })?;
        let size = state.wanted[&need.file_id].size;
        for index in need.chunks.iter().flat_map(|range| range.clone()) {
            state.sent_bytes += frame
                .send(&mut data, &file, path, need.file_id, size, index)
                .await?;
            state
                .events
                .progress(state.resumed_bytes + state.sent_bytes, state.files_done);
            while let Ok(message) = incoming.try_recv() {
                state.handle(message?).await?;
            }
            state.serve_resends(&mut data, &mut frame).await?;
        }
    }
    while !state.done {
        state.serve_resends(&mut data, &mut frame).await?;
        if state.done {
            break;
        }
        let message = timed(IDLE_TIMEOUT, "waiting for the receiver to finish", async {
            incoming.recv().await.ok_or_else(|| TransferError::Lost {
                during: "waiting for the receiver to finish",
                reason: "the receiver's control stream ended early".into(),
            })
        })
        .await??;
        state.handle(message).await?;
    }
    let _ = data.finish();
    stream::finish_and_wait_close(connection, ctl, CLOSE_TIMEOUT).await;
    Ok(Summary {
        files: manifest.file_count(),
        bytes: manifest.total_size(),
        sent_bytes: state.sent_bytes,
        resumed_bytes: state.resumed_bytes,
        resent_chunks: state.resent_chunks,
        elapsed: started.elapsed(),
        text: None,
    })
}

/// The sender's start: opens the control stream (kept in `control`, so a failure can
/// still tell the peer) and says hello.
pub(crate) async fn open_control<'a>(
    connection: &quinn::Connection,
    control: &'a mut Option<SendStream>,
) -> Result<(&'a mut SendStream, RecvStream), TransferError> {
    let (send, recv) = timed(HELLO_TIMEOUT, "opening the control stream", async {
        connection.open_bi().await.map_err(|e| TransferError::Lost {
            during: "opening the control stream",
            reason: e.to_string(),
        })
    })
    .await?;
    let ctl = control.insert(send);
    say_hello(ctl).await?;
    Ok((ctl, recv))
}

/// Sends our hello: the versions we speak.
pub(crate) async fn say_hello(ctl: &mut SendStream) -> Result<(), TransferError> {
    let hello = ControlMessage::Hello {
        min: PROTOCOL_VERSION,
        max: PROTOCOL_VERSION,
    };
    stream::write_message(ctl, &hello, "saying hello").await
}

/// Reads the peer's hello and checks its versions against ours.
pub(crate) async fn expect_hello(
    recv: &mut RecvStream,
    during: &'static str,
) -> Result<(), TransferError> {
    match stream::read_message(recv, HELLO_TIMEOUT, during).await? {
        Some(ControlMessage::Hello { min, max }) => negotiate(min, max),
        other => Err(unexpected(other, "a hello")),
    }
}

/// Checks the peer's version range against ours.
pub(crate) fn negotiate(min: u8, max: u8) -> Result<(), TransferError> {
    if (min..=max).contains(&PROTOCOL_VERSION) {
        Ok(())
    } else {
        Err(TransferError::Incompatible {
            min,
            max,
            ours: PROTOCOL_VERSION,
        })
    }
}

/// The error for a control message other than the one expected (a Cancel is the peer's).
pub(crate) fn unexpected(message: Option<ControlMessage>, wanted: &str) -> TransferError {
    match message {
        Some(ControlMessage::Cancel { reason, detail }) => stream::cancelled(reason, &detail),
        None => TransferError::Lost {
            during: "waiting for the peer",
            reason: format!("the control stream ended where {wanted} was expected"),
        },
        Some(_) => TransferError::Protocol(format!("expected {wanted}, got another message")),
    }
}

/// Reads the receiver's control messages into `queue` until the stream ends or fails.
async fn read_control(
    mut recv: RecvStream,
    queue: mpsc::Sender<Result<ControlMessage, TransferError>>,
) {
    loop {
        let read = stream::read_message(
            &mut recv,
            CONTROL_READ_LIMIT,
            "reading the receiver's messages",
        )
        .await;
        let stop = !matches!(read, Ok(Some(_)));
        let item = match read {
            Ok(Some(message)) => Ok(message),
            Ok(None) => return,
            Err(e) => Err(e),
        };
        if queue.send(item).await.is_err() || stop {
            return;
        }
    }
}

impl<'a> State<'a> {
    /// Checks the receiver's Accept against the manifest.
    fn new(
        sources: &'a Sources,
        events: &'a Events,
        needs: &[Need],
    ) -> Result<State<'a>, TransferError> {
        let manifest = sources.manifest();
        let mut wanted = HashMap::with_capacity(needs.len());
        let mut need_bytes: u64 = 0;
        for need in needs {
            let entry = manifest
                .entry(need.file_id)
                .filter(|e| e.kind == EntryKind::File)
                .ok_or_else(|| {
                    TransferError::Protocol(format!(
                        "the receiver asked for file {}, which is not a file in the offer",
                        need.file_id
                    ))
                })?;
            for range in &need.chunks {
                if range.end > chunk_count(entry.size) {
                    return Err(TransferError::Protocol(format!(
                        "the receiver asked for chunks {range:?} of a file of {} bytes",
                        entry.size
                    )));
                }
                let end = range.end.saturating_mul(CHUNK_SIZE).min(entry.size);
                need_bytes += end - range.start * CHUNK_SIZE;
            }
            wanted.insert(
                need.file_id,
                Wanted {
                    size: entry.size,
                    acked: false,
                },
            );
        }
        Ok(State {
            sources,
            events,
            resends: VecDeque::new(),
            acked: 0,
            files_done: manifest.file_count() - wanted.len(),
            resumed_bytes: manifest.total_size() - need_bytes,
            sent_bytes: 0,
            resent_chunks: 0,
            done: false,
            wanted,
        })
    }

    async fn handle(&mut self, message: ControlMessage) -> Result<(), TransferError> {
        match message {
            ControlMessage::FileDone { file_id } => {
                let wanted = self
                    .wanted
                    .get_mut(&file_id)
                    .filter(|w| !w.acked)
                    .ok_or_else(|| {
                        TransferError::Protocol(format!(
                            "the receiver reported file {file_id} done, which it did not ask for"
                        ))
                    })?;
                wanted.acked = true;
                self.acked += 1;
                self.files_done += 1;
                let name = self
                    .sources
                    .manifest()
                    .entry(file_id)
                    .map(|e| e.name.escaped())
                    .unwrap_or_default();
                self.events.emit(Event::FileDone { file_id, name }).await;
            }
            ControlMessage::Resend { file_id, index } => {
                let known = self
                    .wanted
                    .get(&file_id)
                    .is_some_and(|w| !w.acked && index < chunk_count(w.size));
                if !known || self.resends.len() >= MAX_PENDING_RESENDS {
                    return Err(TransferError::Protocol(format!(
                        "the receiver asked again for chunk {index} of file {file_id}, which it cannot need"
                    )));
                }
                self.resends.push_back((file_id, index));
            }
            ControlMessage::Done if self.acked == self.wanted.len() => self.done = true,
            ControlMessage::Done => {
                return Err(TransferError::Protocol(
                    "the receiver said it was done before every file was".into(),
                ));
            }
            other => return Err(unexpected(Some(other), "a file done, resend or done")),
        }
        Ok(())
    }

    async fn serve_resends(
        &mut self,
        data: &mut SendStream,
        frame: &mut Frame,
    ) -> Result<(), TransferError> {
        while let Some((file_id, index)) = self.resends.pop_front() {
            let path = self
                .sources
                .path(file_id)
                .ok_or_else(|| TransferError::Protocol(format!("file {file_id} is not a file")))?;
            let file = File::open(path).map_err(|source| TransferError::Read {
                path: path.to_owned(),
                source,
            })?;
            let size = self.wanted[&file_id].size;
            self.sent_bytes += frame.send(data, &file, path, file_id, size, index).await?;
            self.resent_chunks += 1;
        }
        Ok(())
    }
}

/// Payload buffers watched for reuse at once: enough for the chunks quinn holds until the
/// peer acknowledges them (its send window, tens of MiB).
const RECYCLED: usize = 64;

/// The buffers of one frame. Each payload is handed to quinn whole (`write_chunks`), which
/// keeps it until the peer acknowledges it, instead of quinn copying it out of a buffer of
/// ours (a tenth of the sender's CPU); once quinn has dropped it, it is read into again, so
/// chunks land in memory already mapped and initialised (a fresh 1 MiB buffer costs its
/// zeroing and page faults, another tenth).
struct Frame {
    header: Vec<u8>,
    /// Payloads handed to quinn, oldest first (a clone of each: unique once quinn is done).
    in_flight: VecDeque<Bytes>,
}

impl Frame {
    fn new() -> Frame {
        Frame {
            header: Vec::with_capacity(MAX_HEADER_LEN),
            in_flight: VecDeque::with_capacity(RECYCLED),
        }
    }

    /// A buffer of `len` bytes to read a chunk into: the oldest payload quinn is done
    /// with, or a new one.
    fn payload_buffer(&mut self, len: usize) -> BytesMut {
        if self.in_flight.front().is_some_and(Bytes::is_unique)
            && let Some(done) = self.in_flight.pop_front()
            && let Ok(mut buffer) = done.try_into_mut()
        {
            // Only a longer chunk than the buffer held writes zeroes (past its end).
            buffer.resize(len, 0);
            return buffer;
        }
        BytesMut::zeroed(len)
    }

    /// Remembers a payload handed to quinn, to read into again once quinn drops it.
    fn sent(&mut self, payload: &Bytes) {
        if self.in_flight.len() == RECYCLED {
            self.in_flight.pop_front();
        }
        self.in_flight.push_back(payload.clone());
    }

    /// Reads chunk `index` of `file`, hashes it and writes the frame; returns the payload
    /// length.
    async fn send(
        &mut self,
        data: &mut SendStream,
        file: &File,
        path: &Path,
        file_id: u32,
        size: u64,
        index: u64,
    ) -> Result<u64, TransferError> {
        // The Accept was checked against the manifest, so the chunk exists.
        let len = chunk_len(size, index)
            .ok_or_else(|| TransferError::Protocol(format!("chunk {index} is past the end")))?;
        let offset = index * CHUNK_SIZE;
        // At most CHUNK_SIZE (1 MiB).
        let mut payload = self.payload_buffer(len as usize);
        on_disk(|| file.read_exact_at(&mut payload, offset)).map_err(|source| {
            if source.kind() == std::io::ErrorKind::UnexpectedEof {
                TransferError::Changed {
                    path: path.to_owned(),
                }
            } else {
                TransferError::Read {
                    path: path.to_owned(),
                    source,
                }
            }
        })?;
        let header = ChunkHeader {
            file_id,
            offset,
            // At most CHUNK_SIZE.
            len: len as u32,
            hash: *blake3::hash(&payload).as_bytes(),
        };
        self.header.clear();
        header.encode(&mut self.header);
        let payload = payload.freeze();
        self.sent(&payload);
        let mut chunks = [Bytes::copy_from_slice(&self.header), payload];
        stream::write_chunks(data, &mut chunks, "sending data").await?;
        Ok(len)
    }
}
