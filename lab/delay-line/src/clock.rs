//! Monotonic nanosecond timestamps and precise waiting.
//!
//! Every packet is stamped with `CLOCK_MONOTONIC` (a vDSO call, tens of ns)
//! when it is read; the forwarding loop sleeps in `ppoll` with a nanosecond
//! timeout until the next release time or the next readable packet. The
//! thread's timer slack is set to 1 ns so the kernel does not round those
//! wake-ups up by its default 50 us.

use std::io;
use std::os::fd::RawFd;

/// Nanoseconds on `CLOCK_MONOTONIC`.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Asks the kernel not to delay this thread's timer wake-ups.
pub fn set_precise_timers() {
    // SAFETY: PR_SET_TIMERSLACK takes an integer argument; no pointers.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
}

/// Waits until `fd` is readable or `timeout_ns` passed. Returns whether it
/// became readable. EINTR counts as a timeout.
pub fn wait_readable(fd: RawFd, timeout_ns: u64) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: one valid pollfd, a valid timespec, no signal mask change.
    let rc = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
    if rc < 0 {
        let err = io::Error::last_os_error();
        if err.kind() == io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(err);
    }
    Ok(rc > 0 && pfd.revents & libc::POLLIN != 0)
}
