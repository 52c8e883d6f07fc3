//! Which TCP congestion control Warren's own tunnel connections run (`tcp_congestion`).
//!
//! Measured in the WAN lab (issue 44): across 40 ms and 1 % random loss, cubic — Linux's
//! usual default — carries 3.5-4 Mbit/s of a 100 Mbit/s link through the tunnel; the
//! kernel's BBR on the same sockets carries 88-94, while keeping its own drops at the
//! bottleneck near 1 %. Every visitor of a TCP transport has its own data channel, so a
//! per-socket choice (`TCP_CONGESTION`) is all it takes, without touching the system's
//! default for anything else. Hence the default, [`TcpCongestion::Auto`]: BBR where the
//! kernel has it and lets us pick it, silently the system default elsewhere.
//!
//! Only the tunnel's sockets (client to server, both ends) are set: visitors' and
//! targets' connections are the user's business.

use std::io;

use socket2::SockRef;

/// The algorithm [`TcpCongestion::Auto`] asks for.
pub const PREFERRED: &str = "bbr";

/// The longest name the kernel knows (`TCP_CA_NAME_MAX` is 16 with its NUL).
const NAME_MAX: usize = 15;

/// The `tcp_congestion` setting.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TcpCongestion {
    /// [`PREFERRED`] where available and allowed; the system default otherwise.
    #[default]
    Auto,
    /// The system default (`net.ipv4.tcp_congestion_control`): Warren sets nothing.
    System,
    /// This algorithm, by its kernel name; the system default (with a warning at start)
    /// where the kernel refuses it.
    Named(String),
}

impl TcpCongestion {
    /// Parses the setting: `"auto"`, `"system"` or a kernel algorithm name.
    ///
    /// # Errors
    /// A name that cannot be a kernel algorithm's, saying what is accepted.
    pub fn parse(text: &str) -> Result<TcpCongestion, String> {
        match text {
            "auto" => Ok(TcpCongestion::Auto),
            "system" => Ok(TcpCongestion::System),
            name if !name.is_empty()
                && name.len() <= NAME_MAX
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') =>
            {
                Ok(TcpCongestion::Named(name.to_owned()))
            }
            other => Err(format!(
                "`{other}` is not a TCP congestion control: write \"auto\" (BBR where the kernel \
                 has it), \"system\" (the system default) or a kernel name such as \"bbr\" or \
                 \"cubic\" (see /proc/sys/net/ipv4/tcp_available_congestion_control)"
            )),
        }
    }

    /// The algorithm to ask the kernel for, if any.
    pub fn wanted(&self) -> Option<&str> {
        match self {
            TcpCongestion::Auto => Some(PREFERRED),
            TcpCongestion::System => None,
            TcpCongestion::Named(name) => Some(name),
        }
    }

    /// Asks the kernel for the setting's algorithm on `socket` (a listener's choice is
    /// inherited by the connections it accepts). Failure leaves the system default, which
    /// is what the setting promises; [`TcpCongestion::check`] says so once at start.
    pub fn apply(&self, socket: SockRef<'_>) {
        if let Some(name) = self.wanted() {
            let _ = set(socket, name);
        }
    }

    /// What connections will run under this setting, found on a throwaway socket: the
    /// algorithm, and for a named one the kernel refused, why (for a warning at start).
    pub fn check(&self) -> Checked {
        let probe = match socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None) {
            Ok(probe) => probe,
            Err(error) => {
                return Checked {
                    algorithm: None,
                    refused: Some(format!("cannot open a socket to check: {error}")),
                };
            }
        };
        let refused = self.wanted().and_then(|name| {
            set(SockRef::from(&probe), name)
                .err()
                .filter(|_| matches!(self, TcpCongestion::Named(_)))
                .map(|error| refusal(name, &error))
        });
        Checked {
            algorithm: in_use(SockRef::from(&probe)),
            refused,
        }
    }

    /// Checks the setting once at start: a named algorithm the kernel refuses is a warning
    /// naming the fix (event `tcp_congestion_refused`); returns what connections will run,
    /// for the start line.
    pub fn announce(&self, side: &'static str) -> String {
        let checked = self.check();
        if let Some(why) = &checked.refused {
            tracing::warn!(event = "tcp_congestion_refused", side, setting = %self, "{why}");
        }
        checked
            .algorithm
            .unwrap_or_else(|| "the system's".to_owned())
    }
}

impl std::fmt::Display for TcpCongestion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TcpCongestion::Auto => f.write_str("auto"),
            TcpCongestion::System => f.write_str("system"),
            TcpCongestion::Named(name) => f.write_str(name),
        }
    }
}

/// What [`TcpCongestion::check`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// The algorithm connections get (`None` where the platform cannot say).
    pub algorithm: Option<String>,
    /// Why the kernel refused an explicitly named algorithm, with the fix.
    pub refused: Option<String>,
}

/// The algorithm `socket` runs, as the kernel reports it; `None` where it cannot say.
pub fn in_use(socket: SockRef<'_>) -> Option<String> {
    #[cfg(any(target_os = "linux", target_os = "freebsd"))]
    {
        let raw = socket.tcp_congestion().ok()?;
        let name = raw.split(|&b| b == 0).next()?;
        (!name.is_empty()).then(|| String::from_utf8_lossy(name).into_owned())
    }
    #[cfg(not(any(target_os = "linux", target_os = "freebsd")))]
    {
        let _ = socket;
        None
    }
}

#[cfg(any(target_os = "linux", target_os = "freebsd"))]
fn set(socket: SockRef<'_>, name: &str) -> io::Result<()> {
    socket.set_tcp_congestion(name.as_bytes())
}

#[cfg(not(any(target_os = "linux", target_os = "freebsd")))]
fn set(_socket: SockRef<'_>, _name: &str) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "this platform has no per-socket congestion control",
    ))
}

/// Why the kernel would not run `name`, and what to do about it.
fn refusal(name: &str, error: &io::Error) -> String {
    match error.kind() {
        io::ErrorKind::NotFound => format!(
            "the kernel has no TCP congestion control `{name}` (not in \
             /proc/sys/net/ipv4/tcp_available_congestion_control): load it (`modprobe \
             tcp_{name}`) or pick another; connections use the system default"
        ),
        io::ErrorKind::PermissionDenied => format!(
            "the kernel does not let this process pick `{name}`: add it to \
             net.ipv4.tcp_allowed_congestion_control (sysctl) or run with CAP_NET_ADMIN; \
             connections use the system default"
        ),
        _ => format!(
            "cannot use TCP congestion control `{name}`: {error}; connections use the system default"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_keywords_and_kernel_names() {
        assert_eq!(TcpCongestion::parse("auto"), Ok(TcpCongestion::Auto));
        assert_eq!(TcpCongestion::parse("system"), Ok(TcpCongestion::System));
        assert_eq!(
            TcpCongestion::parse("cubic"),
            Ok(TcpCongestion::Named("cubic".into()))
        );
        for bad in ["", "BBR", "bbr ", "a-b", "sixteen_letters_"] {
            let error = TcpCongestion::parse(bad).unwrap_err();
            assert!(error.contains("\"auto\""), "{bad:?}: {error}");
        }
        assert_eq!(TcpCongestion::default().wanted(), Some(PREFERRED));
        assert_eq!(TcpCongestion::System.wanted(), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_socket_runs_what_was_asked_for_or_the_system_default() {
        let system = TcpCongestion::System.check();
        assert!(system.algorithm.is_some(), "{system:?}");
        assert_eq!(system.refused, None);
        // Reno is built into every Linux kernel and never restricted.
        let reno = TcpCongestion::Named("reno".into()).check();
        assert_eq!(reno.algorithm.as_deref(), Some("reno"));
        let missing = TcpCongestion::Named("nosuchcc".into()).check();
        assert_eq!(missing.algorithm, system.algorithm);
        let why = missing.refused.expect("refused");
        assert!(
            why.contains("nosuchcc") && why.contains("system default"),
            "{why}"
        );
        // Auto never complains: it falls back silently.
        let auto = TcpCongestion::Auto.check();
        assert_eq!(auto.refused, None);
        assert!(auto.algorithm.is_some());
    }
}
