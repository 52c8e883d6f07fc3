//! Seal and open throughput of the record layer, per cipher suite, for 16 KiB and 64 KiB
//! records (payload bytes per second).
//!
//! Seal reuses one buffer, as the transport does. Open needs a fresh ciphertext and an
//! opener at the matching record number for every call, so each batch of 8 records is set
//! up outside the timed region (8 x 64 KiB stays in L2, like the seal buffer stays in L1/L2).

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use warren::crypto::record::{
    DirectionKeys, HEADER_LEN, MAX_RECORD_LEN, Opener, RecordKind, Sealer,
};
use warren_proto::CipherSuite;

const SUITES: [CipherSuite; 6] = [
    CipherSuite::Aes128Gcm,
    CipherSuite::Aes256Gcm,
    CipherSuite::ChaCha20Poly1305,
    CipherSuite::Aegis128L,
    CipherSuite::Aegis256,
    CipherSuite::None,
];

const SIZES: [(usize, &str); 2] = [(16 * 1024, "16KiB"), (64 * 1024, "64KiB")];

fn record(len: usize) -> Vec<u8> {
    let mut buf = Vec::with_capacity(MAX_RECORD_LEN);
    buf.resize(HEADER_LEN, 0);
    buf.extend((0..len).map(|i| i as u8));
    buf
}

fn seal(c: &mut Criterion) {
    let mut group = c.benchmark_group("seal");
    for suite in SUITES {
        let keys = DirectionKeys::derive(suite, b"bench secret", b"c2s");
        for (len, name) in SIZES {
            group.throughput(Throughput::Bytes(len as u64));
            let mut sealer = Sealer::new(suite, keys.clone());
            let mut buf = record(len);
            group.bench_function(format!("{}/{name}", suite.name()), |b| {
                b.iter(|| {
                    buf.truncate(HEADER_LEN + len);
                    sealer
                        .seal(RecordKind::Data, black_box(&mut buf))
                        .expect("valid record");
                })
            });
        }
    }
    group.finish();
}

fn open(c: &mut Criterion) {
    let mut group = c.benchmark_group("open");
    for suite in SUITES {
        let keys = DirectionKeys::derive(suite, b"bench secret", b"c2s");
        for (len, name) in SIZES {
            group.throughput(Throughput::Bytes(len as u64));
            let mut sealed = record(len);
            Sealer::new(suite, keys.clone())
                .seal(RecordKind::Data, &mut sealed)
                .expect("valid record");
            let header: [u8; HEADER_LEN] = sealed[..HEADER_LEN].try_into().expect("header");
            group.bench_function(format!("{}/{name}", suite.name()), |b| {
                b.iter_batched_ref(
                    || (Opener::new(suite, keys.clone()), sealed.clone()),
                    |(opener, rec)| {
                        let n = opener
                            .open(header, black_box(&mut rec[HEADER_LEN..]))
                            .expect("authentic record");
                        black_box(n);
                    },
                    BatchSize::NumIterations(8),
                )
            });
        }
    }
    group.finish();
}

/// Fixed cost per record (empty payload): key schedule reuse for aws-lc, per-record state
/// initialisation for AEGIS, nonce and header work for all.
fn overhead(c: &mut Criterion) {
    let mut group = c.benchmark_group("seal-empty");
    for suite in SUITES {
        let keys = DirectionKeys::derive(suite, b"bench secret", b"c2s");
        let mut sealer = Sealer::new(suite, keys);
        let mut buf = record(0);
        group.bench_function(suite.name(), |b| {
            b.iter(|| {
                buf.truncate(HEADER_LEN);
                sealer
                    .seal(RecordKind::Data, black_box(&mut buf))
                    .expect("valid record");
            })
        });
    }
    group.finish();
}

criterion_group!(benches, seal, open, overhead);
criterion_main!(benches);
