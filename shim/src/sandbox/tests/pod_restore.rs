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
    // Allowed, but no such snapshot in the store (said as for one it may not have); then no
    // digest at all.
    on.restore_from.namespaces = vec!["default".into()];
    on.snapshot.store = w.dir.path().join("store");
    let err = create(&w, "p3", pod("default", SNAPSHOT), on.clone()).unwrap_err();
    assert!(
        matches!(&err, ShimError::FailedPrecondition(m) if m.contains("not a snapshot of this namespace")),
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

/// A snapshot in a store at `root`, taken of a pod of Kubernetes namespace `namespace`
/// (container `secret-web`): its id.
fn stored(root: &Path, namespace: &str) -> String {
    use chalk_runtime::snapshot::{
        describe::describe,
        manifest::Source,
        owner::Owner,
        store::{Commit, Store},
        Kind,
    };
    let store = Store::open(root).unwrap();
    let ingest = store
        .begin_ingest(&format!("k8s.io+snap-{namespace}"))
        .unwrap();
    std::fs::write(ingest.dir().join("checkpoint.img"), b"state").unwrap();
    let global = GlobalArgs {
        root: "/run/x".into(),
        flags: vec!["--platform=ptrace".into()],
    };
    let source = Source {
        namespace: "k8s.io".into(),
        container_id: "secret-web".into(),
        sandbox_id: "secret-web".into(),
    };
    let mut m = describe(Kind::Snapshot, source, "runsc 1", &global, b"{}", None).unwrap();
    let spec = serde_json::json!({"annotations": {
        "io.kubernetes.cri.sandbox-namespace": namespace,
        "io.kubernetes.cri.sandbox-name": "secret-web",
    }});
    m.owner = Some(Owner::of_container("k8s.io", &spec, None));
    m.seal(ingest.dir(), 1).unwrap();
    let c = store
        .commit(
            ingest,
            Commit {
                namespace: "k8s.io",
                spec: b"{}",
                subject: None,
                annotations: Default::default(),
            },
        )
        .unwrap();
    c.manifest.digest
}

#[test]
fn a_pod_restores_only_its_own_namespaces_snapshots_and_learns_nothing_of_others() {
    let w = world();
    let mut on = w.options(Vec::new());
    on.restore_from.enabled = true;
    on.restore_from.namespaces = vec!["a".into(), "b".into()];
    on.snapshot.store = w.dir.path().join("store");
    let id = stored(&on.snapshot.store, "a");
    // B names A's snapshot by its id: the same words as for one that does not exist, and
    // nothing of it (its container, its files).
    let err = create(&w, "b1", pod("b", &id), on.clone()).unwrap_err();
    let ShimError::FailedPrecondition(m) = &err else {
        panic!("{err:?}")
    };
    assert!(m.contains("not a snapshot of this namespace"), "{m}");
    assert!(
        !m.contains("secret-web") && !m.contains("checkpoint.img"),
        "{m}"
    );
    // A passes the owner check (and is then refused for this fake runsc's version, with
    // the snapshot's details: it is A's own).
    let err = create(&w, "a1", pod("a", &id), on.clone()).unwrap_err();
    assert!(
        !err.to_string().contains("not a snapshot of this namespace"),
        "{err:?}"
    );
    // Shared with B by the administrator, B may.
    on.restore_from.shared = vec![chalk_runtime::pod_restore::Shared {
        digests: vec![id.clone()],
        prefixes: Vec::new(),
        namespaces: vec!["b".into()],
    }];
    let err = create(&w, "b2", pod("b", &id), on).unwrap_err();
    assert!(
        !err.to_string().contains("not a snapshot of this namespace"),
        "{err:?}"
    );
    // A registry reference outside B's prefixes is refused before any registry is asked.
    let mut on = w.options(Vec::new());
    on.restore_from.enabled = true;
    on.restore_from.namespaces = vec!["b".into()];
    on.restore_from.registries = vec!["reg.example/snaps/{namespace}".into()];
    let a_ref = format!("reg.example/snaps/a/web@{id}");
    let err = create(&w, "b3", pod("b", &a_ref), on).unwrap_err();
    assert!(
        err.to_string()
            .contains("outside the registry prefixes namespace b"),
        "{err:?}"
    );
    for id in ["b1", "b2", "b3", "a1"] {
        assert!(w.shim.state(id, "").is_err(), "{id} exists");
    }
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
