//! What a sandbox may reach, as recorded in a snapshot, and the rule that a restore never
//! widens it: no capability, shared namespace, or looser limit that the source did not have.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::spec::strings;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Isolation {
    /// Every capability named in any of the process's sets.
    pub capabilities: BTreeSet<String>,
    /// The namespace types the sandbox gets of its own (a missing one is shared with the host).
    pub namespaces: BTreeSet<String>,
    pub memory_limit: Option<i64>,
    pub cpu_quota: Option<i64>,
    pub cpu_period: Option<u64>,
    pub pids_limit: Option<i64>,
    pub readonly_root: bool,
    pub no_new_privileges: bool,
    /// runsc's `--network` (none, sandbox, host).
    pub network: String,
}

impl Isolation {
    /// Reads the isolation of an OCI runtime spec run with runsc `--network=network`.
    pub fn from_spec(spec: &Value, network: &str) -> Self {
        let caps = &spec["process"]["capabilities"];
        let capabilities = [
            "bounding",
            "effective",
            "permitted",
            "inheritable",
            "ambient",
        ]
        .iter()
        .flat_map(|set| strings(&caps[set]))
        .collect();
        let namespaces = spec["linux"]["namespaces"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|ns| ns["type"].as_str().map(String::from))
            .collect();
        let res = &spec["linux"]["resources"];
        let positive = |v: &Value| v.as_i64().filter(|n| *n > 0);
        Isolation {
            capabilities,
            namespaces,
            memory_limit: positive(&res["memory"]["limit"]),
            cpu_quota: positive(&res["cpu"]["quota"]),
            cpu_period: res["cpu"]["period"].as_u64().filter(|n| *n > 0),
            pids_limit: positive(&res["pids"]["limit"]),
            readonly_root: spec["root"]["readonly"].as_bool().unwrap_or(false),
            no_new_privileges: spec["process"]["noNewPrivileges"]
                .as_bool()
                .unwrap_or(false),
            network: network.to_string(),
        }
    }

    /// Every way `target` reaches further than `self` (the source), as readable lines.
    pub fn widenings(&self, target: &Isolation) -> Vec<String> {
        let mut out = Vec::new();
        let added: Vec<_> = target.capabilities.difference(&self.capabilities).collect();
        if !added.is_empty() {
            out.push(format!("capabilities the source did not have: {added:?}"));
        }
        let shared: Vec<_> = self.namespaces.difference(&target.namespaces).collect();
        if !shared.is_empty() {
            out.push(format!("namespaces shared with the host: {shared:?}"));
        }
        let mut limit = |what: &str, source: Option<i64>, target: Option<i64>| {
            if let Some(s) = source {
                match target {
                    None => out.push(format!("{what}: unlimited, the source had {s}")),
                    Some(t) if t > s => out.push(format!("{what}: {t}, the source had {s}")),
                    _ => {}
                }
            }
        };
        limit("memory limit", self.memory_limit, target.memory_limit);
        limit("pids limit", self.pids_limit, target.pids_limit);
        // CPU is a rate: compare quota/period.
        let rate = |i: &Isolation| {
            i.cpu_quota
                .map(|q| q as f64 / i.cpu_period.unwrap_or(100_000) as f64)
        };
        if let Some(s) = rate(self) {
            match rate(target) {
                None => out.push(format!("cpu: unlimited, the source had {s:.2} cpus")),
                Some(t) if t > s + 1e-9 => {
                    out.push(format!("cpu: {t:.2} cpus, the source had {s:.2}"))
                }
                _ => {}
            }
        }
        if self.readonly_root && !target.readonly_root {
            out.push("root filesystem writable, the source's was read-only".into());
        }
        if self.no_new_privileges && !target.no_new_privileges {
            out.push("noNewPrivileges off, the source had it on".into());
        }
        if self.network != target.network {
            out.push(format!(
                "runsc network {:?}, the source had {:?}",
                target.network, self.network
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec() -> Value {
        json!({
            "root": {"path": "rootfs", "readonly": true},
            "process": {
                "noNewPrivileges": true,
                "capabilities": {"bounding": ["CAP_CHOWN", "CAP_KILL"], "effective": ["CAP_KILL"]}
            },
            "linux": {
                "namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "mount"}],
                "resources": {
                    "memory": {"limit": 268435456},
                    "cpu": {"quota": 50000, "period": 100000},
                    "pids": {"limit": 100}
                }
            }
        })
    }

    #[test]
    fn same_spec_is_not_wider() {
        let s = Isolation::from_spec(&spec(), "none");
        assert_eq!(s.capabilities.len(), 2);
        assert_eq!(s.memory_limit, Some(268435456));
        assert!(s.widenings(&s.clone()).is_empty());
    }

    #[test]
    fn narrower_is_fine() {
        let source = Isolation::from_spec(&spec(), "none");
        let mut narrower = spec();
        narrower["process"]["capabilities"]["bounding"] = json!(["CAP_KILL"]);
        narrower["linux"]["resources"]["memory"]["limit"] = json!(1 << 20);
        narrower["linux"]["resources"]["cpu"]["quota"] = json!(25000);
        narrower["linux"]["namespaces"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "ipc"}));
        assert!(source
            .widenings(&Isolation::from_spec(&narrower, "none"))
            .is_empty());
    }

    #[test]
    fn each_widening_is_named() {
        let source = Isolation::from_spec(&spec(), "none");
        let mut wide = json!({
            "root": {"path": "rootfs"},
            "process": {"capabilities": {"bounding": ["CAP_CHOWN", "CAP_KILL", "CAP_SYS_ADMIN"]}},
            "linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}], "resources": {}}
        });
        let got = source.widenings(&Isolation::from_spec(&wide, "host"));
        let text = got.join("\n");
        for word in [
            "CAP_SYS_ADMIN",
            "\"network\"",
            "memory limit: unlimited",
            "pids limit",
            "cpu: unlimited",
            "read-only",
            "noNewPrivileges",
            "runsc network \"host\"",
        ] {
            assert!(text.contains(word), "{word} missing from:\n{text}");
        }
        wide["linux"]["resources"] = json!({"cpu": {"quota": 200000, "period": 100000}});
        let got = source.widenings(&Isolation::from_spec(&wide, "none"));
        assert!(got.iter().any(|l| l.contains("cpu: 2.00 cpus")), "{got:?}");
    }
}
