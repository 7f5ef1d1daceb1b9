//! A pod's sandbox that asks to start from a snapshot (`chalk.io/restore-from`) on fakes: what
//! is refused before anything is made, and that it leaves no sandbox behind.

use super::fakes::*;

const SNAPSHOT: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn pod(namespace: &str, restore_from: &str) -> serde_json::Value {
    serde_json::json!({
        "io.kubernetes.cri.container-type": "sandbox",
        "io.kubernetes.cri.sandbox-namespace": namespace,
        "io.kubernetes.cri.sandbox-name": "p",
        "chalk.io/restore-from": restore_from,
    })
}

fn create(
    w: &World,
    id: &str,
    annotations: serde_json::Value,
    opts: RuntimeOptions,
) -> Result<u32> {
    w.shim.create(CreateRequest {
        id: id.to_string(),
        bundle: w.bundle(id, annotations),
        rootfs: Vec::new(),
        stdio: StdioPaths::default(),
        checkpoint: String::new(),
        options: Ok(opts),
    })
}

#[test]
fn a_pod_from_a_snapshot_is_refused_unless_the_node_allows_its_namespace() {
    let w = world();
    let off = w.options(Vec::new());
    let err = create(&w, "p1", pod("default", SNAPSHOT), off.clone()).unwrap_err();
    assert!(
        matches!(&err, ShimError::FailedPrecondition(m) if m.contains("enabled = true")),
        "{err:?}"
    );
    let mut on = off;
    on.restore_from.enabled = true;
    on.restore_from.namespaces = vec!["agents".into()];
    let err = create(&w, "p2", pod("default", SNAPSHOT), on.clone()).unwrap_err();
    assert!(
        matches!(&err, ShimError::FailedPrecondition(m) if m.contains("\"default\"")),
        "{err:?}"
    );
    // Allowed, but no such snapshot in the store; then no digest at all.
    on.restore_from.namespaces = vec!["default".into()];
    on.snapshot.store = w.dir.path().join("store");
    let err = create(&w, "p3", pod("default", SNAPSHOT), on.clone()).unwrap_err();
    assert!(
        matches!(&err, ShimError::FailedPrecondition(m) if m.contains("not in this node's store")),
        "{err:?}"
    );
    let err = create(&w, "p4", pod("default", "app:latest"), on).unwrap_err();
    assert!(
        matches!(&err, ShimError::InvalidArgument(m) if m.contains("pinned by digest")),
        "{err:?}"
    );
    // Nothing was made for any of them: no sandbox, no container, no event.
    for id in ["p1", "p2", "p3", "p4"] {
        assert!(w.shim.state(id, "").is_err(), "{id} exists");
    }
    assert!(!w
        .runtime
        .state
        .lock()
        .unwrap()
        .made
        .keys()
        .any(|k| k.starts_with('p')));
    assert!(w.events.topics().is_empty(), "{:?}", w.events.topics());
}

#[test]
fn the_annotation_is_a_pods_and_a_plain_container_is_told_what_to_use() {
    let w = world();
    let plain = serde_json::json!({"chalk.io/restore-from": SNAPSHOT});
    let err = create(&w, "plain", plain, w.options(Vec::new())).unwrap_err();
    assert!(
        matches!(&err, ShimError::InvalidArgument(m) if m.contains("pod annotation") && m.contains("chalkctl fork")),
        "{err:?}"
    );
}
