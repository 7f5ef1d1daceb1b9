//! What a sandbox's spec asks of the network: `chalk.io/network` names a CNI network (or
//! `none`), `chalk.io/ports` lists published ports as `-p` takes them, comma-separated.

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use chalk_labels::{NETWORK_ANNOTATION, PORTS_ANNOTATION};

/// A sandbox's network request, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub network: String,
    pub ports: Vec<PortMapping>,
}

/// One published port: connections to `host_port` (on `host_ip`, or every host address)
/// reach `container_port` in the sandbox. In the shape CNI's portmap plugin reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortMapping {
    pub host_port: u16,
    pub container_port: u16,
    pub protocol: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host_ip: String,
}

impl Request {
    /// The request in `spec`'s annotations: None when it names no network or `none`
    /// (ports without a network are an error: nothing could publish them).
    pub fn of_spec(spec: &Value) -> Result<Option<Request>, String> {
        let get = |k: &str| crate::spec::annotation(spec, k).map(str::trim);
        let ports = match get(PORTS_ANNOTATION).filter(|p| !p.is_empty()) {
            Some(list) => parse_ports(list)?,
            None => Vec::new(),
        };
        match get(NETWORK_ANNOTATION).filter(|n| !n.is_empty()) {
            None | Some(super::NO_NETWORK) if !ports.is_empty() => Err(format!(
                "{PORTS_ANNOTATION} publishes ports but the sandbox has no network: name one \
                 in {NETWORK_ANNOTATION} (chalkctl --net)"
            )),
            None | Some(super::NO_NETWORK) => Ok(None),
            Some(name) => {
                check_name(name)?;
                Ok(Some(Request {
                    network: name.to_string(),
                    ports,
                }))
            }
        }
    }
}

/// A CNI network name: letters, digits, `-`, `_`, `.`, starting with a letter or digit (the
/// name also becomes a file name under the plugins' state directories).
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "network name {name:?}: use up to 64 letters, digits, '-', '_' or '.', starting \
             with a letter or digit"
        ))
    }
}

/// Published ports, comma-separated, each `[HOST_IP:]HOST_PORT:CONTAINER_PORT[/tcp|udp]`.
pub fn parse_ports(list: &str) -> Result<Vec<PortMapping>, String> {
    let mut out: Vec<PortMapping> = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let p = parse_port(item)?;
        if out.iter().any(|q| {
            q.host_port == p.host_port && q.protocol == p.protocol && q.host_ip == p.host_ip
        }) {
            return Err(format!(
                "port {item:?}: host port {} is published twice",
                p.host_port
            ));
        }
        out.push(p);
    }
    Ok(out)
}

/// One `-p` value.
pub fn parse_port(item: &str) -> Result<PortMapping, String> {
    let bad = |why: &str| {
        format!("port {item:?}: {why} (give [HOST_IP:]HOST_PORT:CONTAINER_PORT[/tcp|udp], e.g. 8080:80)")
    };
    let (addr, protocol) = match item.rsplit_once('/') {
        Some((a, p @ ("tcp" | "udp"))) => (a, p),
        Some(_) => return Err(bad("the protocol must be tcp or udp")),
        None => (item, "tcp"),
    };
    let parts: Vec<&str> = addr.rsplitn(3, ':').collect();
    let (host_ip, host, container) = match parts.as_slice() {
        [c, h] => ("", *h, *c),
        [c, h, ip] => (*ip, *h, *c),
        _ => return Err(bad("both ports are needed")),
    };
    if !host_ip.is_empty() && host_ip.parse::<std::net::IpAddr>().is_err() {
        return Err(bad("the host address is not an IP address"));
    }
    let port = |s: &str| s.parse::<u16>().ok().filter(|p| *p > 0);
    let (Some(host_port), Some(container_port)) = (port(host), port(container)) else {
        return Err(bad("ports are numbers from 1 to 65535"));
    };
    Ok(PortMapping {
        host_port,
        container_port,
        protocol: protocol.into(),
        host_ip: host_ip.into(),
    })
}

/// The annotation value for `ports` (what [`parse_ports`] reads back).
pub fn format_ports(ports: &[PortMapping]) -> String {
    ports
        .iter()
        .map(|p| {
            let ip = if p.host_ip.is_empty() {
                String::new()
            } else {
                format!("{}:", p.host_ip)
            };
            format!("{ip}{}:{}/{}", p.host_port, p.container_port, p.protocol)
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(net: Option<&str>, ports: Option<&str>) -> Value {
        let mut a = serde_json::Map::new();
        if let Some(n) = net {
            a.insert(NETWORK_ANNOTATION.into(), n.into());
        }
        if let Some(p) = ports {
            a.insert(PORTS_ANNOTATION.into(), p.into());
        }
        json!({ "annotations": a })
    }

    #[test]
    fn a_named_network_with_ports_is_a_request() {
        let r = Request::of_spec(&spec(Some("chalk"), Some("8080:80, 127.0.0.1:53:53/udp")))
            .unwrap()
            .unwrap();
        assert_eq!(r.network, "chalk");
        assert_eq!(r.ports.len(), 2);
        assert_eq!(r.ports[1].host_ip, "127.0.0.1");
        assert_eq!(r.ports[1].protocol, "udp");
        assert_eq!(format_ports(&r.ports), "8080:80/tcp,127.0.0.1:53:53/udp");
        assert_eq!(parse_ports(&format_ports(&r.ports)).unwrap(), r.ports);
    }

    #[test]
    fn none_or_nothing_asks_for_no_network() {
        assert_eq!(Request::of_spec(&spec(None, None)).unwrap(), None);
        assert_eq!(Request::of_spec(&spec(Some("none"), None)).unwrap(), None);
    }

    #[test]
    fn bad_input_ports_without_a_network_are_refused() {
        let e = Request::of_spec(&spec(Some("none"), Some("80:80"))).unwrap_err();
        assert!(e.contains("no network"), "{e}");
    }

    #[test]
    fn bad_input_network_names_and_ports_are_refused_by_name() {
        for n in ["../etc", "a b", "-x", &"n".repeat(65)] {
            let e = Request::of_spec(&spec(Some(n), None)).unwrap_err();
            assert!(e.contains("network name"), "{e}");
        }
        for p in [
            "80",
            "0:80",
            "70000:80",
            "80:80/sctp",
            "x:80",
            "1.2.3:80:80",
            "8080:80,8080:81",
        ] {
            let e = parse_ports(p).unwrap_err();
            assert!(e.contains("port"), "{p}: {e}");
        }
    }
}
