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

#[test]
fn the_agents_role_grants_only_what_it_uses() {
    let text = packaging("agent.yaml");
    let role: serde_yaml::Value = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .find(|d: &serde_yaml::Value| {
            d["kind"] == "ClusterRole" && d["metadata"]["name"] == "chalk-agent"
        })
        .expect("the agent's ClusterRole");
    let mut grants: Vec<String> = Vec::new();
    for rule in role["rules"].as_sequence().unwrap() {
        for r in rule["resources"].as_sequence().unwrap() {
            for v in rule["verbs"].as_sequence().unwrap() {
                grants.push(format!("{} {}", r.as_str().unwrap(), v.as_str().unwrap()));
            }
        }
    }
    grants.sort();
    assert_eq!(
        grants,
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
}
