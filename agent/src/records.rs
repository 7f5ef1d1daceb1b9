//! The agents' own record of what they pushed for a Sandbox: a ConfigMap in the agents'
//! namespace (`chalk-system`), which no tenant can write. Retention and a deleted Sandbox's
//! cleanup remove from the registry only what is recorded here, by digest, and only for the
//! Sandbox whose UID the record names: never what a Sandbox's own (tenant-writable)
//! annotations list, and nothing for a Sandbox a user merely gave the finalizer. Pure: the
//! ConfigMaps' shape.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;

/// The agents' namespace, where the records are.
pub const NAMESPACE: &str = "chalk-system";
/// The label that marks a record (its value: the Sandbox's namespace).
pub const RECORD_LABEL: &str = "chalk.io/sandbox-snapshots";

/// What was pushed for one Sandbox, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub namespace: String,
    pub name: String,
    /// The Sandbox's UID: a later Sandbox of the same name is another one.
    pub uid: String,
    /// Its repository (`SUSPEND_TO/NAMESPACE/NAME`).
    pub repository: String,
    /// `REF@sha256:…`, oldest first.
    pub pushed: Vec<String>,
}

/// The record's ConfigMap name: one per Sandbox name, whatever its length.
pub fn name_of(namespace: &str, name: &str) -> String {
    let hex = chalk_runtime::snapshot::hash::sha256_hex(format!("{namespace}/{name}").as_bytes());
    format!("chalk-sandbox-{}", &hex[..20])
}

impl Record {
    pub fn to_config_map(&self) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name_of(&self.namespace, &self.name)),
                namespace: Some(NAMESPACE.into()),
                labels: Some(BTreeMap::from([(
                    RECORD_LABEL.to_string(),
                    self.namespace.clone(),
                )])),
                ..Default::default()
            },
            data: Some(BTreeMap::from([
                ("namespace".to_string(), self.namespace.clone()),
                ("name".to_string(), self.name.clone()),
                ("uid".to_string(), self.uid.clone()),
                ("repository".to_string(), self.repository.clone()),
                ("pushed".to_string(), self.pushed.join("\n")),
            ])),
            ..Default::default()
        }
    }

    /// The record a ConfigMap holds; None for one that is not a whole record.
    pub fn from_config_map(cm: &ConfigMap) -> Option<Record> {
        let data = cm.data.as_ref()?;
        let get = |k: &str| data.get(k).cloned();
        let record = Record {
            namespace: get("namespace")?,
            name: get("name")?,
            uid: get("uid")?,
            repository: get("repository")?,
            pushed: get("pushed")
                .unwrap_or_default()
                .lines()
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect(),
        };
        (cm.metadata.name.as_deref() == Some(&name_of(&record.namespace, &record.name)))
            .then_some(record)
    }

    /// Adds `reference` (newest), once.
    pub fn with(mut self, reference: &str) -> Record {
        self.pushed.retain(|r| r != reference);
        self.pushed.push(reference.to_string());
        self
    }

    /// The references beyond the newest `keep` (oldest first): what retention removes.
    pub fn beyond(&self, keep: usize) -> Vec<String> {
        let drop = self.pushed.len().saturating_sub(keep);
        self.pushed[..drop].to_vec()
    }

    /// Whether `reference` is in this record's repository, by its full digest: what a
    /// removal may touch.
    pub fn covers(&self, reference: &str) -> bool {
        let Some((repo, digest)) = reference.rsplit_once('@') else {
            return false;
        };
        let bare = chalk_runtime::snapshot::manifest::ImageRef::unpinned(repo);
        let bare = match bare.rsplit_once(':') {
            Some((r, tag)) if !tag.contains('/') && r.contains('/') => r,
            _ => bare,
        };
        chalk_runtime::registry_name::canonical(bare)
            == chalk_runtime::registry_name::canonical(&self.repository)
            && digest.len() == 71
            && digest.starts_with("sha256:")
            && digest[7..].bytes().all(|b| b.is_ascii_hexdigit())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    fn record() -> Record {
        Record {
            namespace: "team".into(),
            name: "sb".into(),
            uid: "u-1".into(),
            repository: "reg:5000/sandboxes/team/sb".into(),
            pushed: Vec::new(),
        }
    }

    #[test]
    fn a_record_round_trips_through_its_config_map() {
        let r = record()
            .with(&format!("reg:5000/sandboxes/team/sb:s1@{D1}"))
            .with(&format!("reg:5000/sandboxes/team/sb:s2@{D2}"));
        let cm = r.to_config_map();
        assert_eq!(cm.metadata.namespace.as_deref(), Some(NAMESPACE));
        assert_eq!(Record::from_config_map(&cm), Some(r.clone()));
        assert_eq!(r.beyond(1), [format!("reg:5000/sandboxes/team/sb:s1@{D1}")]);
        assert!(r.beyond(5).is_empty());
        // A ConfigMap under another name than its Sandbox's is no record of it.
        let mut moved = cm;
        moved.metadata.name = Some("chalk-sandbox-other".into());
        assert_eq!(Record::from_config_map(&moved), None);
        assert_ne!(name_of("team", "sb"), name_of("team", "sb2"));
    }

    #[test]
    fn a_record_covers_only_its_repository_by_full_digest() {
        let r = record();
        assert!(r.covers(&format!("reg:5000/sandboxes/team/sb:s1@{D1}")));
        assert!(r.covers(&format!("REG:5000/sandboxes/team/sb@{D1}")));
        assert!(!r.covers(&format!("reg:5000/sandboxes/other/sb@{D1}")));
        assert!(!r.covers(&format!("reg:5000/sandboxes/team/sb2@{D1}")));
        assert!(!r.covers("reg:5000/sandboxes/team/sb@sha256:1111"));
        assert!(!r.covers("reg:5000/sandboxes/team/sb"));
    }
}
