//! TUN devices: create one through `/dev/net/tun` (`IFF_TUN | IFF_NO_PI`,
//! so reads and writes are bare IPv4/IPv6 packets), set its MTU and transmit
//! queue length, bring it up. With offload, `IFF_VNET_HDR` plus
//! `TUNSETOFFLOAD` (checksum, TSO4, TSO6): every read and write starts with a
//! 10-byte `virtio_net_hdr`, and the kernel passes TCP super-packets of up to
//! 64 KB through whole instead of segmenting them for us. The device lives as long as its file
//! descriptor: dropping [`Tun`] makes it (and its routes) vanish.

use crate::error::{Error, Result};
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

/// `_IOW('T', 202, int)` from `<linux/if_tun.h>`.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
/// `_IOW('T', 208, unsigned int)`; the offload flags are passed by value.
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const TUN_F_CSUM: libc::c_ulong = 0x01;
const TUN_F_TSO4: libc::c_ulong = 0x02;
const TUN_F_TSO6: libc::c_ulong = 0x04;
/// Size of `struct virtio_net_hdr`, the default header of `IFF_VNET_HDR`.
pub const VNET_HDR_LEN: usize = 10;
/// Largest IP packet the kernel hands over with offloads (a GSO packet).
pub const MAX_GSO_PACKET: usize = 65_535;
/// Interface ioctls from `<linux/sockios.h>`.
const SIOCGIFFLAGS: libc::c_ulong = 0x8913;
const SIOCSIFFLAGS: libc::c_ulong = 0x8914;
const SIOCSIFMTU: libc::c_ulong = 0x8922;
const SIOCSIFTXQLEN: libc::c_ulong = 0x8943;

/// `struct ifreq`: the name, then a 24-byte union of which we use the
/// leading `short` (flags) or `int` (mtu, qlen).
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    data: [u8; 24],
}

impl IfReq {
    fn new(name: &str) -> Self {
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            data: [0; 24],
        };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        req
    }
    fn set_short(&mut self, v: libc::c_short) {
        self.data[..2].copy_from_slice(&v.to_ne_bytes());
    }
    fn short(&self) -> libc::c_short {
        libc::c_short::from_ne_bytes([self.data[0], self.data[1]])
    }
    fn set_int(&mut self, v: libc::c_int) {
        self.data[..4].copy_from_slice(&v.to_ne_bytes());
    }
}

/// Checks an interface name the kernel will accept (1..15 bytes, no `/`,
/// whitespace or NUL).
pub fn check_ifname(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() < libc::IFNAMSIZ
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'/' && b != b':');
    if ok {
        Ok(())
    } else {
        Err(Error::Usage(format!(
            "invalid interface name '{name}': 1 to 15 printable characters"
        )))
    }
}

/// An open TUN device.
pub struct Tun {
    file: File,
    name: String,
}

impl Tun {
    /// Creates (or attaches to) the TUN device `name`, non-blocking; with
    /// `offload`, frames carry a virtio-net header and may be GSO packets.
    pub fn create(name: &str, offload: bool) -> Result<Tun> {
        check_ifname(name)?;
        let tun_err = |source| Error::Tun {
            name: name.to_string(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(tun_err)?;
        let mut req = IfReq::new(name);
        let vnet = if offload { IFF_VNET_HDR } else { 0 };
        req.set_short(IFF_TUN | IFF_NO_PI | vnet);
        // SAFETY: fd is open; req is a valid ifreq that outlives the call.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF as _, &mut req) };
        if rc < 0 {
            return Err(tun_err(io::Error::last_os_error()));
        }
        if offload {
            let flags = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6;
            // SAFETY: fd is open; TUNSETOFFLOAD takes its flags by value.
            if unsafe { libc::ioctl(file.as_raw_fd(), TUNSETOFFLOAD as _, flags) } < 0 {
                return Err(tun_err(io::Error::last_os_error()));
            }
        }
        let len = req
            .name
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(req.name.len());
        let name = String::from_utf8_lossy(&req.name[..len]).into_owned();
        Ok(Tun { file, name })
    }

    /// The device's name as the kernel registered it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Raw descriptor for `read`/`write`/`ppoll` in the forwarding loops.
    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Sets MTU and transmit queue length and brings the device up.
    pub fn configure(&self, mtu: u32, txqueuelen: u32) -> Result<()> {
        let ctl = control_socket(&self.name)?;
        let fail = |what: &'static str| Error::Interface {
            name: self.name.clone(),
            what,
            source: io::Error::last_os_error(),
        };
        let mut req = IfReq::new(&self.name);
        req.set_int(mtu as libc::c_int);
        // SAFETY: valid socket and ifreq.
        if unsafe { libc::ioctl(ctl.as_raw_fd(), SIOCSIFMTU as _, &mut req) } < 0 {
            return Err(fail("set MTU"));
        }
        let mut req = IfReq::new(&self.name);
        req.set_int(txqueuelen as libc::c_int);
        // SAFETY: valid socket and ifreq.
        if unsafe { libc::ioctl(ctl.as_raw_fd(), SIOCSIFTXQLEN as _, &mut req) } < 0 {
            return Err(fail("set txqueuelen"));
        }
        let mut req = IfReq::new(&self.name);
        // SAFETY: valid socket and ifreq.
        if unsafe { libc::ioctl(ctl.as_raw_fd(), SIOCGIFFLAGS as _, &mut req) } < 0 {
            return Err(fail("get flags"));
        }
        let flags = req.short() | libc::IFF_UP as libc::c_short;
        req.set_short(flags);
        // SAFETY: valid socket and ifreq.
        if unsafe { libc::ioctl(ctl.as_raw_fd(), SIOCSIFFLAGS as _, &mut req) } < 0 {
            return Err(fail("bring up"));
        }
        Ok(())
    }
}

fn control_socket(name: &str) -> Result<OwnedFd> {
    // SAFETY: plain socket(2) call; the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(Error::Interface {
            name: name.to_string(),
            what: "control socket",
            source: io::Error::last_os_error(),
        });
    }
    // SAFETY: fd is a freshly created, owned descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Returns true when an interface called `name` exists in this namespace.
pub fn interface_exists(name: &str) -> bool {
    match CString::new(name) {
        // SAFETY: valid NUL-terminated string.
        Ok(c) => unsafe { libc::if_nametoindex(c.as_ptr()) != 0 },
        Err(_) => false,
    }
}
