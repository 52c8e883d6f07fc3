//! What the server and client builders share.
//!
//! Both sides of a session carry the same security settings (PSK, default token, transport,
//! ciphers, `insecure`, the handshake deadline) and an optional admin API. The two builders
//! wrap different config types, so the shared setters are generated once here rather than
//! written twice.

/// Expands to the setters of the settings both configs have, for a builder whose config
/// lives in `self.config`.
macro_rules! common_setters {
    () => {
        /// The pre-shared key (required, at least 16 characters).
        pub fn psk(mut self, psk: impl Into<String>) -> Self {
            self.config.psk = $crate::crypto::secret::Secret::new(psk);
            self
        }

        /// Token for services without their own.
        pub fn default_token(mut self, token: impl Into<String>) -> Self {
            self.config.default_token = Some($crate::crypto::secret::Secret::new(token));
            self
        }

        /// `noise` (default), `quic`, `tls`, `wss`, `ws` or plaintext `tcp` (needs
        /// `insecure`).
        pub fn transport(mut self, transport: $crate::config::Transport) -> Self {
            self.config.transport = transport;
            self.config.transports.clear();
            self
        }

        /// Several transports (`transports = [...]`): a server listens on all of them, a
        /// client tries them in this order. An empty list keeps the one transport.
        pub fn transports(mut self, list: Vec<$crate::config::TransportEntry>) -> Self {
            if let Some(first) = list.first() {
                self.config.transport = first.transport;
            }
            self.config.transports = list;
            self
        }

        /// Record ciphers, most preferred first.
        pub fn ciphers(mut self, ciphers: Vec<$crate::CipherSuite>) -> Self {
            self.config.ciphers = ciphers;
            self
        }

        /// Whether measured speed (`Fastest`, the default) or the client's `ciphers`
        /// order (`Ordered`) picks the cipher.
        pub fn cipher_choice(mut self, choice: $crate::CipherChoice) -> Self {
            self.config.cipher_choice = choice;
            self
        }

        /// Allows weak secrets and the plaintext transport.
        pub fn insecure(mut self, insecure: bool) -> Self {
            self.config.insecure = insecure;
            self
        }

        /// The QUIC transport's settings (with `transport(Transport::Quic)`).
        pub fn quic(mut self, quic: $crate::config::quic::QuicConfig) -> Self {
            self.config.quic = quic;
            self
        }

        /// WebSocket path (and, on a client, Host) of `ws` / `wss`.
        pub fn ws(mut self, ws: $crate::config::web::WsConfig) -> Self {
            self.config.ws = ws;
            self
        }

        /// One deadline for connect, handshake, hello and auth.
        pub fn handshake_timeout(mut self, timeout: std::time::Duration) -> Self {
            self.config.handshake_timeout = timeout;
            self
        }

        /// Serves the admin API and `/metrics` on `bind`, requiring `token` as a bearer token
        /// when given (a non-loopback `bind` needs one).
        pub fn admin(mut self, bind: std::net::SocketAddr, token: Option<&str>) -> Self {
            self.config.admin = Some($crate::config::AdminConfig {
                bind,
                token: token.map($crate::crypto::secret::Secret::new),
                hosts: Vec::new(),
            });
            self
        }

        /// Holds service `name` (reverse or forward) to `bytes_per_second` each way, shared
        /// by all of its connections.
        pub fn bandwidth_limit(mut self, name: impl Into<String>, bytes_per_second: u64) -> Self {
            self.bandwidth_limits.insert(name.into(), bytes_per_second);
            self
        }

        /// Compresses what this side sends for tcp service `name` (reverse or forward) with
        /// `codec`.
        pub fn compression(mut self, name: impl Into<String>, codec: $crate::Codec) -> Self {
            self.compression.insert(name.into(), codec);
            self
        }
    };
}

pub(crate) use common_setters;
