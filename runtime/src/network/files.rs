//! The files a sandbox with a network gets: `/etc/resolv.conf` from the host's (without
//! nameservers on the host's loopback, which the sandbox cannot reach), and `/etc/hosts`
//! naming the sandbox by its address.

/// Public resolvers, for a host whose only nameservers are on its loopback (a local cache
/// such as systemd-resolved), as nerdctl and Docker fall back.
const FALLBACK_NAMESERVERS: [&str; 2] = ["8.8.8.8", "8.8.4.4"];

/// The sandbox's resolv.conf from the host's text.
pub fn resolv_conf(host: &str) -> String {
    let mut out = String::new();
    let mut servers = 0;
    for line in host.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["nameserver", addr, ..] => {
                let local = addr
                    .parse::<std::net::IpAddr>()
                    .map_or(true, |a| a.is_loopback());
                if !local {
                    out.push_str(&format!("nameserver {addr}\n"));
                    servers += 1;
                }
            }
            ["search" | "domain" | "options", ..] => {
                out.push_str(&words.join(" "));
                out.push('\n');
            }
            _ => {}
        }
    }
    if servers == 0 {
        for s in FALLBACK_NAMESERVERS {
            out.push_str(&format!("nameserver {s}\n"));
        }
    }
    out
}

/// The sandbox's hosts file.
pub fn hosts(hostname: &str, addresses: &[String]) -> String {
    let mut out = String::from("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
    for a in addresses {
        if !hostname.is_empty() {
            out.push_str(&format!("{a}\t{hostname}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_nameservers_are_dropped_and_replaced_when_none_is_left() {
        let r = resolv_conf("# made by x\nnameserver 127.0.0.53\noptions edns0\nsearch lan\n");
        assert_eq!(
            r,
            "options edns0\nsearch lan\nnameserver 8.8.8.8\nnameserver 8.8.4.4\n"
        );
        let r = resolv_conf("nameserver 10.0.0.2\nnameserver ::1\n");
        assert_eq!(r, "nameserver 10.0.0.2\n");
    }

    #[test]
    fn hosts_name_the_sandbox_by_its_address() {
        let h = hosts("web", &["10.77.0.4".into()]);
        assert!(h.contains("10.77.0.4\tweb\n") && h.starts_with("127.0.0.1\tlocalhost"));
    }
}
