//! The committed manifests are what the code makes and means.

use std::path::Path;

fn packaging(file: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging/kubernetes")
        .join(file);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn the_committed_crd_is_the_one_the_agent_serves() {
    assert_eq!(
        packaging("crd.yaml"),
        chalk_agent::crd::crd_yaml(),
        "packaging/kubernetes/crd.yaml is stale: `chalk-agent crd > packaging/kubernetes/crd.yaml`"
    );
}

/// Every `resource verb` that documents of `kind` named `name` in agent.yaml grant.
fn grants(kind: &str, name: &str) -> Vec<String> {
    let text = packaging("agent.yaml");
    let role: serde_yaml::Value = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .find(|d: &serde_yaml::Value| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind} {name}"));
    let mut grants: Vec<String> = Vec::new();
    for rule in role["rules"].as_sequence().unwrap() {
        for r in rule["resources"].as_sequence().unwrap() {
            for v in rule["verbs"].as_sequence().unwrap() {
                grants.push(format!("{} {}", r.as_str().unwrap(), v.as_str().unwrap()));
            }
        }
    }
    grants.sort();
    grants
}

#[test]
fn the_agents_roles_grant_only_what_they_use() {
    assert_eq!(
        grants("ClusterRole", "chalk-agent"),
        [
            "events create",
            "events patch",
            "pods delete",
            "pods get",
            "pods list",
            "pods patch",
            "pods watch",
            "podsnapshots get",
            "podsnapshots list",
            "podsnapshots patch",
            "podsnapshots watch",
            "podsnapshots/status patch",
            "sandboxclaims get",
            "sandboxclaims patch",
            "sandboxes get",
            "sandboxes list",
            "sandboxes patch",
            "sandboxes watch",
        ]
    );
    // Its records of what it pushed, in its own namespace only.
    assert_eq!(
        grants("Role", "chalk-agent"),
        ["configmaps create", "configmaps get", "configmaps update"]
    );
    // The cluster agent: no pods, no nodes, no PodSnapshots.
    assert_eq!(
        grants("ClusterRole", "chalk-cluster-agent"),
        [
            "sandboxes get",
            "sandboxes list",
            "sandboxes patch",
            "sandboxes watch"
        ]
    );
    assert_eq!(
        grants("Role", "chalk-cluster-agent"),
        [
            "configmaps delete",
            "configmaps get",
            "configmaps list",
            "configmaps update",
            "configmaps watch"
        ]
    );
}

#[test]
fn the_node_agent_runs_only_on_chalk_nodes_and_is_held_to_its_own() {
    let text = packaging("agent.yaml");
    let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    assert_eq!(
        ds["spec"]["template"]["spec"]["nodeSelector"]["chalk.io/runtime"],
        "true"
    );
    let policies: Vec<&str> = docs
        .iter()
        .filter(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
        .map(|d| d["spec"]["policyName"].as_str().unwrap())
        .collect();
    for p in [
        "chalk-agent-own-node-pods",
        "chalk-agent-own-node-podsnapshots",
        "chalk-agent-sandbox-metadata",
    ] {
        assert!(policies.contains(&p), "{p} is not bound: {policies:?}");
    }
}
