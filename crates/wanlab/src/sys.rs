//! The few Linux calls std does not wrap: creating a TUN device, a nanosecond `ppoll`, the
//! timer slack, thread ids and blocking/waiting for signals. All `unsafe` of the crate lives
//! here, each call small enough to check by eye.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

/// `_IOW('T', 202, int)` from `<linux/if_tun.h>`.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    // The kernel's `struct ifreq` is a 16-byte name plus a 24-byte union.
    _pad: [u8; 22],
}

/// Opens a new non-blocking TUN device (IFF_TUN | IFF_NO_PI: bare IP packets, no header)
/// named `name`. The device lives as long as the returned file, in whichever namespace it is
/// moved to, so nothing needs removing afterwards.
pub fn open_tun(name: &str) -> io::Result<File> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface name `{name}` must be 1..15 bytes"),
        ));
    }
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/net/tun")?;
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: IFF_TUN | IFF_NO_PI,
        _pad: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: `req` is a properly sized, initialised `struct ifreq` that outlives the call.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), TUNSETIFF as _, &mut req as *mut IfReq) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(f)
}

/// Waits until one of `fds` is readable or `timeout` passes, with nanosecond resolution
/// (`poll()` only has milliseconds, which alone would cost up to 1 ms of delay accuracy).
/// With no fds it is a precise sleep. Returns whether anything is readable.
pub fn wait_readable(fds: &[&File], timeout: Duration) -> io::Result<bool> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|f| libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `pfds` holds `len` valid pollfds (or none), a valid timespec, no mask change.
    let rc = unsafe {
        libc::ppoll(
            pfds.as_mut_ptr(),
            pfds.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(e);
    }
    Ok(rc > 0)
}

/// Sets this thread's timer slack to 1 ns. The default 50 µs lets the kernel batch our
/// wake-ups late by that much, which is pure error for a delay line.
pub fn set_timer_slack_min() {
    // SAFETY: prctl with integer arguments only.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
}

/// This thread's kernel id, for reading its CPU time from /proc/self/task/TID/stat.
pub fn gettid() -> i32 {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::gettid() }
}

/// Clock ticks per second for /proc stat times.
pub fn clock_ticks() -> u64 {
    // SAFETY: sysconf with a constant name.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as u64 } else { 100 }
}

/// Blocks SIGINT and SIGTERM in this thread and every thread it spawns afterwards, so they
/// are only ever taken by [`wait_stop_signal`] and no handler runs in the forwarding threads.
pub fn block_stop_signals() -> io::Result<()> {
    let set = stop_set();
    // SAFETY: valid sigset pointer, no old-set out-pointer.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

fn stop_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}

/// Waits up to `timeout` for SIGINT/SIGTERM (blocked beforehand). Returns the signal number.
pub fn wait_stop_signal(timeout: Duration) -> Option<i32> {
    let set = stop_set();
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: valid set and timespec; the siginfo out-pointer may be null.
    let rc = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &ts) };
    (rc > 0).then_some(rc)
}

/// Sends SIGTERM to one process, by PID (only ever a child we started).
pub fn terminate(pid: u32) -> io::Result<()> {
    // SAFETY: kill with a specific positive pid and a constant signal.
    let rc = unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Puts this thread in SCHED_FIFO at `prio`. A delay line's wake-ups are its measurement:
/// under CFS a busy host delays them by milliseconds, a real-time thread preempts the hogs.
/// The lab sleeps between packets, and the kernel's RT throttling still bounds it.
pub fn set_realtime(prio: i32) -> io::Result<()> {
    let p = libc::sched_param {
        sched_priority: prio,
    };
    // SAFETY: a valid sched_param for the calling thread (pid 0).
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
