//! The network annotations chalkctl writes on a sandbox's spec for the shim
//! (`chalk.io/network`, `chalk.io/ports`): a run's, and a fork's (its source's network, its
//! own ports only).

use serde_json::{json, Value};

use crate::{Error, Result};

/// Sets the network annotations the shim reads: `network` (the default one when None, which
/// the shim may leave out where this host cannot give it) and the published `ports`.
pub fn set_network(spec: &mut Value, network: Option<&str>, ports: &[String]) -> Result<()> {
    use chalk_labels::{NETWORK_ANNOTATION, NETWORK_DEFAULT_ANNOTATION, PORTS_ANNOTATION};
    use chalk_runtime::network::{request, DEFAULT_NETWORK, NO_NETWORK};
    let name = network.unwrap_or(DEFAULT_NETWORK);
    if name != NO_NETWORK {
        request::check_name(name).map_err(|e| Error::from(format!("--net: {e}")))?;
    }
    let mut mappings = Vec::new();
    for p in ports {
        mappings.extend(request::parse_ports(p).map_err(|e| Error::from(format!("-p: {e}")))?);
    }
    let joined = request::format_ports(&mappings);
    // Checked whole: the same host port twice across -p flags.
    request::parse_ports(&joined).map_err(|e| Error::from(format!("-p: {e}")))?;
    if name == NO_NETWORK && !mappings.is_empty() {
        return Err(
            "-p publishes a port, but --net none gives the sandbox no network: leave \
                    --net none out, or -p"
                .into(),
        );
    }
    if !spec["annotations"].is_object() {
        spec["annotations"] = json!({});
    }
    let a = &mut spec["annotations"];
    a[NETWORK_ANNOTATION] = name.into();
    if network.is_none() {
        a[NETWORK_DEFAULT_ANNOTATION] = "true".into();
    }
    if !mappings.is_empty() {
        a[PORTS_ANNOTATION] = joined.into();
    }
    Ok(())
}

/// A fork is on its source's network (a fresh namespace and address: the shim attaches it)
/// but publishes only the ports asked for it: the source's are the source's.
pub fn set_fork_ports(spec: &mut Value, ports: &[String]) -> Result<()> {
    use chalk_labels::{NETWORK_ANNOTATION, NETWORK_DEFAULT_ANNOTATION, PORTS_ANNOTATION};
    if let Some(a) = spec["annotations"].as_object_mut() {
        a.remove(PORTS_ANNOTATION);
    }
    if ports.is_empty() {
        return Ok(());
    }
    let network = chalk_runtime::spec::annotation(spec, NETWORK_ANNOTATION).map(str::to_string);
    let default = chalk_runtime::spec::annotation(spec, NETWORK_DEFAULT_ANNOTATION) == Some("true");
    let network = network.unwrap_or_else(|| chalk_runtime::network::NO_NETWORK.into());
    if network == chalk_runtime::network::NO_NETWORK {
        return Err(
            "-p publishes a port, but the source has no network (--net none), and a \
                    fork never has more than its source: leave -p out"
                .into(),
        );
    }
    set_network(spec, (!default).then_some(network.as_str()), ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_network_is_the_default_unless_named_and_ports_need_one() {
        use chalk_labels::{NETWORK_ANNOTATION, NETWORK_DEFAULT_ANNOTATION, PORTS_ANNOTATION};
        let mut s = json!({});
        set_network(&mut s, None, &["8080:80".into(), "53:53/udp".into()]).unwrap();
        assert_eq!(s["annotations"][NETWORK_ANNOTATION], "chalk");
        assert_eq!(s["annotations"][NETWORK_DEFAULT_ANNOTATION], "true");
        assert_eq!(s["annotations"][PORTS_ANNOTATION], "8080:80/tcp,53:53/udp");
        let mut s = json!({});
        set_network(&mut s, Some("lab"), &[]).unwrap();
        assert_eq!(s["annotations"][NETWORK_ANNOTATION], "lab");
        assert!(s["annotations"].get(NETWORK_DEFAULT_ANNOTATION).is_none());
    }

    #[test]
    fn bad_input_network_flags_are_refused_by_name() {
        let mut s = json!({});
        let e = set_network(&mut s, Some("none"), &["80:80".into()]).unwrap_err();
        assert!(e.to_string().contains("--net none"), "{e}");
        let e = set_network(&mut s, Some("a/b"), &[]).unwrap_err();
        assert!(e.to_string().contains("--net"), "{e}");
        let e = set_network(&mut s, None, &["8080:80".into(), "8080:81".into()]).unwrap_err();
        assert!(e.to_string().contains("published twice"), "{e}");
    }

    #[test]
    fn a_fork_publishes_only_what_it_is_given_and_never_widens() {
        use chalk_labels::{NETWORK_ANNOTATION, PORTS_ANNOTATION};
        let mut spec = json!({"annotations": {
            NETWORK_ANNOTATION: "lab", PORTS_ANNOTATION: "8080:80/tcp"}});
        set_fork_ports(&mut spec, &[]).unwrap();
        assert!(spec["annotations"].get(PORTS_ANNOTATION).is_none());
        assert_eq!(spec["annotations"][NETWORK_ANNOTATION], "lab");
        set_fork_ports(&mut spec, &["9090:80".into()]).unwrap();
        assert_eq!(spec["annotations"][PORTS_ANNOTATION], "9090:80/tcp");
        assert_eq!(spec["annotations"][NETWORK_ANNOTATION], "lab");
        let mut offline = json!({"annotations": {NETWORK_ANNOTATION: "none"}});
        let e = set_fork_ports(&mut offline, &["9090:80".into()]).unwrap_err();
        assert!(e.to_string().contains("no network"), "{e}");
    }
}
