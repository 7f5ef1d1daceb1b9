//! Registry names as policy compares them. One repository has many spellings (`Reg.Example.`,
//! `reg.example:443`, `index.docker.io`), and a scope or prefix checked against one spelling
//! must not be passed by another: every name is brought to one form first, and prefixes match
//! whole path segments only (`reg/team` covers `reg/team/app`, never `reg/teammate`).

/// `host[:port]` in its one form: lower case, no trailing dot, no `:443` (HTTPS's own port),
/// and Docker Hub's other names as `docker.io`.
pub fn canonical_host(host: &str) -> String {
    let lower = host.to_ascii_lowercase();
    let (name, port) = split_port(&lower);
    let name = name.trim_end_matches('.');
    let name = match name {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => "docker.io",
        other => other,
    };
    match port {
        Some(p) if p != "443" => format!("{name}:{p}"),
        _ => name.to_string(),
    }
}

/// `host:port` split at its port, if it has one (an IPv6 host is in brackets).
fn split_port(host: &str) -> (&str, Option<&str>) {
    match host.rsplit_once(':') {
        Some((name, port))
            if !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && (!name.starts_with('[') || name.ends_with(']')) =>
        {
            (name, Some(port))
        }
        _ => (host, None),
    }
}

/// `host[:port]/repository` (no tag or digest) in its one form; a trailing `/` is dropped.
pub fn canonical(name: &str) -> String {
    let name = name.trim_end_matches('/');
    match name.split_once('/') {
        Some((host, path)) => format!("{}/{path}", canonical_host(host)),
        None => canonical_host(name),
    }
}

/// Whether `prefix` (a registry, or a registry and a repository prefix) covers repository
/// `name`, by whole path segments, both brought to their one form.
pub fn covers(prefix: &str, name: &str) -> bool {
    let (prefix, name) = (canonical(prefix), canonical(name));
    name == prefix
        || (name.starts_with(&prefix) && name.as_bytes().get(prefix.len()) == Some(&b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_registry_has_one_spelling() {
        assert_eq!(canonical_host("Reg.Example."), "reg.example");
        assert_eq!(canonical_host("reg.example:443"), "reg.example");
        assert_eq!(canonical_host("REG.example:5000"), "reg.example:5000");
        assert_eq!(canonical_host("index.docker.io"), "docker.io");
        assert_eq!(canonical_host("registry-1.docker.io:443"), "docker.io");
        assert_eq!(canonical_host("[::1]:5000"), "[::1]:5000");
        assert_eq!(canonical_host("[::1]"), "[::1]");
        assert_eq!(
            canonical("Reg.Example:443/team/app/"),
            "reg.example/team/app"
        );
    }

    #[test]
    fn prefixes_cover_whole_segments_in_any_spelling() {
        assert!(covers("reg.example/team", "reg.example/team/app"));
        assert!(covers("reg.example/team/", "REG.example.:443/team/app"));
        assert!(covers("reg.example/team", "reg.example/team"));
        assert!(!covers("reg.example/team", "reg.example/teammate"));
        assert!(!covers("reg.example/team", "reg.example.evil/team/app"));
        assert!(!covers("reg.example:5000/team", "reg.example/team/app"));
        assert!(covers("reg.example", "reg.example/anything"));
        assert!(covers(
            "docker.io/library",
            "index.docker.io/library/busybox"
        ));
    }
}
