//! `warren cert`: certificates for QUIC's `mtls` mode.
//!
//! * `warren cert ca --out DIR`: a development CA (`ca.pem`, `ca.key`).
//! * `warren cert server --ca DIR --name HOST [--name ...] --out DIR`: the server's
//!   certificate for the names and IPs clients dial (`server.pem`, `server.key`).
//! * `warren cert client --ca DIR --name NAME --out DIR`: a client certificate
//!   (`client.pem`, `client.key`).
//!
//! Keys are written with mode 0600; existing files are kept unless `--force` is given. The
//! work is done by [`warren::transport::quic::certs`], which the tests use too.

use std::path::{Path, PathBuf};

use clap::Subcommand;
use warren::transport::quic::certs::{self, CertAuthority, Overwrite};

/// What `warren cert` makes.
#[derive(Debug, Subcommand)]
pub enum CertCommand {
    /// A development certificate authority: signs the server and client certificates of
    /// QUIC mtls mode. Keep ca.key private (ideally offline); give ca.pem to servers and clients.
    #[command(after_help = "Example:\n  warren cert ca --out /etc/warren/ca")]
    Ca {
        /// Directory for ca.pem and ca.key (created if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Replace existing files.
        #[arg(long)]
        force: bool,
    },
    /// A server certificate signed by the CA, for the host names and IP addresses clients
    /// connect to.
    #[command(
        after_help = "Example:\n  warren cert server --ca /etc/warren/ca --name tunnel.example.com --name 203.0.113.7 --out /etc/warren/server"
    )]
    Server {
        /// Directory holding ca.pem and ca.key (from `warren cert ca`).
        #[arg(long, value_name = "DIR")]
        ca: PathBuf,
        /// A host name or IP address clients dial; repeat for several.
        #[arg(long = "name", value_name = "HOST", required = true)]
        names: Vec<String>,
        /// Directory for server.pem and server.key (created if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Replace existing files.
        #[arg(long)]
        force: bool,
    },
    /// A client certificate signed by the CA: the server admits clients presenting one.
    #[command(
        after_help = "Example:\n  warren cert client --ca /etc/warren/ca --name office-nas --out ./office-nas"
    )]
    Client {
        /// Directory holding ca.pem and ca.key (from `warren cert ca`).
        #[arg(long, value_name = "DIR")]
        ca: PathBuf,
        /// The client's name, shown in the server's logs (printable ASCII, up to 64 characters).
        #[arg(long, value_name = "NAME")]
        name: String,
        /// Directory for client.pem and client.key (created if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Replace existing files.
        #[arg(long)]
        force: bool,
    },
}

/// Runs a `warren cert` command; returns what to print, or the error message.
///
/// # Errors
///
/// A message naming the file or value at fault and what to do.
pub fn run(command: CertCommand) -> Result<String, String> {
    let overwrite = |force: bool| {
        if force {
            Overwrite::Replace
        } else {
            Overwrite::Never
        }
    };
    match command {
        CertCommand::Ca { out, force } => {
            let ca = CertAuthority::generate().map_err(|e| e.to_string())?;
            let written = ca
                .write(&out, overwrite(force))
                .map_err(|e| e.to_string())?;
            let sha = ca
                .cert_der()
                .map(|der| certs::sha256_hex(&der))
                .map_err(|e| e.to_string())?;
            Ok(format!(
                "{}\nCA certificate SHA-256: {sha}\nNext: `warren cert server --ca {} --name HOST --out DIR`, then `warren cert client --ca {} --name NAME --out DIR`.\nKeep {} private; servers and clients need only {}.\n",
                listing(&written),
                out.display(),
                out.display(),
                out.join(certs::CA_KEY_FILE).display(),
                out.join(certs::CA_CERT_FILE).display(),
            ))
        }
        CertCommand::Server {
            ca,
            names,
            out,
            force,
        } => {
            let authority = CertAuthority::load(&ca).map_err(|e| e.to_string())?;
            let issued = authority.issue_server(&names).map_err(|e| e.to_string())?;
            let written = certs::write_issued(
                &out,
                certs::SERVER_CERT_FILE,
                certs::SERVER_KEY_FILE,
                &issued,
                overwrite(force),
            )
            .map_err(|e| e.to_string())?;
            Ok(format!(
                "{}\nServer certificate for {} (SHA-256 {}), valid 825 days.\nThe server presents it and trusts clients signed by {}.\n",
                listing(&written),
                names.join(", "),
                issued.sha256_hex(),
                ca_file(&ca),
            ))
        }
        CertCommand::Client {
            ca,
            name,
            out,
            force,
        } => {
            let authority = CertAuthority::load(&ca).map_err(|e| e.to_string())?;
            let issued = authority.issue_client(&name).map_err(|e| e.to_string())?;
            let written = certs::write_issued(
                &out,
                certs::CLIENT_CERT_FILE,
                certs::CLIENT_KEY_FILE,
                &issued,
                overwrite(force),
            )
            .map_err(|e| e.to_string())?;
            Ok(format!(
                "{}\nClient certificate for {name:?} (SHA-256 {}), valid 825 days.\nThe client presents it and checks the server against {}.\n",
                listing(&written),
                issued.sha256_hex(),
                ca_file(&ca),
            ))
        }
    }
}

fn listing(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| format!("wrote {}", p.display()))
        .collect::<Vec<_>>()
        .join("\n")
}

fn ca_file(dir: &Path) -> String {
    dir.join(certs::CA_CERT_FILE).display().to_string()
}
