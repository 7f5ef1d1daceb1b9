//! A network namespace for a sandbox whose spec asks for a new one without naming it.
//!
//! runsc's netstack copies the interfaces of the namespace it starts in and refuses the host's
//! own. CRI (through CNI) and Docker always name a prepared namespace; `ctr run` does not, and
//! runc would then create an empty one. The shim does the same for runsc: a fresh namespace with
//! only loopback (up), bind-mounted so it outlives the thread that made it, removed on delete.

use std::{
    io,
    path::{Path, PathBuf},
};

use serde_json::Value;

/// True when the spec wants a new, unnamed network namespace and runsc will use netstack
/// with it (not `host`, which shares the host's, nor `none`, which has only loopback).
pub fn needs_private_netns(spec: &Value, runsc_network: Option<&str>) -> bool {
    if matches!(runsc_network, Some("host") | Some("none")) {
        return false;
    }
    spec.pointer("/linux/namespaces")
        .and_then(Value::as_array)
        .is_some_and(|nss| {
            nss.iter().any(|ns| {
                ns.get("type").and_then(Value::as_str) == Some("network")
                    && ns
                        .get("path")
                        .and_then(Value::as_str)
                        .is_none_or(str::is_empty)
            })
        })
}

/// Points the spec's network namespace at `path`.
pub fn set_netns_path(spec: &mut Value, path: &Path) {
    if let Some(nss) = spec
        .pointer_mut("/linux/namespaces")
        .and_then(Value::as_array_mut)
    {
        for ns in nss {
            if ns.get("type").and_then(Value::as_str) == Some("network") {
                ns["path"] = Value::String(path.display().to_string());
            }
        }
    }
}

/// Where the shim keeps the namespace of container `id` in containerd namespace `namespace`.
pub fn netns_path(options_root: &Path, namespace: &str, id: &str) -> PathBuf {
    // One directory per namespace: "a-b"/"c" and "a"/"b-c" must not meet.
    options_root.join(".netns").join(namespace).join(id)
}

/// Creates a new network namespace with loopback up and bind-mounts it at `path`.
pub fn create(path: &Path) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    std::fs::File::create(path)?;
    let target = path.to_path_buf();
    // unshare(CLONE_NEWNET) changes only the calling thread: do it in a throwaway one.
    let made = std::thread::spawn(move || -> io::Result<()> {
        // SAFETY: plain syscalls on this thread's own namespace and on C strings we own.
        unsafe {
            if libc::unshare(libc::CLONE_NEWNET) != 0 {
                return Err(io::Error::last_os_error());
            }
            loopback_up()?;
            let src = c"/proc/thread-self/ns/net";
            let dst = std::ffi::CString::new(target.as_os_str().as_encoded_bytes())
                .map_err(io::Error::other)?;
            if libc::mount(
                src.as_ptr(),
                dst.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    })
    .join()
    .map_err(|_| io::Error::other("network namespace thread panicked"))?;
    if made.is_err() {
        let _ = std::fs::remove_file(path);
    }
    made
}

/// Brings `lo` up in the calling thread's network namespace.
unsafe fn loopback_up() -> io::Result<()> {
    let sock = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
    if sock < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut req: libc::ifreq = std::mem::zeroed();
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    let mut result = Ok(());
    if libc::ioctl(sock, libc::SIOCGIFFLAGS, &mut req) < 0 {
        result = Err(io::Error::last_os_error());
    } else {
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(sock, libc::SIOCSIFFLAGS, &req) < 0 {
            result = Err(io::Error::last_os_error());
        }
    }
    libc::close(sock);
    result
}

/// Gives interface `ifname` of the namespace at `path` the IPv4 address `addr`/`prefix`
/// (the interface's primary one).
pub fn set_ipv4_address(
    path: &Path,
    ifname: &str,
    addr: std::net::Ipv4Addr,
    prefix: u8,
) -> io::Result<()> {
    if ifname.len() >= libc::IFNAMSIZ || prefix > 32 {
        return Err(io::Error::other(format!(
            "bad interface {ifname} or prefix {prefix}"
        )));
    }
    let ns = std::fs::File::open(path)?;
    let ifname = ifname.to_string();
    std::thread::spawn(move || -> io::Result<()> {
        use std::os::fd::AsRawFd;
        // SAFETY: setns on this throwaway thread, then ioctls on a socket it owns, with
        // requests it zeroed and filled.
        unsafe {
            if libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                return Err(io::Error::last_os_error());
            }
            let sock = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
            if sock < 0 {
                return Err(io::Error::last_os_error());
            }
            let set = |request: libc::c_ulong, value: std::net::Ipv4Addr| -> io::Result<()> {
                let mut req: libc::ifreq = std::mem::zeroed();
                for (dst, src) in req.ifr_name.iter_mut().zip(ifname.bytes()) {
                    *dst = src as libc::c_char;
                }
                let sin =
                    &mut req.ifr_ifru.ifru_addr as *mut libc::sockaddr as *mut libc::sockaddr_in;
                (*sin).sin_family = libc::AF_INET as libc::sa_family_t;
                (*sin).sin_addr.s_addr = u32::from(value).to_be();
                if libc::ioctl(sock, request, &req) < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            };
            let mask =
                std::net::Ipv4Addr::from(u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0));
            let result =
                set(libc::SIOCSIFADDR, addr).and_then(|()| set(libc::SIOCSIFNETMASK, mask));
            libc::close(sock);
            result
        }
    })
    .join()
    .map_err(|_| io::Error::other("network namespace thread panicked"))?
}

/// The IPv4 addresses (interface, address, prefix length) of the interfaces other than
/// loopback in the namespace at `path`.
pub fn ipv4_addresses(path: &Path) -> io::Result<Vec<(String, std::net::Ipv4Addr, u8)>> {
    let ns = std::fs::File::open(path)?;
    std::thread::spawn(
        move || -> io::Result<Vec<(String, std::net::Ipv4Addr, u8)>> {
            use std::os::fd::AsRawFd;
            let mut found = Vec::new();
            // SAFETY: setns on this throwaway thread; getifaddrs' list is read while it is ours
            // and freed once.
            unsafe {
                if libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                    return Err(io::Error::last_os_error());
                }
                let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
                if libc::getifaddrs(&mut list) != 0 {
                    return Err(io::Error::last_os_error());
                }
                let mut at = list;
                while !at.is_null() {
                    let a = &*at;
                    at = a.ifa_next;
                    if a.ifa_addr.is_null()
                        || a.ifa_netmask.is_null()
                        || i32::from((*a.ifa_addr).sa_family) != libc::AF_INET
                        || a.ifa_flags & libc::IFF_LOOPBACK as u32 != 0
                    {
                        continue;
                    }
                    let addr = &*(a.ifa_addr as *const libc::sockaddr_in);
                    let mask = &*(a.ifa_netmask as *const libc::sockaddr_in);
                    let name = std::ffi::CStr::from_ptr(a.ifa_name)
                        .to_string_lossy()
                        .into_owned();
                    found.push((
                        name,
                        std::net::Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr)),
                        u32::from_be(mask.sin_addr.s_addr).count_ones() as u8,
                    ));
                }
                libc::freeifaddrs(list);
            }
            Ok(found)
        },
    )
    .join()
    .map_err(|_| io::Error::other("network namespace thread panicked"))?
}

/// Unmounts and removes a namespace made by [`create`]; missing is fine.
pub fn remove(path: &Path) {
    if let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) {
        // SAFETY: umount2 on a C string we own.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
    let _ = std::fs::remove_file(path);
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn only_unnamed_network_namespaces_with_netstack_need_one() {
        let unnamed = json!({"linux": {"namespaces": [{"type": "pid"}, {"type": "network"}]}});
        let named =
            json!({"linux": {"namespaces": [{"type": "network", "path": "/var/run/netns/cni-1"}]}});
        let none = json!({"linux": {"namespaces": [{"type": "pid"}]}});
        assert!(needs_private_netns(&unnamed, None));
        assert!(needs_private_netns(&unnamed, Some("sandbox")));
        assert!(!needs_private_netns(&unnamed, Some("host")));
        assert!(!needs_private_netns(&unnamed, Some("none")));
        assert!(!needs_private_netns(&named, None));
        assert!(!needs_private_netns(&none, None));
    }

    #[test]
    fn sets_the_path() {
        let mut spec = json!({"linux": {"namespaces": [{"type": "pid"}, {"type": "network"}]}});
        set_netns_path(&mut spec, Path::new("/run/chalk/.netns/default-c1"));
        assert_eq!(
            spec["linux"]["namespaces"][1]["path"],
            "/run/chalk/.netns/default-c1"
        );
        assert!(spec["linux"]["namespaces"][0].get("path").is_none());
        assert!(!needs_private_netns(&spec, None));
    }

    #[test]
    fn path_is_per_namespace_and_id() {
        assert_eq!(
            netns_path(Path::new("/run/chalk"), "k8s.io", "c1"),
            PathBuf::from("/run/chalk/.netns/k8s.io/c1")
        );
    }
}
