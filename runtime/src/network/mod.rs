//! Networks of their own for sandboxes that ask for one (`chalk.io/network`): a CNI
//! network attached to the network namespace the shim makes, as nerdctl attaches a
//! container's. A fork or a resume asks again and gets a namespace and an address of its
//! own; runsc's netstack takes the new namespace's interfaces when it restores.
//!
//! - [`request`]: what a spec asks for (network name, published ports), validated.
//! - [`conflist`]: CNI network configuration lists: found by name, the default written,
//!   each plugin's input composed (pure).
//! - [`plugin`]: runs a CNI plugin binary.
//! - [`attachment`]: a sandbox's attachment, kept in its record: ADD and DEL over a list.
//! - [`files`]: the sandbox's `/etc/resolv.conf` and `/etc/hosts`.

pub mod attachment;
pub mod conflist;
pub mod files;
pub mod plugin;
pub mod request;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use attachment::Attachment;
pub use request::{PortMapping, Request};

/// The network `chalkctl run` gives a sandbox when none is named: a bridge with NAT,
/// written into the configuration directory on first use.
pub const DEFAULT_NETWORK: &str = "chalk";
/// The name that asks for loopback only.
pub const NO_NETWORK: &str = "none";

/// `[network]` in the runtime options: where CNI's configuration and plugins are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkOptions {
    /// Network configuration lists (`*.conflist`, `*.conf`, `*.json`), found by their name.
    #[serde(default = "default_conf_dir")]
    pub conf_dir: PathBuf,
    /// Where the plugin binaries are, searched in order.
    #[serde(default = "default_bin_dirs")]
    pub bin_dirs: Vec<PathBuf>,
    /// The default network's subnet, used when it is written on first use.
    #[serde(default = "default_subnet")]
    pub default_subnet: String,
}

fn default_conf_dir() -> PathBuf {
    PathBuf::from("/etc/cni/net.d")
}

fn default_bin_dirs() -> Vec<PathBuf> {
    // /opt/cni/bin is CNI's convention; Debian's containernetworking-plugins use /usr/lib/cni.
    vec![PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")]
}

fn default_subnet() -> String {
    "10.77.0.0/16".into()
}

impl Default for NetworkOptions {
    fn default() -> Self {
        NetworkOptions {
            conf_dir: default_conf_dir(),
            bin_dirs: default_bin_dirs(),
            default_subnet: default_subnet(),
        }
    }
}

impl NetworkOptions {
    /// The first of `bin_dirs` that has plugin `kind`.
    pub fn plugin_path(&self, kind: &str) -> Option<PathBuf> {
        self.bin_dirs
            .iter()
            .map(|d| d.join(kind))
            .find(|p| p.is_file())
    }
}

/// Why network `name` cannot be attached on this host for want of plugins: the first plugin
/// (or IPAM plugin) of its list, or of the default list it would be written as, that none of
/// `bin_dirs` has. None when every one is there (or the list is not found: attaching says so).
pub fn missing_plugin(opts: &NetworkOptions, name: &str) -> Option<String> {
    let plugins = match conflist::Conflist::find(&opts.conf_dir, name) {
        Ok(Some(list)) => list.plugins,
        _ if name == DEFAULT_NETWORK => conflist::default_conflist(name, &opts.default_subnet)
            ["plugins"]
            .as_array()
            .cloned()
            .unwrap_or_default(),
        _ => return None,
    };
    let types = plugins
        .iter()
        .flat_map(|p| [p["type"].as_str(), p["ipam"]["type"].as_str()]);
    for kind in types.flatten() {
        if opts.plugin_path(kind).is_none() {
            let dirs: Vec<String> = opts
                .bin_dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect();
            return Some(format!(
                "CNI plugin {kind:?} is not in {} (install the CNI plugins, e.g. Debian's \
                 containernetworking-plugins, or set bin_dirs under [network] in the runtime \
                 options)",
                dirs.join(":")
            ));
        }
    }
    None
}

/// Whether a network's list takes addresses asked for (a plugin with the `ips` capability).
pub fn takes_ips(list: &conflist::Conflist) -> bool {
    list.plugins
        .iter()
        .any(|p| p["capabilities"]["ips"].as_bool() == Some(true))
}

/// Whether a network's list can publish ports (a plugin takes portMappings).
pub fn publishes_ports(list: &conflist::Conflist) -> bool {
    list.plugins
        .iter()
        .any(|p| p["capabilities"]["portMappings"].as_bool() == Some(true))
}

/// Detaches a sandbox from its network (DEL), logging what could not be undone.
pub fn detach(att: &Attachment, spawner: &dyn crate::runsc::Spawner) {
    // runsc's netstack takes the addresses off the namespace's interface (the host's kernel
    // must not answer for it), and the bridge plugin finds its NAT rules by them at DEL:
    // they go back first.
    if att.netns.exists() {
        for (addr, prefix) in att.ipv4_addresses() {
            if let Err(e) = crate::netns::set_ipv4_address(&att.netns, &att.ifname, addr, prefix) {
                log::debug!(
                    "network {:?}: give {addr} back to {}: {e}",
                    att.network,
                    att.ifname
                );
            }
        }
    }
    match att.del(spawner) {
        Ok(()) => log::debug!("network {:?}: {} detached", att.network, att.container_id),
        Err(e) => log::warn!("{e}"),
    }
}

/// CNI's container id for container `id` in containerd namespace `namespace`.
pub fn cni_container_id(namespace: &str, id: &str) -> String {
    format!("chalk-{namespace}-{id}")
}
