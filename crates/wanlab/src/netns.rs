//! Network namespace plumbing through `ip(8)`: checking a namespace exists, moving a TUN into
//! it and addressing it, creating and deleting namespaces for [`crate::Lab`], and choosing the
//! TCP congestion control inside them. Addresses are confined to the documentation ranges so
//! the lab can never route anything to a real network.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

use anyhow::{Context, Result, bail};

/// RFC 5737 documentation ranges: the only addresses the lab will configure.
const DOC_NETS: [[u8; 3]; 3] = [[192, 0, 2], [198, 51, 100], [203, 0, 113]];

/// Checks that `a` is in 192.0.2.0/24, 198.51.100.0/24 or 203.0.113.0/24.
pub fn check_doc_addr(a: Ipv4Addr) -> Result<()> {
    let o = a.octets();
    if DOC_NETS.iter().any(|n| n[..] == o[..3]) && o[3] != 0 && o[3] != 255 {
        return Ok(());
    }
    bail!(
        "address {a} is outside the documentation ranges; the lab only uses 192.0.2.0/24, 198.51.100.0/24 or 203.0.113.0/24 (host part 1..254) so it can never reach a real network"
    )
}

/// Runs `ip ARGS`, turning a failure into an error that shows the command and ip's message.
pub fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output().with_context(|| {
        "cannot run `ip`: install iproute2 (the lab drives namespaces through it)".to_string()
    })?;
    if !out.status.success() {
        bail!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Fails unless the named namespace exists (as created by `ip netns add`).
pub fn check_exists(ns: &str) -> Result<()> {
    if ns.is_empty() || ns.contains('/') || ns.starts_with('.') {
        bail!("namespace name `{ns}` is not valid: use a plain name such as `wan-a`");
    }
    let p = Path::new("/run/netns").join(ns);
    if !p.exists() {
        bail!(
            "network namespace `{ns}` does not exist ({} not found): create it with `ip netns add {ns}`, or let `wanlab::Lab` create and delete its own",
            p.display()
        );
    }
    Ok(())
}

/// Moves interface `dev` into `ns`, gives it `local` with `peer` as the point-to-point far
/// end, and brings it and `lo` up.
pub fn attach(dev: &str, ns: &str, local: Ipv4Addr, peer: Ipv4Addr) -> Result<()> {
    check_doc_addr(local)?;
    check_doc_addr(peer)?;
    ip(&["link", "set", dev, "netns", ns])?;
    ip(&["-n", ns, "link", "set", "lo", "up"])?;
    // No IPv6 link-local address: it would only send router solicitations and MLD reports
    // through the line, noise in its counters.
    let _ = ip(&["-n", ns, "link", "set", dev, "addrgenmode", "none"]);
    let peer_cidr = format!("{peer}/32");
    ip(&[
        "-n",
        ns,
        "addr",
        "add",
        &local.to_string(),
        "peer",
        &peer_cidr,
        "dev",
        dev,
    ])?;
    ip(&["-n", ns, "link", "set", dev, "up"])?;
    Ok(())
}

/// Creates a namespace.
pub fn create(ns: &str) -> Result<()> {
    ip(&["netns", "add", ns])
}

/// Deletes a namespace (best effort: used on teardown).
pub fn delete(ns: &str) {
    let _ = ip(&["netns", "del", ns]);
}

/// Serialises edits of the init namespace's allowed list between labs in one process; the
/// file lock below does it between processes (a test and a bench started together).
static CC_LOCK: Mutex<()> = Mutex::new(());

const ALLOWED: &str = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";

/// Sets `net.ipv4.tcp_congestion_control` in each namespace. A new namespace may only pick
/// what the init namespace's `tcp_allowed_congestion_control` lists, so `cc` is added there
/// for the moment of the change and the old list is put back right after, whatever happened.
pub fn set_congestion_control(namespaces: &[&str], cc: &str) -> Result<()> {
    let _g = CC_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // Without it two processes could each save the other's temporary list as "old" and
    // leave cubic allowed for good. The lock is on the sysctl file itself, so no lock file
    // is left behind.
    let lock = std::fs::File::open(ALLOWED).with_context(|| format!("opening {ALLOWED}"))?;
    lock.lock().with_context(|| format!("locking {ALLOWED}"))?;
    let old = std::fs::read_to_string(ALLOWED)
        .with_context(|| format!("reading {ALLOWED}"))?
        .trim()
        .to_string();
    let added = !old.split_whitespace().any(|a| a == cc);
    if added {
        std::fs::write(ALLOWED, format!("{old} {cc}"))
            .with_context(|| format!("adding {cc} to {ALLOWED} (needs root)"))?;
    }
    let res = (|| {
        for ns in namespaces {
            let out = Command::new("ip")
                .args(["netns", "exec", ns, "sysctl", "-q", "-w"])
                .arg(format!("net.ipv4.tcp_congestion_control={cc}"))
                .output()
                .context("running sysctl in the namespace")?;
            if !out.status.success() {
                bail!(
                    "setting congestion control {cc} in {ns}: {} (is tcp_{cc} available? see /proc/sys/net/ipv4/tcp_available_congestion_control)",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
        }
        Ok(())
    })();
    if added {
        std::fs::write(ALLOWED, &old).with_context(|| format!("restoring {ALLOWED} to `{old}`"))?;
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_documentation_addresses() {
        assert!(check_doc_addr("198.51.100.1".parse().unwrap()).is_ok());
        assert!(check_doc_addr("203.0.113.9".parse().unwrap()).is_ok());
        assert!(check_doc_addr("10.0.0.1".parse().unwrap()).is_err());
        assert!(check_doc_addr("198.51.101.1".parse().unwrap()).is_err());
        assert!(check_doc_addr("192.0.2.255".parse().unwrap()).is_err());
    }

    #[test]
    fn missing_namespace_names_the_fix() {
        let e = check_exists("wanlab-surely-missing")
            .unwrap_err()
            .to_string();
        assert!(e.contains("ip netns add wanlab-surely-missing"), "{e}");
        assert!(check_exists("../etc").is_err());
    }
}
