//! A sandbox's attachment to a CNI network: what ADD was given, kept in the sandbox's
//! record so that DEL (at its exit, its delete, a failed create, or `shim delete` after a
//! crash) gives each plugin the same configuration, as the CNI spec asks.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::runsc::Spawner;

use super::{
    conflist::Conflist,
    plugin::{self, Op, Target},
    PortMapping,
};

/// The interface a sandbox's network appears as.
pub const IFNAME: &str = "eth0";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    pub network: String,
    /// The configuration list as ADD read it.
    pub conflist: Value,
    pub conflist_file: PathBuf,
    /// CNI's container id: unique on the host while the attachment lasts.
    pub container_id: String,
    pub netns: PathBuf,
    pub ifname: String,
    pub ports: Vec<PortMapping>,
    /// Addresses asked of the IPAM (CNI's `ips` capability): the sandbox's own from before.
    #[serde(default)]
    pub ips: Vec<String>,
    pub bin_dirs: Vec<PathBuf>,
    /// The last plugin's result, once ADD succeeded.
    #[serde(default)]
    pub result: Option<Value>,
}

impl Attachment {
    pub fn new(
        list: &Conflist,
        container_id: String,
        netns: &Path,
        ports: Vec<PortMapping>,
        bin_dirs: Vec<PathBuf>,
    ) -> Attachment {
        Attachment {
            network: list.name.clone(),
            conflist: json!({"cniVersion": list.cni_version, "name": list.name,
                             "plugins": list.plugins}),
            conflist_file: list.file.clone(),
            container_id,
            netns: netns.to_path_buf(),
            ifname: IFNAME.into(),
            ports,
            ips: Vec::new(),
            bin_dirs,
            result: None,
        }
    }

    fn list(&self) -> Result<Conflist, String> {
        Conflist::parse(&self.conflist.to_string(), &self.conflist_file)
    }

    fn runtime_config(&self) -> Value {
        json!({ "portMappings": self.ports, "ips": self.ips })
    }

    fn search_path(&self) -> String {
        self.bin_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    }

    fn binary(&self, kind: &str) -> Result<PathBuf, String> {
        // A type is a file name in the plugin directories, never a path.
        if kind.is_empty() || kind.contains('/') || kind.starts_with('.') {
            return Err(format!("CNI plugin type {kind:?} is not a plugin name"));
        }
        self.bin_dirs
            .iter()
            .map(|d| d.join(kind))
            .find(|p| p.is_file())
            .ok_or_else(|| {
                format!(
                    "network {:?} needs CNI plugin {kind:?}, which is not in {}: install the \
                     CNI plugins (Debian: containernetworking-plugins) or set bin_dirs under \
                     [network] in the runtime options",
                    self.network,
                    self.search_path()
                )
            })
    }

    /// Calls `f` with the list, the plugins' target and the runtime values: what ADD and
    /// DEL both give each plugin.
    fn with_target<T>(
        &self,
        f: impl FnOnce(&Conflist, &Target, &Value) -> Result<T, String>,
    ) -> Result<T, String> {
        let list = self.list()?;
        let search = self.search_path();
        let target = Target {
            container_id: &self.container_id,
            netns: &self.netns,
            ifname: &self.ifname,
            search: &search,
        };
        f(&list, &target, &self.runtime_config())
    }

    /// Runs ADD through every plugin; on a failure, DEL undoes what was done and the error
    /// names the plugin.
    pub fn add(&mut self, spawner: &dyn Spawner) -> Result<(), String> {
        // Every plugin is there before any runs: nothing to undo for want of one.
        for kind in self.list()?.types() {
            self.binary(kind)?;
        }
        let added = self.with_target(|list, target, runtime| {
            let mut prev: Option<Value> = None;
            for (i, kind) in list.types().into_iter().enumerate() {
                let binary = self.binary(kind)?;
                let input = list.plugin_input(i, prev.as_ref(), runtime);
                prev = Some(plugin::run(spawner, &binary, Op::Add, target, &input)?);
            }
            Ok(prev)
        });
        match added {
            Ok(result) => {
                self.result = result;
                Ok(())
            }
            Err(e) => {
                if let Err(undo) = self.del(spawner) {
                    log::warn!("network {:?}: undoing a failed ADD: {undo}", self.network);
                }
                Err(format!("network {:?}: {e}", self.network))
            }
        }
    }

    /// Runs DEL through every plugin, last first; each runs even after another failed (what
    /// it holds must go), and the failures are reported together.
    pub fn del(&self, spawner: &dyn Spawner) -> Result<(), String> {
        let failures = self.with_target(|list, target, runtime| {
            let mut failures = Vec::new();
            for i in (0..list.plugins.len()).rev() {
                let input = list.plugin_input(i, self.result.as_ref(), runtime);
                let outcome = self
                    .binary(input["type"].as_str().unwrap_or_default())
                    .and_then(|b| plugin::run(spawner, &b, Op::Del, target, &input));
                if let Err(e) = outcome {
                    failures.push(e);
                }
            }
            Ok(failures)
        })?;
        if failures.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "network {:?}: {}",
                self.network,
                failures.join("; ")
            ))
        }
    }

    /// The sandbox's IPv4 addresses with their prefix lengths, from ADD's result.
    pub fn ipv4_addresses(&self) -> Vec<(std::net::Ipv4Addr, u8)> {
        let Some(ips) = self.result.as_ref().and_then(|r| r["ips"].as_array()) else {
            return Vec::new();
        };
        ips.iter()
            .filter_map(|ip| ip["address"].as_str()?.split_once('/'))
            .filter_map(|(a, p)| Some((a.parse().ok()?, p.parse().ok()?)))
            .collect()
    }

    /// The sandbox's addresses (without prefix length), from ADD's result.
    pub fn addresses(&self) -> Vec<String> {
        addresses_of(self.result.as_ref())
    }
}

/// The `ips[].address` of a CNI result, without their prefix lengths.
pub fn addresses_of(result: Option<&Value>) -> Vec<String> {
    result
        .and_then(|r| r["ips"].as_array())
        .map(|ips| {
            ips.iter()
                .filter_map(|ip| ip["address"].as_str())
                .map(|a| a.split('/').next().unwrap_or(a).to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_come_from_the_result_without_prefixes() {
        let r = json!({"ips": [{"address": "10.77.0.5/16", "gateway": "10.77.0.1"},
                               {"address": "fd00::5/64"}]});
        assert_eq!(addresses_of(Some(&r)), ["10.77.0.5", "fd00::5"]);
        assert!(addresses_of(None).is_empty());
    }

    /// ADD's error for a network of one plugin of type `kind`, plugins looked for in `bin`.
    fn add_error(kind: &str, bin: &Path) -> String {
        let text = json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": kind}]});
        let list = Conflist::parse(&text.to_string(), Path::new("n.conflist")).unwrap();
        let mut a = Attachment::new(&list, "c".into(), Path::new("/x"), vec![], vec![bin.into()]);
        a.add(&crate::runsc::StdSpawner).unwrap_err()
    }

    #[test]
    fn bad_input_a_plugin_type_that_is_a_path_is_refused() {
        let e = add_error("../../bin/sh", Path::new("/opt/cni/bin"));
        assert!(e.contains("is not a plugin name"), "{e}");
    }

    #[test]
    fn a_missing_plugin_is_named_with_where_it_was_looked_for() {
        let dir = tempfile::tempdir().unwrap();
        let e = add_error("bridge", dir.path());
        assert!(
            e.contains("needs CNI plugin \"bridge\"") && e.contains("containernetworking-plugins"),
            "{e}"
        );
    }
}
