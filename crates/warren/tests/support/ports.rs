//! Free loopback ports for tests whose configs name a port (reloads keep it; config
//! files of the real binary refuse port 0).

/// Ports [`free_port`] picks from: below Linux's ephemeral range (32768–60999), so no
/// outgoing connection of any test (curl, a client dialling its target) can take a picked
/// port between the pick and the child process binding it, as port 0 picks allowed (a
/// server then failed with "address already in use"). Above the `allow_ports` ranges the
/// tests use (20000–29999).
const PICK_FROM: std::ops::RangeInclusive<u16> = 10_000..=19_999;

/// A loopback port free a moment ago for both TCP and UDP (QUIC servers listen on UDP):
/// a random one of [`PICK_FROM`] that binds, else whatever port 0 gives.
pub fn free_port() -> u16 {
    let free = |port: u16| {
        std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
            && std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok()
    };
    (0..200)
        .map(|_| rand::random_range(PICK_FROM))
        .find(|port| free(*port))
        .unwrap_or_else(|| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|listener| listener.local_addr())
                .expect("bind 127.0.0.1:0")
                .port()
        })
}
