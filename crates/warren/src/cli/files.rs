//! `warren send` and `warren receive`: the command line over `warren::p2p` — the code,
//! the prompts, progress bars (indicatif) or JSON events, and exit codes.
//!
//! Output: people read stderr (the code, the offer, progress bars, summaries); scripts
//! read stdout with `--json`, one event per line (`code`, `connected`, `offer`, `started`,
//! `progress`, `file_done`, `finished`, `failed`, `notice`). Names are escaped for the
//! terminal by the library before they get here.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use warren::p2p::code::Code;
use warren::p2p::lan::{self, LanMailbox};
use warren::p2p::mailbox::{MailboxError, MailboxServer};
use warren::p2p::session::{self, Connected, Offering, Options, SessionError};
use warren::p2p::transfer::{
    self, Event, Events, Offer, ReceiveOptions, Sources, Summary, TransferError,
};
use warren::p2p::write::{Overwrite, WriteOptions};

/// Events a transfer may queue before progress updates are dropped.
const EVENT_QUEUE: usize = 64;
/// JSON progress lines at most this often (a bar redraws on its own schedule).
const JSON_PROGRESS_EVERY: Duration = Duration::from_millis(250);
/// How long a finished side waits for the peer to see the connection close.
const CLOSE_WAIT: Duration = Duration::from_secs(3);
/// Receivers one `warren send` may serve.
const MAX_RECEIVERS: u32 = 64;

/// Where the server is and how to prove we may use it (both commands).
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// The Warren server with a [server.p2p] section, HOST:PORT. Default: WARREN_SERVER.
    // Not clap's `env`: a WARREN_SERVER in the environment must not conflict with --lan.
    #[arg(long, short = 'r', value_name = "HOST:PORT")]
    pub server: Option<String>,
    /// Read the server's PSK from this file (first line). Default: WARREN_PSK.
    #[arg(long, value_name = "FILE")]
    pub psk_file: Option<PathBuf>,
    /// Skip the direct path and go through the server's relay.
    #[arg(long)]
    pub relay: bool,
    /// Print JSON events on stdout, one per line, instead of progress bars.
    #[arg(long)]
    pub json: bool,
}

/// `warren send`.
#[derive(Debug, Clone, Args)]
pub struct SendArgs {
    /// Files and folders to send; folders keep their tree. `-` sends what arrives on
    /// stdin, as one file (named by --name).
    #[arg(required_unless_present = "text", value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// Send this text instead of files: the receiver prints it (up to 64 KiB).
    #[arg(long, conflicts_with_all = ["paths", "exclude", "name"], value_name = "TEXT")]
    pub text: Option<String>,
    /// The file name the receiver gets for `-` (stdin).
    #[arg(long, default_value = "stdin", value_name = "NAME")]
    pub name: String,
    /// Leave out paths matching GLOB (e.g. `*.tmp`, `target/**`); repeat for several.
    #[arg(long, value_name = "GLOB")]
    pub exclude: Vec<String>,
    /// How many receivers may use the code, one after another or at the same time.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=MAX_RECEIVERS as i64))]
    pub max_receivers: u32,
    /// Ask before sending to each receiver (shows its fingerprint).
    #[arg(long)]
    pub confirm: bool,
    /// No server: be the mailbox on this machine and announce the code's number on the
    /// local network with mDNS (the receiver uses --lan too).
    #[arg(long, conflicts_with_all = ["server", "psk_file", "relay"])]
    pub lan: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// `warren receive`.
#[derive(Debug, Clone, Args)]
pub struct ReceiveArgs {
    /// The code from the sender. Other users can see arguments in `ps`: prefer
    /// WARREN_CODE or typing it at the prompt.
    #[arg(value_name = "CODE")]
    pub code: Option<String>,
    /// The folder to write into (created if missing). `-`: write the one file offered to
    /// stdout.
    #[arg(long, short = 'o', default_value = ".", value_name = "DIR")]
    pub out: PathBuf,
    /// Accept the offer without asking.
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Replace files that already exist (never done without this).
    #[arg(long)]
    pub overwrite: bool,
    /// No server: find the sender (`warren send --lan`) on the local network with mDNS.
    #[arg(long, conflicts_with_all = ["server", "psk_file", "relay"])]
    pub lan: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// What `warren send` offers.
enum Payload {
    Files(Sources),
    Text(String),
}

/// How a command failed.
#[derive(Debug)]
pub enum Failure {
    /// Bad usage or input (exit 2).
    Usage(String),
    /// It ran and failed (exit 1).
    Failed(String),
}

/// `warren send`: shows the code at once, then serves up to `--max-receivers`.
///
/// # Errors
///
/// [`Failure`] with the reason.
pub async fn send(args: SendArgs) -> Result<(), Failure> {
    let stdin = args.paths.iter().any(|p| p.as_os_str() == "-");
    if stdin && args.paths.len() > 1 {
        return Err(Failure::Usage(
            "`-` (stdin) is sent alone: give it as the only path".into(),
        ));
    }
    if !stdin {
        for path in &args.paths {
            // A typo should fail now, not after the receiver typed the code. This looks at
            // the named paths only; the walk of folders runs while the code is shown.
            std::fs::symlink_metadata(path).map_err(|e| {
                Failure::Usage(format!(
                    "cannot send {}: {e}: check the path",
                    path.display()
                ))
            })?;
        }
    }
    let out = Output::new(args.server.json);
    let mut lan = None;
    let options = if args.lan {
        let mailbox = LanMailbox::start()
            .await
            .map_err(|e| Failure::Failed(e.to_string()))?;
        let options = lan_sender_options(mailbox.mailbox());
        lan = Some(mailbox);
        options
    } else {
        options(&args.server)?
    };
    let result = serve(&args, &out, options, lan.as_mut()).await;
    if let Some(lan) = lan {
        lan.close().await;
    }
    result
}

/// The sender's options at its own `--lan` mailbox: the peer socket on every interface
/// (the mailbox is reached on loopback, which would otherwise bind the socket there).
fn lan_sender_options(mailbox: MailboxServer) -> Options {
    let mut options = Options::new(mailbox);
    options.bind = Some(std::net::SocketAddr::from((
        std::net::Ipv4Addr::UNSPECIFIED,
        0,
    )));
    options
}

/// `warren send` once the mailbox is known: the code, then up to `--max-receivers`.
async fn serve(
    args: &SendArgs,
    out: &Output,
    options: Options,
    lan: Option<&mut LanMailbox>,
) -> Result<(), Failure> {
    let stdin = args.paths.iter().any(|p| p.as_os_str() == "-");
    let out = out.clone();
    // The walk (or the spooling of stdin) runs while the code is shown and the receiver
    // types it.
    let mut walking = {
        let (paths, excludes, name) = (args.paths.clone(), args.exclude.clone(), args.name.clone());
        let text = args.text.clone();
        tokio::task::spawn_blocking(
            move || -> Result<(Payload, Option<tempfile::TempDir>), String> {
                if let Some(text) = text {
                    Ok((Payload::Text(text), None))
                } else if stdin {
                    let (scratch, file) = spool_stdin(&name)?;
                    let sources = Sources::walk(&[file], &[]).map_err(|e| e.to_string())?;
                    Ok((Payload::Files(sources), Some(scratch)))
                } else {
                    let sources = Sources::walk(&paths, &excludes).map_err(|e| e.to_string())?;
                    Ok((Payload::Files(sources), None))
                }
            },
        )
    };
    let mut offering = Offering::open(options)
        .await
        .map_err(|e| Failure::Failed(e.to_string()))?;
    if let (Some(lan), Some(code)) = (lan, offering.code())
        && let Err(error) = lan.advertise(code.nameplate())
    {
        offering.close().await;
        return Err(Failure::Failed(format!(
            "cannot announce the code on the local network: {error}"
        )));
    }
    // Invariant: `Offering::open` always makes a code.
    let code = offering.code().map(Code::reveal).unwrap_or_default();
    let receive = if args.lan {
        "warren receive --lan"
    } else {
        "warren receive"
    };
    out.event(json!({"event": "code", "code": code}));
    out.say(&format!(
        "Code: {code}\nOn the other machine: {receive}   (then type the code; or WARREN_CODE={code} {receive})"
    ));
    // The first receiver's key exchange and connection run while the walk finishes: a
    // tree of 10 000 files takes ~50 ms to walk, which a receiver that already had the
    // code waited out before the key agreement could start. Either may end first; the
    // receiver's future is dropped half way only when the walk failed and the offer ends
    // anyway (`next_receiver` is not cancel-safe).
    let (walked, mut first_receiver) = {
        let receiver = offering.next_receiver();
        tokio::pin!(receiver);
        let mut first = None;
        let walked = loop {
            tokio::select! {
                walked = &mut walking => break walked,
                connected = &mut receiver, if first.is_none() => first = Some(connected),
            }
        };
        if first.is_none() && matches!(walked, Ok(Ok(_))) {
            first = Some(receiver.await);
        }
        (walked, first)
    };
    // `_scratch` holds stdin's spool file until every transfer is done.
    let (payload, _scratch) = match walked {
        Ok(Ok((payload, scratch))) => (Arc::new(payload), scratch),
        Ok(Err(error)) => {
            offering.close().await;
            return Err(Failure::Usage(error));
        }
        Err(error) => {
            offering.close().await;
            return Err(Failure::Failed(format!(
                "walking the files failed: {error}"
            )));
        }
    };
    if let Payload::Files(sources) = &*payload {
        for skipped in sources.skipped() {
            out.notice(&format!(
                "left out {} ({:?}: only files and folders are sent)",
                skipped.path.display(),
                skipped.reason
            ));
        }
    }
    let mut transfers = JoinSet::new();
    let mut served = 0;
    let mut last_error = None;
    while served < args.max_receivers {
        // Not raced against the running transfers: `next_receiver` is not cancel-safe (a
        // receiver half way through its key exchange would be dropped). Their results are
        // collected at the end.
        let next = match first_receiver.take() {
            Some(first) => first,
            None => offering.next_receiver().await,
        };
        let connected = match next {
            Ok(connected) => connected,
            Err(SessionError::Pake(error)) => {
                out.notice(&format!("a receiver failed the key exchange: {error}"));
                continue;
            }
            Err(error @ (SessionError::PeerLeft(_) | SessionError::WrongPurpose { .. })) => {
                out.notice(&format!("a receiver could not be served: {error}"));
                last_error = Some(error.to_string());
                continue;
            }
            // A receiver that came and found no path used its turn: once none is left
            // the sender ends with that reason, instead of waiting out the nameplate's
            // TTL for a receiver that is not coming.
            Err(error @ SessionError::NoPath(_)) => {
                out.notice(&format!("a receiver could not be served: {error}"));
                last_error = Some(error.to_string());
                served += 1;
                continue;
            }
            Err(error) => {
                last_error = Some(error.to_string());
                break;
            }
        };
        served += 1;
        let who = connected.peer.short();
        out.connected(&connected);
        if args.confirm && !ask(&format!("Send to receiver {who}? [y/N] ")).await {
            connected
                .connection
                .close(transfer::stream::CLOSE_CANCEL, b"the sender declined");
            out.notice(&format!("not sending to {who}"));
            continue;
        }
        let out = out.clone();
        let payload = Arc::clone(&payload);
        transfers.spawn(async move {
            let (events, progress) = out.progress(&who, true);
            let result = match &*payload {
                Payload::Files(sources) => {
                    transfer::send(&connected.connection, sources, &events).await
                }
                Payload::Text(text) => {
                    transfer::send_text(&connected.connection, text, &events).await
                }
            };
            drop(events);
            let _ = progress.await;
            let what = match &*payload {
                Payload::Files(_) => "Sent",
                Payload::Text(_) => "Sent a text",
            };
            finish(connected, result, &out, what, &who).await
        });
    }
    offering.close().await;
    while let Some(done) = transfers.join_next().await {
        if let Ok(Err(error)) = done {
            last_error = Some(error);
        }
    }
    match (served, last_error) {
        (_, Some(error)) => Err(Failure::Failed(error)),
        (0, None) => Err(Failure::Failed("no receiver came".into())),
        _ => Ok(()),
    }
}

/// `warren receive`: the code from the argument, WARREN_CODE or a prompt.
///
/// # Errors
///
/// [`Failure`] with the reason.
pub async fn receive(args: ReceiveArgs) -> Result<(), Failure> {
    let code = read_code(args.code.as_deref()).await?;
    let to_stdout = args.out.as_os_str() == "-";
    if to_stdout && args.server.json {
        return Err(Failure::Usage(
            "--out - writes the file to stdout, where --json writes events: pick one".into(),
        ));
    }
    let out = Output::new(args.server.json);
    let options = if args.lan {
        None
    } else {
        Some(options(&args.server)?)
    };
    // With `--out -` the file lands in a scratch folder first (the writer's guarantees
    // need a folder), then goes to stdout.
    let scratch = if to_stdout {
        Some(tempfile::tempdir().map_err(|e| {
            Failure::Failed(format!("cannot make a scratch folder for --out -: {e}"))
        })?)
    } else {
        std::fs::create_dir_all(&args.out).map_err(|e| {
            Failure::Usage(format!(
                "cannot create the output folder {}: {e}",
                args.out.display()
            ))
        })?;
        None
    };
    let out_dir = scratch
        .as_ref()
        .map_or_else(|| args.out.clone(), |s| s.path().to_owned());
    let connected = match &options {
        Some(options) => session::join(&code, options)
            .await
            .map_err(|e| Failure::Failed(e.to_string()))?,
        None => join_lan(&code, &out).await?,
    };
    out.connected(&connected);
    let who = connected.peer.short();
    let receive_options = ReceiveOptions {
        write: WriteOptions {
            overwrite: if args.overwrite {
                Overwrite::Replace
            } else {
                Overwrite::Refuse
            },
            ..WriteOptions::default()
        },
        ..ReceiveOptions::default()
    };
    let yes = args.yes;
    let confirm = {
        let out = out.clone();
        move |offer: Offer| async move {
            out.offer(&offer);
            if to_stdout && (offer.files != 1 || offer.folders != 0) {
                out.notice("not accepted: --out - takes exactly one file, and this offer has more");
                return false;
            }
            if yes {
                return true;
            }
            if !std::io::stdin().is_terminal() {
                out.notice("not accepted: run with --yes to accept without a prompt");
                return false;
            }
            ask("Accept? [y/N] ").await
        }
    };
    let (events, progress) = out.progress(&who, false);
    let result = transfer::receive(
        &connected.connection,
        &out_dir,
        receive_options,
        confirm,
        &events,
    )
    .await;
    drop(events);
    let _ = progress.await;
    let text = result
        .as_ref()
        .ok()
        .and_then(|summary| summary.text.clone());
    let what = if text.is_some() {
        "Received a text"
    } else {
        "Received"
    };
    finish(connected, result, &out, what, &who)
        .await
        .map_err(Failure::Failed)?;
    if let Some(text) = text {
        print_text(&text, &out);
    }
    if let Some(scratch) = scratch {
        copy_single_file_to_stdout(scratch.path()).map_err(Failure::Failed)?;
    }
    Ok(())
}

/// `warren receive --lan`: finds the sender's mailbox with mDNS and joins it there, trying
/// its addresses in turn until one answers.
async fn join_lan(code: &Code, out: &Output) -> Result<Connected, Failure> {
    out.say("Looking for the sender on the local network...");
    let found = lan::find(code.nameplate(), lan::FIND_WAIT)
        .await
        .map_err(|e| Failure::Failed(e.to_string()))?;
    let mut unreachable = Vec::new();
    for addr in &found.addrs {
        match session::join(code, &Options::new(found.mailbox(*addr))).await {
            Err(SessionError::Mailbox(error @ MailboxError::Connect(_))) => {
                unreachable.push(format!("{addr}: {error}"));
            }
            joined => return joined.map_err(|e| Failure::Failed(e.to_string())),
        }
    }
    Err(Failure::Failed(format!(
        "found the sender on the local network but could not reach its mailbox ({}): a firewall on the sender may block it",
        unreachable.join("; ")
    )))
}

/// Shows a received text: on stdout, raw when it goes to a file or pipe, with control
/// characters escaped on a terminal (the sender chose the bytes); in `--json`, as an event.
fn print_text(text: &str, out: &Output) {
    if out.json {
        out.event(json!({"event": "text", "text": text}));
        return;
    }
    let mut stdout = std::io::stdout().lock();
    let shown = if stdout.is_terminal() {
        // Line by line, so the text keeps its lines and only other controls show escaped.
        text.split('\n')
            .map(warren_proto::files::escape_for_terminal)
            .collect::<Vec<_>>()
            .join("\n")
    } else {
        text.to_owned()
    };
    let _ = writeln!(stdout, "{shown}");
    let _ = stdout.flush();
}

/// Copies stdin into `NAME` in a fresh scratch folder (kept as long as the folder is).
fn spool_stdin(name: &str) -> Result<(tempfile::TempDir, PathBuf), String> {
    let scratch =
        tempfile::tempdir().map_err(|e| format!("cannot make a scratch folder for stdin: {e}"))?;
    let file = scratch.path().join(name);
    if file.parent() != Some(scratch.path()) || name.is_empty() {
        return Err(format!(
            "--name {name:?} must be a plain file name, without folders"
        ));
    }
    let mut spool = std::fs::File::create(&file)
        .map_err(|e| format!("cannot spool stdin to {}: {e}", file.display()))?;
    std::io::copy(&mut std::io::stdin().lock(), &mut spool)
        .map_err(|e| format!("cannot read stdin: {e}"))?;
    Ok((scratch, file))
}

/// Writes the one file received into `dir` to stdout.
fn copy_single_file_to_stdout(dir: &std::path::Path) -> Result<(), String> {
    let mut files = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read the scratch folder: {e}"))?
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()));
    let (Some(file), None) = (files.next(), files.next()) else {
        return Err("--out -: expected exactly one file".into());
    };
    let mut source =
        std::fs::File::open(file.path()).map_err(|e| format!("cannot read it back: {e}"))?;
    let mut stdout = std::io::stdout().lock();
    std::io::copy(&mut source, &mut stdout)
        .and_then(|_| stdout.flush())
        .map_err(|e| format!("cannot write to stdout: {e}"))?;
    Ok(())
}

/// The session options from the command line.
pub(crate) fn options(args: &ServerArgs) -> Result<Options, Failure> {
    let server = match &args.server {
        Some(server) => server.clone(),
        None => match std::env::var("WARREN_SERVER") {
            Ok(server) if !server.trim().is_empty() => server,
            _ => {
                return Err(Failure::Usage(
                    "no server: give --server HOST:PORT (or WARREN_SERVER), or --lan when both machines are on one local network".into(),
                ));
            }
        },
    };
    let server = crate::cli::server_addr(&server).map_err(Failure::Usage)?;
    let psk = crate::cli::psk(args.psk_file.as_deref()).map_err(Failure::Usage)?;
    let mut options = Options::new(MailboxServer {
        server,
        psk,
        quic: None,
        deadline: Duration::from_secs(10),
    });
    options.relay_only = args.relay;
    Ok(options)
}

/// Reports the end of one transfer (`what`: "Sent", "Received", "... a text") and closes
/// its connection cleanly.
async fn finish(
    connected: Connected,
    result: Result<Summary, TransferError>,
    out: &Output,
    what: &str,
    who: &str,
) -> Result<(), String> {
    let route = connected.route.word();
    let outcome = match result {
        Ok(summary) => {
            let secs = summary.elapsed.as_secs_f64().max(1e-6);
            out.event(json!({
                "event": "finished", "peer": who, "route": route,
                "files": summary.files, "bytes": summary.bytes,
                "sent_bytes": summary.sent_bytes, "resumed_bytes": summary.resumed_bytes,
                "resent_chunks": summary.resent_chunks, "seconds": secs,
            }));
            let files = if what.ends_with("text") {
                String::new()
            } else {
                format!(" {} files,", summary.files)
            };
            let mut line = format!(
                "{what}{files} {} in {:.1} s ({}/s, {route}, peer {who})",
                indicatif::HumanBytes(summary.bytes),
                secs,
                indicatif::HumanBytes((summary.sent_bytes as f64 / secs) as u64),
            );
            if summary.resumed_bytes > 0 {
                line.push_str(&format!(
                    "; {} were already there",
                    indicatif::HumanBytes(summary.resumed_bytes)
                ));
            }
            out.say(&line);
            Ok(())
        }
        Err(error) => {
            out.event(json!({"event": "failed", "peer": who, "error": error.to_string()}));
            out.say(&format!("error: {error}"));
            Err(error.to_string())
        }
    };
    // The transfer closed the connection; wait a moment for the close to reach the peer.
    let _ = tokio::time::timeout(CLOSE_WAIT, connected.endpoint.wait_idle()).await;
    outcome
}

/// Asks a yes/no question on the terminal.
async fn ask(question: &str) -> bool {
    let question = question.to_owned();
    tokio::task::spawn_blocking(move || {
        eprint!("{question}");
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        if std::io::stdin().lock().read_line(&mut answer).is_err() {
            return false;
        }
        matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes")
    })
    .await
    .unwrap_or(false)
}

/// The code from the argument, `WARREN_CODE` or the terminal, parsed.
pub(crate) async fn read_code(argument: Option<&str>) -> Result<Code, Failure> {
    let typed = match (argument, std::env::var("WARREN_CODE")) {
        (Some(code), _) => code.to_owned(),
        (None, Ok(code)) if !code.trim().is_empty() => code,
        (None, _) => prompt_code().await?,
    };
    Code::parse(&typed).map_err(|e| Failure::Usage(e.to_string()))
}

/// Reads the code from the terminal.
async fn prompt_code() -> Result<String, Failure> {
    if !std::io::stdin().is_terminal() {
        return Err(Failure::Usage(
            "no code: give it as WARREN_CODE=... or as the argument".into(),
        ));
    }
    tokio::task::spawn_blocking(|| {
        eprint!("Code: ");
        let _ = std::io::stderr().flush();
        let mut line = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut line)
            .map_err(|e| Failure::Usage(format!("cannot read the code: {e}")))?;
        Ok(line.trim().to_owned())
    })
    .await
    .map_err(|e| Failure::Failed(e.to_string()))?
}

/// Where the commands' output goes: bars and lines on stderr, or JSON on stdout.
#[derive(Clone)]
pub(crate) struct Output {
    json: bool,
    bars: MultiProgress,
}

impl Output {
    pub(crate) fn new(json: bool) -> Output {
        let target = if json {
            ProgressDrawTarget::hidden()
        } else {
            ProgressDrawTarget::stderr()
        };
        Output {
            json,
            bars: MultiProgress::with_draw_target(target),
        }
    }

    /// A line for people (stderr, above any bars).
    pub(crate) fn say(&self, line: &str) {
        if self.json {
            return;
        }
        if self.bars.is_hidden() {
            eprintln!("{line}");
        } else {
            let _ = self.bars.println(line);
        }
    }

    /// A line for scripts (stdout, `--json` only).
    pub(crate) fn event(&self, value: serde_json::Value) {
        if self.json {
            let mut stdout = std::io::stdout().lock();
            let _ = writeln!(stdout, "{value}");
            let _ = stdout.flush();
        }
    }

    pub(crate) fn notice(&self, message: &str) {
        self.event(json!({"event": "notice", "message": message}));
        self.say(message);
    }

    pub(crate) fn connected(&self, connected: &Connected) {
        let route = match connected.route {
            session::Route::Direct(addr) | session::Route::Relayed(addr) => addr,
        };
        // The handshake's round trips measured it: the path's RTT, peer to peer.
        let rtt_ms = connected.connection.rtt().as_secs_f64() * 1e3;
        self.event(json!({
            "event": "connected",
            "peer": connected.peer.short(),
            "route": connected.route.word(),
            "address": route.to_string(),
            "agreed_ms": connected.agreed_in.as_millis() as u64,
            "connected_ms": connected.connected_in.as_millis() as u64,
            "rtt_ms": rtt_ms,
        }));
        self.say(&format!(
            "Connected to {} ({}, via {route}, RTT {rtt_ms:.1} ms) after {} ms",
            connected.peer.short(),
            connected.route.word(),
            (connected.agreed_in + connected.connected_in).as_millis()
        ));
    }

    fn offer(&self, offer: &Offer) {
        self.event(json!({
            "event": "offer", "files": offer.files, "folders": offer.folders,
            "bytes": offer.bytes, "top_level": offer.top_level,
            "replaces": offer.replaces, "complete": offer.complete,
        }));
        let mut text = format!(
            "The sender offers {} files ({}) in {} folders:",
            offer.files,
            indicatif::HumanBytes(offer.bytes),
            offer.folders
        );
        for name in offer.top_level.iter().take(10) {
            text.push_str(&format!("\n  {name}"));
        }
        if offer.top_level.len() > 10 {
            text.push_str(&format!("\n  ... and {} more", offer.top_level.len() - 10));
        }
        if offer.complete > 0 {
            text.push_str(&format!(
                "\n  {} already here from an earlier run",
                offer.complete
            ));
        }
        if offer.replaces > 0 {
            text.push_str(&format!(
                "\n  {} will replace existing files (--overwrite)",
                offer.replaces
            ));
        }
        self.say(&text);
    }

    /// An event queue for one transfer with `peer` and the task that renders it; `label`
    /// puts the peer on the bar (a sender with several receivers).
    fn progress(&self, peer: &str, label: bool) -> (Events, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let task = tokio::spawn(render(self.clone(), rx, peer.to_owned(), label));
        (Events::new(tx), task)
    }
}

/// Draws one transfer's events as a bar (or JSON lines) until its queue closes.
async fn render(out: Output, mut rx: mpsc::Receiver<Event>, peer: String, label: bool) {
    let bar = out.bars.add(ProgressBar::new(0));
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} ETA {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    let label = if label {
        format!("{peer} ")
    } else {
        String::new()
    };
    let mut files = 0;
    let mut last_json = Instant::now() - JSON_PROGRESS_EVERY;
    while let Some(event) = rx.recv().await {
        match event {
            Event::Started {
                files: n,
                bytes,
                resumed_bytes,
            } => {
                files = n;
                bar.set_length(bytes);
                bar.set_position(resumed_bytes);
                bar.reset_eta();
                bar.set_message(format!("{label}files 0/{files}"));
                out.event(json!({"event": "started", "peer": peer, "files": n, "bytes": bytes, "resumed_bytes": resumed_bytes}));
            }
            Event::Progress { bytes, files_done } => {
                bar.set_position(bytes);
                bar.set_message(format!("{label}files {files_done}/{files}"));
                if last_json.elapsed() >= JSON_PROGRESS_EVERY {
                    last_json = Instant::now();
                    out.event(json!({"event": "progress", "peer": peer, "bytes": bytes, "files_done": files_done}));
                }
            }
            Event::FileDone { name, .. } => {
                out.event(json!({"event": "file_done", "peer": peer, "name": name}));
            }
            Event::Finished(_) | Event::Failed { .. } => {}
            _ => {}
        }
    }
    bar.finish_and_clear();
}
