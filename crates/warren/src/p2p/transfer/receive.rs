//! The receiving side: check the whole offer before accepting anything, ask the user,
//! then write what arrives beneath the output folder, verified chunk by chunk.
//!
//! Order of events, and why:
//! 1. The manifest is decoded (every name checked by [`SafeName`](warren_proto::files::SafeName),
//!    the set rules, the bounds) and every entry is run through
//!    [`OutputDir::preflight`]: a hostile or clashing offer is refused before anything
//!    is created, and the sender is told why.
//! 2. The caller's `confirm` sees an [`Offer`] (counts, total size, escaped top-level
//!    names) and says yes or no.
//! 3. Folders are created; empty files are created at once; the partial file and resume
//!    sidecar of each file a past run began are checked ([`resume::prepare`]), and the
//!    Accept lists, per file, the chunks still missing. A file already complete from a
//!    past run ([`Target::Same`]) is skipped. Other files are created when their first
//!    chunk arrives.
//! 4. Frames are checked against the manifest (the right file, exactly one wanted chunk)
//!    and against their BLAKE3 hash while they are written; a damaged chunk is not
//!    written and is asked for again (Resend), up to [`MAX_BAD_PER_CHUNK`] times. The
//!    sidecar records a chunk only after its data is written.
//! 5. A complete file is flushed and renamed into place ([`PartFile::finish`], never over
//!    an existing file unless asked) on the blocking pool while the next files arrive,
//!    and reported (FileDone) once that is done; after the last one, Done.
//!
//! Disk work (writes, re-hashing partial files) runs through `on_disk` (`block_in_place`),
//! so the runtime moves its other tasks elsewhere meanwhile. Finishing runs beside the
//! writes because each file's `fdatasync` waits for the disk (~0.7 ms here, 0.7 s for a
//! tree of 1000 files if done in line) and several in flight share one journal commit.
//! At most [`MAX_OPEN_FILES`] partial files are open at once, and at most
//! [`MAX_FINISHING`] are being finished.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;

use quinn::SendStream;
use warren_proto::files::chunk::{CHUNK_SIZE, chunk_count};
use warren_proto::files::{ControlError, ControlMessage, Entry, EntryKind, Manifest, Need};

use super::error::TransferError;
use super::events::{Event, Events};
use super::send::{CLOSE_TIMEOUT, HELLO_TIMEOUT, expect_hello, say_hello, unexpected};
use super::stream::{self, timed};
use super::{Summary, on_disk};
use crate::p2p::chunks::FrameCheck;
use crate::p2p::resume::{self, ResumeCheck, Sidecar};
use crate::p2p::write::{OutputDir, PartFile, Target, WriteError, WriteOptions};

/// How long the sender may take to send its offer (a big manifest on a slow path).
const OFFER_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the user may take to confirm.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(600);
/// How long the data stream may stay silent.
const DATA_TIMEOUT: Duration = Duration::from_secs(60);
/// Times one chunk may arrive damaged before the transfer stops.
pub const MAX_BAD_PER_CHUNK: u32 = 3;
/// Partial files open at once (a sender interleaving files cannot exhaust descriptors).
pub const MAX_OPEN_FILES: usize = 64;
/// How many chunks behind the newest one a large file's writeback is started
/// ([`PartFile::start_writeback`]): far enough that the chunk is written whole, near enough
/// that little is left for the final flush.
const WRITEBACK_LAG: u64 = 8;
/// Complete files being flushed and renamed at once (each holds a descriptor and, while
/// it runs, a thread of the blocking pool).
pub const MAX_FINISHING: usize = 16;

/// How the receiver writes and resumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiveOptions {
    /// Overwrite and flush policy.
    pub write: WriteOptions,
    /// How much of a partial file is re-hashed before it is trusted. The default,
    /// [`ResumeCheck::Everything`], reads each partial file once and finds damage
    /// anywhere in it.
    pub resume_check: ResumeCheck,
}

impl Default for ReceiveOptions {
    fn default() -> Self {
        ReceiveOptions {
            write: WriteOptions::default(),
            resume_check: ResumeCheck::Everything,
        }
    }
}

/// What the sender offers, for the user to confirm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    /// Files.
    pub files: usize,
    /// Folders.
    pub folders: usize,
    /// Bytes in the files.
    pub bytes: u64,
    /// Top-level names, escaped for a terminal.
    pub top_level: Vec<String>,
    /// Files that will replace an existing file (only with overwrite on).
    pub replaces: usize,
    /// Files already complete from a past run, which will be skipped.
    pub complete: usize,
}

/// Receives one transfer over `connection` into `out_dir` (either peer may have dialled).
/// `confirm` is asked once the offer has been checked; `false` declines.
///
/// # Errors
///
/// [`TransferError`]: an unsafe or clashing offer ([`TransferError::Manifest`],
/// [`TransferError::Preflight`], nothing written), declined, a lost connection (partial
/// files stay for a resume), a write failure. The sender is told why.
pub async fn receive<F, Fut>(
    connection: &quinn::Connection,
    out_dir: &Path,
    options: ReceiveOptions,
    confirm: F,
    events: &Events,
) -> Result<Summary, TransferError>
where
    F: FnOnce(Offer) -> Fut,
    Fut: Future<Output = bool>,
{
    let mut control = None;
    let result = run(connection, out_dir, options, confirm, events, &mut control).await;
    stream::conclude(connection, control.as_mut(), events, result).await
}

async fn run<F, Fut>(
    connection: &quinn::Connection,
    out_dir: &Path,
    options: ReceiveOptions,
    confirm: F,
    events: &Events,
    control: &mut Option<SendStream>,
) -> Result<Summary, TransferError>
where
    F: FnOnce(Offer) -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    let (send, mut recv) = timed(HELLO_TIMEOUT, "waiting for the sender", async {
        connection
            .accept_bi()
            .await
            .map_err(|e| TransferError::Lost {
                during: "waiting for the sender",
                reason: e.to_string(),
            })
    })
    .await?;
    let ctl = control.insert(send);
    say_hello(ctl).await?;
    expect_hello(&mut recv, "waiting for the sender's hello").await?;
    let manifest =
        match stream::read_message(&mut recv, OFFER_TIMEOUT, "receiving the file list").await {
            Ok(Some(ControlMessage::Manifest(manifest))) => manifest,
            Ok(Some(ControlMessage::Text(text))) => {
                return super::text::received(connection, ctl, &mut recv, text, started).await;
            }
            Err(TransferError::Control(ControlError::Manifest(e))) => {
                return Err(TransferError::Manifest(e));
            }
            Ok(other) => return Err(unexpected(other, "the file list")),
            Err(e) => return Err(e),
        };

    // Nothing is created before this check passes and the user says yes.
    let mut out = OutputDir::open(out_dir, options.write).map_err(TransferError::Preflight)?;
    let targets = on_disk(|| {
        manifest
            .entries()
            .iter()
            .map(|entry| out.preflight(entry))
            .collect::<Result<Vec<Target>, WriteError>>()
    })
    .map_err(TransferError::Preflight)?;
    let offer = Offer {
        files: manifest.file_count(),
        folders: manifest.entries().len() - manifest.file_count(),
        bytes: manifest.total_size(),
        top_level: manifest
            .top_level()
            .into_iter()
            .map(warren_proto::files::escape_for_terminal)
            .collect(),
        replaces: targets.iter().filter(|t| **t == Target::Replaces).count(),
        complete: targets.iter().filter(|t| **t == Target::Same).count(),
    };
    let accepted = tokio::time::timeout(CONFIRM_TIMEOUT, confirm(offer))
        .await
        .map_err(|_| TransferError::Timeout {
            during: "waiting for your confirmation",
            secs: CONFIRM_TIMEOUT.as_secs(),
        })?;
    if !accepted {
        return Err(TransferError::Declined);
    }

    let mut receiver = Receiver::prepare(&mut out, &manifest, &targets, options, events).await?;
    stream::write_message(
        ctl,
        &ControlMessage::Accept(receiver.needs.clone()),
        "accepting",
    )
    .await?;
    events
        .emit(Event::Started {
            files: manifest.file_count(),
            bytes: manifest.total_size(),
            resumed_bytes: receiver.resumed_bytes,
        })
        .await;

    if !receiver.pending.is_empty() {
        let mut data = timed(HELLO_TIMEOUT, "waiting for the data stream", async {
            connection
                .accept_uni()
                .await
                .map_err(|e| TransferError::Lost {
                    during: "waiting for the data stream",
                    reason: e.to_string(),
                })
        })
        .await?;
        let mut payload = Vec::with_capacity(CHUNK_SIZE as usize);
        while !receiver.pending.is_empty() {
            let Some(header) = stream::read_frame_header(&mut data, DATA_TIMEOUT).await? else {
                return Err(TransferError::Lost {
                    during: "receiving data",
                    reason: "the sender ended the data stream before every file arrived".into(),
                });
            };
            let size = receiver.check_frame(&header)?;
            stream::read_payload(&mut data, &mut payload, header.len, DATA_TIMEOUT).await?;
            receiver
                .handle_frame(&mut out, ctl, header, size, &payload)
                .await?;
        }
        receiver.report_finished(ctl, 0).await?;
    }
    stream::write_message(ctl, &ControlMessage::Done, "finishing").await?;
    let _ = ctl.finish();
    // The sender ends its control stream once it has read Done; then this side closes.
    let _ = stream::read_message(&mut recv, CLOSE_TIMEOUT, "finishing").await;
    stream::close_done(connection);
    Ok(Summary {
        files: manifest.file_count(),
        bytes: manifest.total_size(),
        sent_bytes: receiver.received_bytes,
        resumed_bytes: receiver.resumed_bytes,
        resent_chunks: receiver.bad.values().map(|&n| u64::from(n)).sum(),
        elapsed: started.elapsed(),
        text: None,
    })
}

/// A partial file being written.
struct Writing {
    part: PartFile,
    /// `None` for a fresh file of one chunk: it arrives whole or not at all, so there is
    /// nothing to resume, and skipping the sidecar saves a file create, two truncates and
    /// two writes per small file (a crash leaves a partial file with no sidecar, which
    /// the next run starts over, as for any missing sidecar).
    sidecar: Option<Sidecar>,
}

/// The receiver's state once it accepted.
struct Receiver<'a> {
    manifest: &'a Manifest,
    events: &'a Events,
    needs: Vec<Need>,
    /// By file id: the chunks still to arrive (bounded by the manifest's chunk count).
    pending: HashMap<u32, BTreeSet<u64>>,
    open: HashMap<u32, Writing>,
    /// Files with no partial file from a past run, not opened yet.
    fresh: HashSet<u32>,
    /// Damaged arrivals per chunk.
    bad: HashMap<(u32, u64), u32>,
    /// Complete files being flushed and renamed (at most [`MAX_FINISHING`]); each gives
    /// back its file id.
    finishing: JoinSet<Result<u32, WriteError>>,
    resumed_bytes: u64,
    received_bytes: u64,
    files_done: usize,
}

impl<'a> Receiver<'a> {
    /// Creates the folders, opens and checks every partial file, finishes the files that
    /// need no data (empty, or complete on disk), and works out what to ask for.
    async fn prepare(
        out: &mut OutputDir,
        manifest: &'a Manifest,
        targets: &[Target],
        options: ReceiveOptions,
        events: &'a Events,
    ) -> Result<Receiver<'a>, TransferError> {
        let mut receiver = Receiver {
            manifest,
            events,
            needs: Vec::new(),
            pending: HashMap::new(),
            open: HashMap::new(),
            fresh: HashSet::new(),
            bad: HashMap::new(),
            finishing: JoinSet::new(),
            resumed_bytes: 0,
            received_bytes: 0,
            files_done: 0,
        };
        // All the disk work in one blocking section: a tree of 10,000 small files is
        // planned in one hand-over to the runtime, not 10,000 (each `block_in_place`
        // costs tens of microseconds before the first byte can be asked for).
        let plans = on_disk(|| {
            manifest
                .entries()
                .iter()
                .zip(targets)
                .map(|(entry, target)| plan_entry(out, entry, *target, options.resume_check))
                .collect::<Result<Vec<Plan>, TransferError>>()
        })?;
        for (index, (entry, plan)) in manifest.entries().iter().zip(plans).enumerate() {
            // Manifest ids fit u32: at most MAX_ENTRIES entries.
            let file_id = index as u32;
            match plan {
                Plan::Folder => {}
                Plan::Complete { have_bytes } => {
                    receiver.resumed_bytes += have_bytes;
                    receiver.file_done(file_id, entry).await;
                }
                Plan::Need {
                    missing,
                    have_bytes,
                    fresh,
                } => {
                    receiver.resumed_bytes += have_bytes;
                    if fresh {
                        receiver.fresh.insert(file_id);
                    }
                    receiver
                        .pending
                        .insert(file_id, missing.iter().flat_map(|r| r.clone()).collect());
                    receiver.needs.push(Need {
                        file_id,
                        chunks: missing,
                    });
                }
            }
        }
        Ok(receiver)
    }

    /// Checks a frame header against the manifest and what is still wanted; returns the
    /// file's size.
    fn check_frame(&self, header: &warren_proto::files::ChunkHeader) -> Result<u64, TransferError> {
        let entry = self
            .manifest
            .entry(header.file_id)
            .filter(|e| e.kind == EntryKind::File)
            .ok_or_else(|| {
                TransferError::Protocol(format!(
                    "a data frame names file {}, which is not in the offer",
                    header.file_id
                ))
            })?;
        header
            .check(entry.size)
            .map_err(|e| TransferError::Protocol(e.to_string()))?;
        let wanted = self
            .pending
            .get(&header.file_id)
            .is_some_and(|p| p.contains(&header.index()));
        if !wanted {
            return Err(TransferError::Protocol(format!(
                "a data frame brings chunk {} of `{}`, which was not asked for",
                header.index(),
                entry.name.escaped()
            )));
        }
        Ok(entry.size)
    }

    /// Verifies and writes one frame's payload, asks again for a damaged chunk, and
    /// finishes the file when its last chunk is in.
    async fn handle_frame(
        &mut self,
        out: &mut OutputDir,
        ctl: &mut SendStream,
        header: warren_proto::files::ChunkHeader,
        size: u64,
        payload: &[u8],
    ) -> Result<(), TransferError> {
        let (file_id, index) = (header.file_id, header.index());
        // check_frame found the entry.
        let manifest = self.manifest;
        let Some(entry) = manifest.entry(file_id) else {
            return Ok(());
        };
        let mut check = FrameCheck::new(header);
        check.update(payload);
        let Ok(hash) = check.finish() else {
            let times = self.bad.entry((file_id, index)).or_insert(0);
            *times += 1;
            if *times > MAX_BAD_PER_CHUNK {
                return Err(TransferError::TooManyBadChunks {
                    name: entry.name.escaped(),
                    index,
                    times: *times,
                });
            }
            let resend = ControlMessage::Resend { file_id, index };
            return stream::write_message(ctl, &resend, "asking for a chunk again").await;
        };
        let io = |op| {
            let name = entry.name.escaped();
            move |source| WriteError::Io { op, name, source }
        };
        on_disk(|| {
            let writing = self.writing(out, file_id, entry)?;
            writing
                .part
                .file()
                .write_all_at(payload, index * CHUNK_SIZE)
                .map_err(io("write"))?;
            if let Some(behind) = index.checked_sub(WRITEBACK_LAG) {
                writing
                    .part
                    .start_writeback(behind * CHUNK_SIZE, CHUNK_SIZE);
            }
            if let Some(sidecar) = &mut writing.sidecar {
                sidecar
                    .record(index, &hash)
                    .map_err(io("record the progress of"))?;
            }
            Ok::<_, TransferError>(())
        })?;
        self.received_bytes += payload.len() as u64;
        let pending = self.pending.get_mut(&file_id);
        let complete = pending.is_some_and(|p| {
            p.remove(&index);
            p.is_empty()
        });
        if complete {
            self.pending.remove(&file_id);
            if let Some(Writing { part, sidecar }) = self.open.remove(&file_id) {
                drop(sidecar);
                let mtime = entry.mtime;
                self.finishing.spawn_blocking(move || {
                    part.file().set_len(size).map_err(|source| WriteError::Io {
                        op: "set the size of",
                        name: part.name().escaped(),
                        source,
                    })?;
                    part.finish(mtime)?;
                    Ok(file_id)
                });
            } else {
                self.report_done(ctl, file_id).await?;
            }
        }
        self.report_finished(ctl, MAX_FINISHING - 1).await?;
        self.events
            .progress(self.resumed_bytes + self.received_bytes, self.files_done);
        Ok(())
    }

    /// The open partial file of `file_id`, opened (and its sidecar re-checked) if needed.
    fn writing(
        &mut self,
        out: &mut OutputDir,
        file_id: u32,
        entry: &Entry,
    ) -> Result<&mut Writing, TransferError> {
        if !self.open.contains_key(&file_id) {
            if self.open.len() >= MAX_OPEN_FILES
                && let Some(&evict) = self.open.keys().next()
            {
                self.open.remove(&evict);
            }
            let part = out.open_part(&entry.name, entry.mode)?;
            let sidecar = if self.fresh.remove(&file_id) {
                if chunk_count(entry.size) > 1 {
                    Some(resume::start(&part, entry)?)
                } else {
                    None
                }
            } else {
                let resume = resume::prepare(&part, entry, ResumeCheck::Tail)?;
                // Every chunk already written (not pending) must still be on disk: someone
                // else touching the partial file must not end in a silently damaged file.
                let pending = self.pending.get(&file_id);
                let intact = (0..chunk_count(entry.size)).all(|i| {
                    pending.is_some_and(|p| p.contains(&i)) || resume.have.contains_key(&i)
                });
                if !intact {
                    return Err(TransferError::PartChanged {
                        name: entry.name.escaped(),
                    });
                }
                Some(resume.sidecar)
            };
            self.open.insert(file_id, Writing { part, sidecar });
        }
        // Inserted just above when missing.
        self.open
            .get_mut(&file_id)
            .ok_or_else(|| TransferError::Protocol("internal: partial file not open".into()))
    }

    /// Reports the files finished meanwhile, waiting until at most `in_flight` are still
    /// being finished (0: all of them).
    async fn report_finished(
        &mut self,
        ctl: &mut SendStream,
        in_flight: usize,
    ) -> Result<(), TransferError> {
        loop {
            let joined = match self.finishing.try_join_next() {
                Some(joined) => joined,
                None if self.finishing.len() > in_flight => {
                    match self.finishing.join_next().await {
                        Some(joined) => joined,
                        None => return Ok(()),
                    }
                }
                None => return Ok(()),
            };
            let file_id = joined.map_err(|e| WriteError::Io {
                op: "finish",
                name: "a received file".into(),
                source: std::io::Error::other(e),
            })??;
            self.report_done(ctl, file_id).await?;
        }
    }

    /// Tells the sender that a file is complete and in place.
    async fn report_done(
        &mut self,
        ctl: &mut SendStream,
        file_id: u32,
    ) -> Result<(), TransferError> {
        stream::write_message(
            ctl,
            &ControlMessage::FileDone { file_id },
            "reporting a file",
        )
        .await?;
        if let Some(entry) = self.manifest.entry(file_id) {
            self.file_done(file_id, entry).await;
        }
        Ok(())
    }

    async fn file_done(&mut self, file_id: u32, entry: &Entry) {
        self.files_done += 1;
        self.events
            .emit(Event::FileDone {
                file_id,
                name: entry.name.escaped(),
            })
            .await;
    }
}

/// What an entry needs, worked out before the Accept.
enum Plan {
    /// A folder, created.
    Folder,
    /// Nothing: it is empty, or a past run left all of it.
    Complete {
        /// Bytes already there.
        have_bytes: u64,
    },
    /// These chunks.
    Need {
        /// Chunk-index ranges still missing.
        missing: Vec<std::ops::Range<u64>>,
        /// Bytes already there.
        have_bytes: u64,
        /// No partial file yet: create it when the first chunk arrives.
        fresh: bool,
    },
}

/// Works out what `entry` needs (blocking file-system work). Folders and empty files are
/// created at once; a file a past run finished ([`Target::Same`]) needs nothing; only a
/// file a past run began has resume state to check; the others are created when their
/// first chunk arrives.
fn plan_entry(
    out: &mut OutputDir,
    entry: &Entry,
    target: Target,
    check: ResumeCheck,
) -> Result<Plan, TransferError> {
    if entry.kind == EntryKind::Dir {
        out.create_dir(&entry.name)?;
        return Ok(Plan::Folder);
    }
    if target == Target::Same {
        return Ok(Plan::Complete {
            have_bytes: entry.size,
        });
    }
    if entry.size == 0 {
        let part = out.open_part(&entry.name, entry.mode)?;
        part.file().set_len(0).map_err(|source| WriteError::Io {
            op: "empty",
            name: entry.name.escaped(),
            source,
        })?;
        finish(part, entry)?;
        return Ok(Plan::Complete { have_bytes: 0 });
    }
    if !out.has_partial(&entry.name)? {
        return Ok(Plan::Need {
            missing: std::iter::once(0..chunk_count(entry.size)).collect(),
            have_bytes: 0,
            fresh: true,
        });
    }
    let part = out.open_part(&entry.name, entry.mode)?;
    let resume = resume::prepare(&part, entry, check)?;
    let missing = resume.missing(entry.size);
    if missing.is_empty() {
        finish(part, entry)?;
        return Ok(Plan::Complete {
            have_bytes: resume.have_bytes,
        });
    }
    Ok(Plan::Need {
        missing,
        have_bytes: resume.have_bytes,
        fresh: false,
    })
}

/// Renames a complete partial file into place with the sender's time and mode.
fn finish(part: PartFile, entry: &Entry) -> Result<(), TransferError> {
    part.finish(entry.mtime)?;
    Ok(())
}
