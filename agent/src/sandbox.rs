//! kubernetes-sigs/agent-sandbox's objects as the agent reads them, as data: the Sandbox that
//! owns a pod, why that pod is going away, and the patches that make its next pod resume
//! from a snapshot or say that it could not. Pure: `sandboxes.rs` applies it.

use chalk_labels::RESUME_FROM;
use serde_json::{json, Value};

/// agent-sandbox's API groups (v1.0.1 serves v1beta1).
pub const SANDBOX_GROUP: &str = "agents.x-k8s.io";
pub const EXTENSIONS_GROUP: &str = "extensions.agents.x-k8s.io";
pub const VERSION: &str = "v1beta1";

/// On a Sandbox: why its last suspend kept no memory (its next pod starts fresh).
pub const SUSPEND_FAILED: &str = "chalk.io/suspend-failed";
/// On a Sandbox: the snapshots its suspends left in the registry, newest last
/// (`REF@sha256:…`, comma-separated), for its deletion.
pub const SNAPSHOTS: &str = "chalk.io/snapshots";
/// On a pod: the snapshot it resumed from.
pub const RESUMED_FROM: &str = "chalk.io/resumed-from";
/// On a pod: why it started fresh although its Sandbox was suspended.
pub const STARTED_FRESH: &str = "chalk.io/started-fresh";
/// On a Sandbox that has snapshots in the registry: removed once they are.
pub const FINALIZER: &str = "chalk.io/sandbox-snapshots";

/// The name of the object of `kind` that controls `obj` (its controller owner reference).
pub fn controller_of<'a>(obj: &'a Value, group: &str, kind: &str) -> Option<&'a str> {
    obj["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|o| {
            o["controller"] == true
                && o["kind"] == kind
                && o["apiVersion"]
                    .as_str()
                    .is_some_and(|v| v.split('/').next() == Some(group))
        })?["name"]
        .as_str()
}

/// The Sandbox that controls `pod`, if one does.
pub fn sandbox_of(pod: &Value) -> Option<&str> {
    controller_of(pod, SANDBOX_GROUP, "Sandbox")
}

/// The SandboxClaim that controls `sandbox`, if one does (it rewrites the Sandbox's pod
/// template metadata: what the next pod must carry goes into the claim).
pub fn claim_of(sandbox: &Value) -> Option<&str> {
    controller_of(sandbox, EXTENSIONS_GROUP, "SandboxClaim")
}

/// Why a Sandbox's pod is being deleted, as far as its memory goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Going {
    /// The Sandbox was suspended: snapshot the pod before it stops.
    Suspend,
    /// Anything else: the pod stops as it would without chalk (the reason, for the log).
    Stop(&'static str),
}

/// Why the pod of `sandbox` (None: gone) is going away.
pub fn why_going(sandbox: Option<&Value>) -> Going {
    let Some(s) = sandbox else {
        return Going::Stop("its Sandbox is gone");
    };
    if !s["metadata"]["deletionTimestamp"].is_null() {
        return Going::Stop("its Sandbox is being deleted");
    }
    let ready_reason = s["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| c["reason"].as_str());
    if ready_reason == Some("SandboxExpired") {
        return Going::Stop("its Sandbox expired (shutdownTime)");
    }
    if s["spec"]["operatingMode"] != "Suspended" {
        return Going::Stop(
            "deleted or evicted while its Sandbox runs: the controller makes it again from the \
             template, without this pod's memory",
        );
    }
    Going::Suspend
}

/// The merge patch that sets (or, with None, clears) the snapshot the next pod resumes from:
/// on the claim's `additionalPodMetadata` when a claim owns the Sandbox, else on the
/// Sandbox's pod template.
pub fn resume_patch(claimed: bool, value: Option<&str>) -> Value {
    let annotations = json!({ RESUME_FROM: value });
    if claimed {
        json!({"spec": {"additionalPodMetadata": {"annotations": annotations}}})
    } else {
        json!({"spec": {"podTemplate": {"metadata": {"annotations": annotations}}}})
    }
}

/// The resume-from value the agent wrote for `sandbox`'s next pod, if still there.
pub fn pending_resume(sandbox: &Value) -> Option<&str> {
    sandbox["spec"]["podTemplate"]["metadata"]["annotations"][RESUME_FROM].as_str()
}

/// The registry repository of a Sandbox's snapshots under `prefix` (`host[:port]/path`).
pub fn repository(prefix: &str, namespace: &str, name: &str) -> String {
    format!("{}/{namespace}/{name}", prefix.trim_end_matches('/'))
}

/// The Sandbox (`namespace`, `name`) whose own repository under `prefix` reference
/// `pulled` (`repo[:tag]@digest`) is in, if it is one.
pub fn owner_of_repository(prefix: &str, pulled: &str) -> Option<(String, String)> {
    let repo = pulled.split_once('@').map_or(pulled, |(r, _)| r);
    let repo = match repo.rsplit_once(':') {
        Some((r, tag)) if !tag.contains('/') && r.contains('/') => r,
        _ => repo,
    };
    let canonical = chalk_runtime::registry_name::canonical(repo);
    let rest = canonical.strip_prefix(&format!(
        "{}/",
        chalk_runtime::registry_name::canonical(prefix)
    ))?;
    let (ns, name) = rest.split_once('/')?;
    (!name.contains('/')).then(|| (ns.to_string(), name.to_string()))
}

/// `list` (comma-separated) with `add` at its end, no more than `keep` kept (the newest).
pub fn appended(list: Option<&str>, add: &str, keep: usize) -> String {
    let mut all: Vec<&str> = list
        .unwrap_or("")
        .split(',')
        .filter(|s| !s.is_empty() && *s != add)
        .collect();
    all.push(add);
    let from = all.len().saturating_sub(keep.max(1));
    all[from..].join(",")
}

/// Whether `pod` is Ready (its Ready condition True).
pub fn is_ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(group_version: &str, kind: &str, name: &str) -> Value {
        json!({"metadata": {"ownerReferences": [
            {"apiVersion": "v1", "kind": "Other", "name": "x", "controller": false},
            {"apiVersion": group_version, "kind": kind, "name": name, "controller": true}
        ]}})
    }

    #[test]
    fn owners_are_found_by_group_kind_and_controller() {
        assert_eq!(
            sandbox_of(&owned("agents.x-k8s.io/v1beta1", "Sandbox", "sb")),
            Some("sb")
        );
        assert_eq!(
            sandbox_of(&owned("other.io/v1", "Sandbox", "sb")),
            None,
            "another group's Sandbox"
        );
        assert_eq!(sandbox_of(&json!({"metadata": {}})), None);
        assert_eq!(
            claim_of(&owned(
                "extensions.agents.x-k8s.io/v1beta1",
                "SandboxClaim",
                "c1"
            )),
            Some("c1")
        );
    }

    #[test]
    fn only_a_suspend_is_snapshotted() {
        let sb = |spec: Value, status: Value, meta: Value| json!({"metadata": meta, "spec": spec, "status": status});
        let suspended = sb(json!({"operatingMode": "Suspended"}), json!({}), json!({}));
        assert_eq!(why_going(Some(&suspended)), Going::Suspend);
        assert!(matches!(why_going(None), Going::Stop(_)));
        let deleting = sb(
            json!({"operatingMode": "Suspended"}),
            json!({}),
            json!({"deletionTimestamp": "2026-12-05T00:00:00Z"}),
        );
        assert_eq!(
            why_going(Some(&deleting)),
            Going::Stop("its Sandbox is being deleted")
        );
        let expired = sb(
            json!({"operatingMode": "Running"}),
            json!({"conditions": [{"type": "Ready", "status": "False", "reason": "SandboxExpired"}]}),
            json!({}),
        );
        assert_eq!(
            why_going(Some(&expired)),
            Going::Stop("its Sandbox expired (shutdownTime)")
        );
        let running = sb(json!({"operatingMode": "Running"}), json!({}), json!({}));
        let Going::Stop(why) = why_going(Some(&running)) else {
            panic!("an eviction is no suspend")
        };
        assert!(why.contains("evicted"), "{why}");
    }

    #[test]
    fn the_resume_goes_where_the_next_pods_metadata_comes_from() {
        let p = resume_patch(false, Some("r@sha256:1"));
        assert_eq!(
            p["spec"]["podTemplate"]["metadata"]["annotations"][RESUME_FROM],
            "r@sha256:1"
        );
        let p = resume_patch(true, None);
        assert!(p["spec"]["additionalPodMetadata"]["annotations"][RESUME_FROM].is_null());
        assert!(p["spec"]["additionalPodMetadata"]["annotations"]
            .as_object()
            .unwrap()
            .contains_key(RESUME_FROM));
    }

    #[test]
    fn snapshot_lists_keep_the_newest() {
        assert_eq!(appended(None, "a", 3), "a");
        assert_eq!(appended(Some("a,b,c"), "d", 3), "b,c,d");
        assert_eq!(appended(Some("a,b"), "b", 3), "a,b");
        assert_eq!(repository("reg:5000/sb/", "ns", "n"), "reg:5000/sb/ns/n");
    }

    #[test]
    fn a_pulled_copy_names_its_sandbox_by_its_repository() {
        let d = "sha256:00";
        assert_eq!(
            owner_of_repository("reg:5000/sb", &format!("reg:5000/sb/ns/n:s1@{d}")),
            Some(("ns".into(), "n".into()))
        );
        assert_eq!(
            owner_of_repository("reg:5000/sb", &format!("reg:5000/sb/ns/n/x@{d}")),
            None
        );
        assert_eq!(
            owner_of_repository("reg:5000/sb", &format!("reg:5000/other/ns/n@{d}")),
            None
        );
    }
}
