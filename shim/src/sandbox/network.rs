//! A sandbox's CNI network (`chalk.io/network`): its namespace attached at Create, before
//! runsc makes or restores the sandbox in it, and detached once, when its init exits or it
//! is deleted, whichever comes first (an attachment the shim never got to detach is in the
//! bundle's record for `shim delete`).

use std::path::Path;

use chalk_runtime::{
    bundle::Record,
    netns,
    network::{self, files, Attachment, Request},
    options::RuntimeOptions,
};
use serde_json::{json, Value};

use super::Sandboxes;
use crate::container::{Container, JoinedAddresses};
use crate::errors::{Result, ShimError};

/// The network `spec` asks for: only a sandbox of its own may ask (a pod's network is its
/// CRI's), and only for the namespace the shim makes.
pub(super) fn request_of(spec: &Value, in_pod: bool) -> Result<Option<Request>> {
    if in_pod
        || chalk_runtime::spec::annotation(spec, chalk_runtime::spec::CRI_CONTAINER_TYPE).is_some()
    {
        return Ok(None);
    }
    let Some(request) = Request::of_spec(spec).map_err(ShimError::InvalidArgument)? else {
        return Ok(None);
    };
    let ns = spec
        .pointer("/linux/namespaces")
        .and_then(Value::as_array)
        .and_then(|nss| nss.iter().find(|ns| ns["type"] == "network"));
    match ns {
        None => Err(ShimError::InvalidArgument(format!(
            "{} asks for network {:?}, but the spec has no network namespace of its own: add \
             one (linux.namespaces, type network, no path)",
            network::request::NETWORK_ANNOTATION,
            request.network
        ))),
        Some(ns) if ns["path"].as_str().is_some_and(|p| !p.is_empty()) => {
            Err(ShimError::InvalidArgument(format!(
                "{} asks for network {:?}, but the spec joins network namespace {}: leave \
                 the path out for the shim to make one, or drop the annotation",
                network::request::NETWORK_ANNOTATION,
                request.network,
                ns["path"]
            )))
        }
        Some(_) => Ok(Some(request)),
    }
}

impl Sandboxes {
    /// Attaches the namespace `record` names for container `id` to the network `request`
    /// names. The attachment is in the record before ADD runs (a crash leaves DEL to `shim
    /// delete`); the sandbox's resolv.conf and hosts files are mounted into `adapted`.
    pub(super) fn attach_network(
        &self,
        id: &str,
        request: &Request,
        opts: &RuntimeOptions,
        bundle_dir: &Path,
        record: &mut Record,
        adapted: &mut Value,
    ) -> Result<Attachment> {
        let failed = |e: String| ShimError::FailedPrecondition(format!("container {id}: {e}"));
        let netns = record
            .netns
            .clone()
            .ok_or_else(|| failed("no network namespace to attach".into()))?;
        let started = std::time::Instant::now();
        let list = network::conflist::find_or_write_default(
            &opts.network.conf_dir,
            &request.network,
            &opts.network.default_subnet,
        )
        .map_err(failed)?;
        let mut att = Attachment::new(
            &list,
            network::cni_container_id(self.namespace(), id),
            &netns,
            request.ports.clone(),
            opts.network.bin_dirs.clone(),
        );
        if !request.ports.is_empty() && !network::publishes_ports(&list) {
            return Err(failed(format!(
                "network {:?} ({}) cannot publish ports: none of its plugins takes \
                 portMappings (add CNI's portmap plugin to it, or leave -p out)",
                request.network,
                list.file.display()
            )));
        }
        // Back on this host (a resume, a restart), the sandbox asks for its own address
        // again, and takes the IPAM's next when another has it.
        if network::takes_ips(&list) {
            att.ips = self.own_address(id);
        }
        let mut added = add_recorded(&mut att, record, bundle_dir)?;
        if let (Err(e), false) = (&added, att.ips.is_empty()) {
            log::info!(
                "container {id}: its address {:?} is not free ({e}): a new one",
                att.ips
            );
            att.ips.clear();
            added = add_recorded(&mut att, record, bundle_dir)?;
        }
        added.map_err(failed)?;
        record.network = Some(att.clone());
        record.write(bundle_dir)?;
        let addresses = att.addresses();
        log::info!(
            "container {id}: network {:?} attached in {} ms: {}",
            att.network,
            started.elapsed().as_millis(),
            addresses.join(", ")
        );
        mount_network_files(bundle_dir, adapted, &addresses)?;
        if let Err(e) =
            self.records()
                .set_label(id, chalk_labels::ADDRESS_LABEL, &addresses.join(","))
        {
            log::warn!("container {id}: cannot label its address: {e}");
        }
        Ok(att)
    }
}

/// ADD, with the attachment in the record first (a crash leaves DEL to `shim delete`).
fn add_recorded(
    att: &mut Attachment,
    record: &mut Record,
    bundle_dir: &Path,
) -> Result<std::result::Result<(), String>> {
    record.network = Some(att.clone());
    record.write(bundle_dir)?;
    Ok(att.add(&crate::reaper::ReaperSpawner))
}

impl Sandboxes {
    /// The addresses container `id` had on its network (its record's label), if any.
    fn own_address(&self, id: &str) -> Vec<String> {
        let label = self.records().label(id, chalk_labels::ADDRESS_LABEL);
        label
            .ok()
            .flatten()
            .unwrap_or_default()
            .split(',')
            .filter(|a| a.parse::<std::net::IpAddr>().is_ok())
            .map(str::to_string)
            .collect()
    }
}

/// Writes the sandbox's resolv.conf and hosts into its bundle and mounts them, unless the
/// spec mounts its own.
fn mount_network_files(bundle_dir: &Path, adapted: &mut Value, addresses: &[String]) -> Result<()> {
    let host_resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let hostname = adapted["hostname"].as_str().unwrap_or_default().to_string();
    let made = [
        (
            "/etc/resolv.conf",
            "chalk-resolv.conf",
            files::resolv_conf(&host_resolv),
        ),
        (
            "/etc/hosts",
            "chalk-hosts",
            files::hosts(&hostname, addresses),
        ),
    ];
    for (dest, name, text) in made {
        let mounts = &mut adapted["mounts"];
        if !mounts.is_array() {
            *mounts = json!([]);
        }
        let list = mounts.as_array_mut().expect("made an array above");
        if list.iter().any(|m| m["destination"] == dest) {
            continue;
        }
        let file = bundle_dir.join(name);
        std::fs::write(&file, text)
            .map_err(|e| ShimError::failed(format!("write {}", file.display()), e))?;
        list.push(json!({"destination": dest, "type": "bind",
                         "source": file.display().to_string(),
                         "options": ["rbind", "rprivate"]}));
    }
    Ok(())
}

/// The addresses a sandbox of its own found in the network namespace its spec names (a pod's,
/// made by CRI through its CNI), where runsc's netstack will take them: runsc moves them off
/// the interface, and the bridge plugin finds its NAT rules by them at CRI's DEL.
pub(super) fn joined_addresses(
    spec: &Value,
    in_pod: bool,
    runsc_network: Option<&str>,
) -> Option<JoinedAddresses> {
    if in_pod || matches!(runsc_network, Some("none" | "host")) {
        return None;
    }
    let path = spec
        .pointer("/linux/namespaces")?
        .as_array()?
        .iter()
        .find(|ns| ns["type"] == "network")?["path"]
        .as_str()
        .filter(|p| !p.is_empty())?;
    match netns::ipv4_addresses(Path::new(path)) {
        Ok(found) if !found.is_empty() => Some(JoinedAddresses {
            netns: path.into(),
            addresses: found,
        }),
        Ok(_) => None,
        Err(e) => {
            log::warn!("network namespace {path}: cannot read its addresses: {e}");
            None
        }
    }
}

/// Gives the interfaces of the namespace a pod's sandbox joined their addresses back, once its
/// sandbox is gone and before its exit is told (CRI's DEL follows the exit).
pub(super) fn give_back_addresses(c: &Container) {
    let Some(joined) = &c.joined_addresses else {
        return;
    };
    if !joined.netns.exists() {
        return;
    }
    for (ifname, addr, prefix) in &joined.addresses {
        if let Err(e) = netns::set_ipv4_address(&joined.netns, ifname, *addr, *prefix) {
            log::debug!("container {}: give {addr} back to {ifname}: {e}", c.id);
        }
    }
}

/// Detaches the sandbox from its network and removes its namespace, once: at the first of
/// its init's exit and its delete.
pub(super) fn release(c: &Container) {
    // Held throughout: a delete meanwhile waits here, not on a half-detached network.
    let mut held = c.network.lock().unwrap();
    let Some(att) = held.take() else {
        return;
    };
    network::detach(&att, &crate::reaper::ReaperSpawner);
    if let Some(path) = &c.netns {
        netns::remove(path);
    }
    match Record::read(&c.bundle) {
        Ok(Some(mut record)) => {
            record.network = None;
            if let Err(e) = record.write(&c.bundle) {
                log::warn!("container {}: {e}", c.id);
            }
        }
        Ok(None) => {}
        Err(e) => log::warn!("container {}: {e}", c.id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(netns: Value, annotations: Value) -> Value {
        json!({"linux": {"namespaces": netns}, "annotations": annotations})
    }

    #[test]
    fn only_a_sandbox_of_its_own_with_a_namespace_to_make_asks() {
        let asks = json!({"chalk.io/network": "chalk", "chalk.io/ports": "8080:80"});
        let own = spec(json!([{"type": "network"}]), asks.clone());
        let r = request_of(&own, false).unwrap().unwrap();
        assert_eq!((r.network.as_str(), r.ports.len()), ("chalk", 1));
        // A pod's container, or a CRI sandbox: the pod's network is its CRI's.
        assert!(request_of(&own, true).unwrap().is_none());
        let mut cri = own.clone();
        cri["annotations"]["io.kubernetes.cri.container-type"] = "sandbox".into();
        assert!(request_of(&cri, false).unwrap().is_none());
        let none = spec(
            json!([{"type": "network"}]),
            json!({"chalk.io/network": "none"}),
        );
        assert!(request_of(&none, false).unwrap().is_none());
    }

    #[test]
    fn bad_input_a_network_without_a_namespace_to_make_is_refused() {
        let asks = json!({"chalk.io/network": "chalk"});
        let joined = spec(
            json!([{"type": "network", "path": "/proc/1/ns/net"}]),
            asks.clone(),
        );
        let e = request_of(&joined, false).unwrap_err().to_string();
        assert!(e.contains("joins network namespace"), "{e}");
        let host = spec(json!([{"type": "pid"}]), asks);
        let e = request_of(&host, false).unwrap_err().to_string();
        assert!(e.contains("no network namespace of its own"), "{e}");
    }
}
