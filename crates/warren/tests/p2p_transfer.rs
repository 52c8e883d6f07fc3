//! Peer-to-peer file transfer over one QUIC connection (issue 17), in process: both peers
//! on 127.0.0.1 with quinn endpoints on port 0, the PAKE run in memory to get the pins.
#![cfg(unix)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, RngCore, SeedableRng};
use tokio::sync::mpsc;
use warren::p2p::code::{Code, Nameplate};
use warren::p2p::pake::{Outcome, Pake, Role};
use warren::p2p::transfer::{
    self, Event, Events, Identity, Offer, ReceiveOptions, Sources, Summary, TransferError,
};
use warren::transport::quic::QuicSettings;
use warren_proto::files::control::Decoded;
use warren_proto::files::{ChunkHeader, ControlMessage, Entry, Manifest, Mode, SafeName};

/// Every test finishes well within this.
const TEST_LIMIT: Duration = Duration::from_secs(120);

/// Runs the PAKE between the two identities in memory and returns each side's outcome.
fn pake(sender: &Identity, receiver: &Identity) -> (Outcome, Outcome) {
    let code = Code::generate(Nameplate::new(7).expect("nameplate"), &mut rand::rng());
    let mut s = Pake::new(Role::Sender, &code, sender.fingerprint(), rand::random());
    let mut r = Pake::new(
        Role::Receiver,
        &code,
        receiver.fingerprint(),
        rand::random(),
    );
    for _ in 0..10 {
        while let Some(m) = s.poll_transmit() {
            r.handle_message(&m).expect("receiver takes the message");
        }
        while let Some(m) = r.poll_transmit() {
            s.handle_message(&m).expect("sender takes the message");
        }
    }
    (
        s.outcome().expect("sender done").clone(),
        r.outcome().expect("receiver done").clone(),
    )
}

/// Two connected peers: the sender listens, the receiver dials. Endpoints are kept so
/// the connections live.
struct Peers {
    sender: quinn::Connection,
    receiver: quinn::Connection,
    _endpoints: (quinn::Endpoint, quinn::Endpoint),
}

fn settings() -> QuicSettings {
    QuicSettings::loopback()
}

fn server_endpoint(config: quinn::ServerConfig) -> quinn::Endpoint {
    quinn::Endpoint::server(config, "127.0.0.1:0".parse().expect("addr")).expect("bind")
}

fn client_endpoint() -> quinn::Endpoint {
    quinn::Endpoint::client("127.0.0.1:0".parse().expect("addr")).expect("bind")
}

async fn connect() -> Peers {
    let (s_id, r_id) = (
        Identity::generate().expect("id"),
        Identity::generate().expect("id"),
    );
    let (s_out, r_out) = pake(&s_id, &r_id);
    let server = server_endpoint(transfer::server_config(&s_id, &s_out, &settings()).expect("cfg"));
    let addr: SocketAddr = server.local_addr().expect("addr");
    let client = client_endpoint();
    let config = transfer::client_config(&r_id, &r_out, &settings()).expect("cfg");
    let dial = async {
        client
            .connect_with(config, addr, transfer::SERVER_NAME)
            .expect("connect")
            .await
            .expect("handshake")
    };
    let accept = async {
        server
            .accept()
            .await
            .expect("incoming")
            .await
            .expect("handshake")
    };
    let (receiver, sender) = tokio::join!(dial, accept);
    Peers {
        sender,
        receiver,
        _endpoints: (server, client),
    }
}

/// Writes `len` random bytes to `path` (folders made as needed).
fn random_file(rng: &mut impl RngCore, path: &Path, len: usize) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("dirs");
    let mut bytes = vec![0u8; len];
    rng.fill_bytes(&mut bytes);
    std::fs::write(path, bytes).expect("write");
}

/// Every regular file beneath `root`, relative path → BLAKE3 of its bytes.
fn hashes(root: &Path) -> std::collections::BTreeMap<String, blake3::Hash> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read_dir") {
            let entry = entry.expect("entry");
            let path = entry.path();
            if entry.file_type().expect("type").is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(root).expect("beneath").to_string_lossy();
                let bytes = std::fs::read(&path).expect("read");
                out.insert(rel.into_owned(), blake3::hash(&bytes));
            }
        }
    }
    out
}

fn yes(_: Offer) -> std::future::Ready<bool> {
    std::future::ready(true)
}

/// Runs both sides of one transfer at once: the sender (quiet) and the receiver, which
/// answers the offer with `confirm` and reports to `events`.
async fn both_sides<F, Fut>(
    peers: &Peers,
    sources: &Sources,
    out: &Path,
    confirm: F,
    events: &Events,
) -> (
    Result<Summary, TransferError>,
    Result<Summary, TransferError>,
)
where
    F: FnOnce(Offer) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let quiet = Events::none();
    tokio::join!(
        transfer::send(&peers.sender, sources, &quiet),
        transfer::receive(
            &peers.receiver,
            out,
            ReceiveOptions::default(),
            confirm,
            events
        ),
    )
}

/// One whole transfer of `source` (a folder) into `out`.
async fn transfer_tree(source: &Path, out: &Path) -> (Summary, Summary) {
    let peers = connect().await;
    let sources = Sources::walk(&[source.to_path_buf()], &[]).expect("walk");
    let (sent, received) = both_sides(&peers, &sources, out, yes, &Events::none()).await;
    (sent.expect("sent"), received.expect("received"))
}

fn scratch() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (src, out) = (dir.path().join("src"), dir.path().join("out"));
    std::fs::create_dir_all(&src).expect("src");
    std::fs::create_dir_all(&out).expect("out");
    (dir, src, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_of_random_files_arrives_byte_exact() {
    tokio::time::timeout(TEST_LIMIT, async {
        let (_dir, src, out) = scratch();
        let tree = src.join("tree");
        let mut rng = rand::rngs::StdRng::seed_from_u64(17);
        let mib = 1 << 20;
        for (name, len) in [
            ("a.bin", 3 * mib + 12_345),
            ("empty", 0),
            ("one", 1),
            ("nested/b.bin", mib),
            ("nested/c.bin", mib + 1),
            ("nested/deeper/still/d.bin", 200_000),
            ("nested/deeper/empty-too", 0),
        ] {
            random_file(&mut rng, &tree.join(name), len);
        }
        std::fs::create_dir_all(tree.join("an/empty/folder")).expect("dir");
        let (sent, received) = transfer_tree(&tree, &out).await;
        assert_eq!(hashes(&tree), hashes(&out.join("tree")));
        assert!(out.join("tree/an/empty/folder").is_dir());
        assert_eq!(sent.files, 7);
        assert_eq!(sent.bytes, (5 * mib + 12_345 + 1 + 1 + 200_000) as u64);
        assert_eq!(sent.sent_bytes, sent.bytes);
        assert_eq!(received.sent_bytes, sent.bytes);
        assert_eq!(sent.resumed_bytes, 0);
        // No temporary files are left behind.
        assert!(hashes(&out).keys().all(|name| !name.contains("warren-")));
    })
    .await
    .expect("in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_small_files_arrive_with_events() {
    tokio::time::timeout(TEST_LIMIT, async {
        let (_dir, src, out) = scratch();
        let tree = src.join("many");
        let mut rng = rand::rngs::StdRng::seed_from_u64(300);
        for i in 0..300 {
            let len = rng.random_range(0..4096);
            random_file(&mut rng, &tree.join(format!("d{}/f{i:03}", i % 7)), len);
        }
        let peers = connect().await;
        let sources = Sources::walk(std::slice::from_ref(&tree), &[]).expect("walk");
        let (queue, mut seen) = mpsc::channel(1024);
        let events = Events::new(queue);
        let offers = Arc::new(std::sync::Mutex::new(None));
        let offered = offers.clone();
        let confirm = move |offer: Offer| {
            *offered.lock().expect("lock") = Some(offer);
            std::future::ready(true)
        };
        let (sent, received) = both_sides(&peers, &sources, &out, confirm, &events).await;
        sent.expect("sent");
        received.expect("received");
        assert_eq!(hashes(&tree), hashes(&out.join("many")));
        let offer = offers.lock().expect("lock").clone().expect("offered");
        assert_eq!(offer.files, 300);
        assert_eq!(offer.folders, 8);
        assert_eq!(offer.top_level, ["many"]);
        drop(events);
        let mut files_done = 0;
        let mut started = false;
        let mut finished = false;
        while let Ok(event) = seen.try_recv() {
            match event {
                Event::Started { files, .. } => {
                    assert_eq!(files, 300);
                    started = true;
                }
                Event::FileDone { .. } => files_done += 1,
                Event::Finished(_) => finished = true,
                _ => {}
            }
        }
        assert!(started && finished);
        assert_eq!(files_done, 300);
    })
    .await
    .expect("in time");
}

/// Runs a transfer of `tree` into `out` and cuts the receiver's connection once it has
/// written at least half of the bytes.
async fn interrupted_transfer(tree: &Path, out: &Path) {
    let peers = connect().await;
    let sources = Sources::walk(&[tree.to_path_buf()], &[]).expect("walk");
    let total = sources.manifest().total_size();
    let (queue, mut seen) = mpsc::channel(1024);
    let events = Events::new(queue);
    let receiver_connection = peers.receiver.clone();
    let cutter = tokio::spawn(async move {
        while let Some(event) = seen.recv().await {
            if let Event::Progress { bytes, .. } = event
                && bytes * 2 >= total
            {
                receiver_connection.close(0u32.into(), b"cut");
                return;
            }
        }
    });
    let (sent, received) = both_sides(&peers, &sources, out, yes, &events).await;
    assert!(sent.is_err(), "the sender saw the cut");
    let err = received.expect_err("the receiver was cut");
    assert!(err.is_retryable(), "{err}");
    drop(events);
    cutter.await.expect("cutter");
}

/// Two files of 2 and 6 MiB: half way falls inside the second.
fn resume_tree(src: &Path) -> PathBuf {
    let tree = src.join("big");
    let mut rng = rand::rngs::StdRng::seed_from_u64(55);
    random_file(&mut rng, &tree.join("a.bin"), 2 << 20);
    random_file(&mut rng, &tree.join("b.bin"), (6 << 20) + 777);
    tree
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_transfer_resumes_and_sends_at_most_55_percent_again() {
    tokio::time::timeout(TEST_LIMIT, async {
        let (_dir, src, out) = scratch();
        let tree = resume_tree(&src);
        interrupted_transfer(&tree, &out).await;
        let (sent, received) = transfer_tree(&tree, &out).await;
        assert_eq!(hashes(&tree), hashes(&out.join("big")));
        let total = sent.bytes;
        assert!(
            sent.sent_bytes * 100 <= total * 55,
            "sent {} of {total} bytes again",
            sent.sent_bytes
        );
        assert_eq!(sent.resumed_bytes + sent.sent_bytes, total);
        assert_eq!(received.resumed_bytes, sent.resumed_bytes);
    })
    .await
    .expect("in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_byte_in_a_partial_file_is_found_and_sent_again() {
    tokio::time::timeout(TEST_LIMIT, async {
        let (_dir, src, out) = scratch();
        let tree = resume_tree(&src);
        // b.bin is partial with at least its first chunk recorded (the cut came after
        // 4 MiB of 8); flip a byte inside that chunk. The cut follows progress events, so
        // on a loaded machine it can land after b.bin completed: cut again from scratch.
        let part = out.join("big/.b.bin.warren-part");
        for _ in 0..5 {
            let _ = std::fs::remove_dir_all(out.join("big"));
            interrupted_transfer(&tree, &out).await;
            if part.exists() {
                break;
            }
        }
        let mut bytes = std::fs::read(&part).expect("partial file");
        assert!(bytes.len() > 1 << 20, "{} bytes", bytes.len());
        bytes[1000] ^= 0x40;
        std::fs::write(&part, &bytes).expect("corrupt");
        let (sent, _) = transfer_tree(&tree, &out).await;
        assert_eq!(hashes(&tree), hashes(&out.join("big")));
        assert!(sent.resumed_bytes > 0, "the rest was resumed");
    })
    .await
    .expect("in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_third_party_with_another_certificate_is_refused() {
    tokio::time::timeout(TEST_LIMIT, async {
        let (s_id, r_id) = (
            Identity::generate().expect("id"),
            Identity::generate().expect("id"),
        );
        let mallory = Identity::generate().expect("id");
        let (s_out, r_out) = pake(&s_id, &r_id);
        // Mallory learned nothing from the PAKE but pins the sender's key (it is not
        // secret); the sender still wants the receiver's key.
        let (_, m_out) = pake(&s_id, &mallory);
        let server =
            server_endpoint(transfer::server_config(&s_id, &s_out, &settings()).expect("cfg"));
        let addr = server.local_addr().expect("addr");
        let client = client_endpoint();
        let config = transfer::client_config(&mallory, &m_out, &settings()).expect("cfg");
        let dial = async {
            let connecting = client
                .connect_with(config, addr, transfer::SERVER_NAME)
                .expect("connect");
            if let Ok(connection) = connecting.await {
                // TLS 1.3: the client may finish before the server checks it.
                let _ = tokio::time::timeout(Duration::from_secs(5), connection.closed()).await;
            }
        };
        let accept = async { server.accept().await.expect("incoming").await };
        let (_, accepted) = tokio::join!(dial, accept);
        assert!(accepted.is_err(), "the sender refused mallory");

        // And a receiver that dials mallory's server instead of the sender is refused.
        let fake =
            server_endpoint(transfer::server_config(&mallory, &m_out, &settings()).expect("cfg"));
        let fake_addr = fake.local_addr().expect("addr");
        let config = transfer::client_config(&r_id, &r_out, &settings()).expect("cfg");
        let dial = async {
            client
                .connect_with(config, fake_addr, transfer::SERVER_NAME)
                .expect("connect")
                .await
        };
        // quinn moves a handshake on only once the server accepts the attempt.
        let accept = async { fake.accept().await.expect("incoming").await };
        let (dialled, _) = tokio::join!(dial, accept);
        let err = dialled.expect_err("the receiver refused mallory's server");
        assert!(err.to_string().contains("join code"), "{err}");
    })
    .await
    .expect("in time");
}

/// QUIC varint of a small value (< 16384).
fn varint(out: &mut Vec<u8>, value: usize) {
    if value < 64 {
        out.push(value as u8);
    } else {
        out.extend_from_slice(&(0x4000 | value as u16).to_be_bytes());
    }
}

/// A raw manifest with one file entry named `name` (not checked by anyone first).
fn raw_manifest(name: &[u8]) -> Vec<u8> {
    let mut body = vec![1u8];
    varint(&mut body, 1);
    varint(&mut body, 5);
    body.push(0);
    varint(&mut body, name.len());
    body.extend_from_slice(name);
    varint(&mut body, 5);
    varint(&mut body, 0);
    let mut frame = vec![0x02];
    varint(&mut frame, body.len());
    frame.extend_from_slice(&body);
    frame
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_manifest_is_refused_and_nothing_is_written() {
    tokio::time::timeout(TEST_LIMIT, async {
        for name in [
            &b"../x"[..],
            b"/etc/passwd",
            b"a/../../x",
            b"evil\x1b[31m.txt",
            b"C:/windows",
        ] {
            let (dir, _src, out) = scratch();
            let peers = connect().await;
            let hostile = async {
                let (mut send, mut recv) = peers.sender.open_bi().await.expect("bi");
                send.write_all(&[0x01, 0x02, 0x01, 0x01])
                    .await
                    .expect("hello");
                send.write_all(&raw_manifest(name)).await.expect("manifest");
                // The receiver answers with its hello and a Cancel, or closes.
                let _ = tokio::time::timeout(Duration::from_secs(10), recv.read_to_end(4096))
                    .await
                    .expect("answer in time");
            };
            let confirm = |_: Offer| async { panic!("a hostile offer reached the user") };
            let no_events = Events::none();
            let (_, received) = tokio::join!(
                hostile,
                transfer::receive(
                    &peers.receiver,
                    &out,
                    ReceiveOptions::default(),
                    confirm,
                    &no_events
                ),
            );
            let err = received.expect_err("refused");
            assert!(matches!(err, TransferError::Manifest(_)), "{err}");
            assert!(!err.to_string().contains('\u{1b}'), "{err}");
            assert_eq!(std::fs::read_dir(&out).expect("out").count(), 0);
            let mut around: Vec<_> = std::fs::read_dir(dir.path())
                .expect("dir")
                .map(|e| e.expect("entry").file_name())
                .collect();
            around.sort();
            assert_eq!(around, ["out", "src"]);
        }
    })
    .await
    .expect("in time");
}

/// Reads one control message with the proto decoder (test sender side).
async fn read_control(recv: &mut quinn::RecvStream, buf: &mut Vec<u8>) -> ControlMessage {
    loop {
        if let Ok(Decoded::Message(message, used)) = ControlMessage::decode(buf) {
            buf.drain(..used);
            return message;
        }
        let read = tokio::time::timeout(Duration::from_secs(10), recv.read_chunk(4096, true))
            .await
            .expect("a message in time");
        match read {
            Ok(chunk) => buf.extend_from_slice(&chunk.expect("not finished").bytes),
            // A peer that cancels also puts its Cancel in the close frame.
            Err(quinn::ReadError::ConnectionLost(quinn::ConnectionError::ApplicationClosed(
                close,
            ))) => {
                let Ok(Decoded::Message(message, _)) = ControlMessage::decode(&close.reason) else {
                    panic!("a close without a Cancel: {close:?}")
                };
                return message;
            }
            Err(e) => panic!("read: {e}"),
        }
    }
}

/// A hand-driven sender sends a damaged chunk `bad` times, then the right one.
async fn damaged_chunks(bad: usize) -> (Result<Summary, TransferError>, Vec<u8>, Vec<u8>) {
    let (_dir, _src, out) = scratch();
    let peers = connect().await;
    let mut payload = vec![0u8; 1000];
    rand::rng().fill_bytes(&mut payload);
    let manifest = Manifest::new(vec![Entry::file(
        SafeName::new("f.bin").expect("name"),
        1000,
        Mode::Regular,
        1_700_000_000,
    )])
    .expect("manifest");
    let mut seen = Vec::new();
    let sender = async {
        let (mut send, mut recv) = peers.sender.open_bi().await.expect("bi");
        let mut bytes = Vec::new();
        ControlMessage::Hello { min: 1, max: 1 }.encode(&mut bytes);
        ControlMessage::Manifest(manifest).encode(&mut bytes);
        send.write_all(&bytes).await.expect("offer");
        let mut buf = Vec::new();
        assert!(matches!(
            read_control(&mut recv, &mut buf).await,
            ControlMessage::Hello { .. }
        ));
        assert!(matches!(
            read_control(&mut recv, &mut buf).await,
            ControlMessage::Accept(_)
        ));
        let mut data = peers.sender.open_uni().await.expect("uni");
        let header = ChunkHeader {
            file_id: 0,
            offset: 0,
            len: 1000,
            hash: *blake3::hash(&payload).as_bytes(),
        };
        let mut frame = Vec::new();
        header.encode(&mut frame);
        let mut damaged = payload.clone();
        damaged[500] ^= 1;
        for _ in 0..bad {
            data.write_all(&frame).await.expect("header");
            data.write_all(&damaged).await.expect("payload");
            let message = read_control(&mut recv, &mut buf).await;
            let stop = !matches!(message, ControlMessage::Resend { .. });
            seen.push(message);
            if stop {
                return;
            }
        }
        data.write_all(&frame).await.expect("header");
        data.write_all(&payload).await.expect("payload");
        seen.push(read_control(&mut recv, &mut buf).await);
        seen.push(read_control(&mut recv, &mut buf).await);
        let _ = send.finish();
        let _ = data.finish();
        let _ = tokio::time::timeout(Duration::from_secs(10), peers.sender.closed()).await;
    };
    let no_events = Events::none();
    let (_, received) = tokio::join!(
        sender,
        transfer::receive(
            &peers.receiver,
            &out,
            ReceiveOptions::default(),
            yes,
            &no_events
        ),
    );
    let written = std::fs::read(out.join("f.bin")).unwrap_or_default();
    let kinds = seen
        .iter()
        .map(|m| match m {
            ControlMessage::Resend { .. } => b'R',
            ControlMessage::FileDone { .. } => b'F',
            ControlMessage::Done => b'D',
            ControlMessage::Cancel { .. } => b'C',
            _ => b'?',
        })
        .collect();
    (
        received,
        if written == payload {
            b"same".to_vec()
        } else {
            written
        },
        kinds,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_chunk_on_the_wire_is_asked_for_again() {
    tokio::time::timeout(TEST_LIMIT, async {
        let (received, written, seen) = damaged_chunks(1).await;
        let summary = received.expect("received");
        assert_eq!(summary.resent_chunks, 1);
        assert_eq!(written, b"same");
        assert_eq!(seen, b"RFD");

        let (received, written, seen) = damaged_chunks(4).await;
        let err = received.expect_err("gave up");
        assert!(
            matches!(err, TransferError::TooManyBadChunks { .. }),
            "{err}"
        );
        assert!(written.is_empty(), "nothing under the final name");
        assert_eq!(seen, b"RRRC");
    })
    .await
    .expect("in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declined_offer_writes_nothing_and_the_sender_hears_why() {
    tokio::time::timeout(TEST_LIMIT, async {
        let (_dir, src, out) = scratch();
        let tree = src.join("t");
        random_file(&mut rand::rng(), &tree.join("x/y.bin"), 5000);
        let peers = connect().await;
        let sources = Sources::walk(&[tree], &[]).expect("walk");
        let no = |_: Offer| std::future::ready(false);
        let (sent, received) = both_sides(&peers, &sources, &out, no, &Events::none()).await;
        assert!(matches!(received, Err(TransferError::Declined)));
        let err = sent.expect_err("declined");
        assert!(
            matches!(
                err,
                TransferError::PeerCancelled {
                    reason: warren_proto::files::CancelReason::Declined,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(std::fs::read_dir(&out).expect("out").count(), 0);
    })
    .await
    .expect("in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_made_under_a_final_name_meanwhile_is_kept_and_the_transfer_stops() {
    tokio::time::timeout(TEST_LIMIT, async {
        let (_dir, src, out) = scratch();
        let mut rng = rand::rngs::StdRng::seed_from_u64(21);
        let (one, two) = (src.join("one.bin"), src.join("two.bin"));
        random_file(&mut rng, &one, 3 << 20);
        random_file(&mut rng, &two, 1000);
        let peers = connect().await;
        let sources = Sources::walk(&[one, two], &[]).expect("walk");
        // The offer passed the output folder's check; then someone else makes `two.bin`.
        let theirs = out.join("two.bin");
        let confirm = |_: Offer| {
            std::fs::write(&theirs, b"mine").expect("write");
            std::future::ready(true)
        };
        let (sent, received) = both_sides(&peers, &sources, &out, confirm, &Events::none()).await;
        // Finishing runs beside the network; its refusal still stops the transfer.
        let error = received.expect_err("the rename must be refused");
        assert!(matches!(error, TransferError::Write(_)), "{error}");
        assert!(error.to_string().contains("two.bin"), "{error}");
        assert!(sent.is_err(), "the sender hears of it");
        assert_eq!(std::fs::read(&theirs).expect("read"), b"mine");
    })
    .await
    .expect("in time");
}
