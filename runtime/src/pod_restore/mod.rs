//! A pod that starts from a snapshot (`chalk.io/restore-from`): what the annotation may say,
//! whether this node lets a pod's namespace use it, whose snapshots it may name
//! ([`policy`]), and how the new pod's containers match the snapshot's. Pure: the shim
//! applies it at Create.
//!
//! The new pod's spec governs everything a container may reach (mounts, devices,
//! capabilities, annotations, limits): the snapshot gives memory and process state only.

pub mod policy;

use serde::{Deserialize, Serialize};

pub use crate::snapshot::extra::{MemberRole, PodFacts};
pub use crate::snapshot::owner::{CRI_SANDBOX_NAME, CRI_SANDBOX_NAMESPACE};
pub use chalk_labels::{RESTORE_FROM, RESUME_FROM};
pub use policy::{Grant, Pod, Refusal, Shared};
/// CRI's annotation of a pod container's name.
pub const CRI_CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";

/// `[restore_from]` of the runtime options: off unless a node admin turns it on, and then
/// only for the Kubernetes namespaces listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreFromOptions {
    #[serde(default)]
    pub enabled: bool,
    /// The pods' namespaces that may start from a snapshot; `"*"` is any.
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// How long a restored pod's sandbox waits for the snapshot's containers to join it: one
    /// the new pod lacks never comes, and the sandbox then ends with the names missing.
    #[serde(default = "default_wait_secs")]
    pub wait_secs: u64,
    /// Where a snapshot named `REF@sha256:…` is pulled from: containerd's registry hosts
    /// directory (`<host[:port]>/hosts.toml`, CA files), as `chalkctl snapshot pull` reads it.
    #[serde(default = "default_hosts_dir")]
    pub hosts_dir: std::path::PathBuf,
    /// A directory holding the `config.json` (docker's format) with the node's credentials
    /// for those registries; none: registries that need none. Passed to chalkctl as
    /// DOCKER_CONFIG: never logged, never stored with a snapshot.
    #[serde(default)]
    pub docker_config: Option<std::path::PathBuf>,
    /// How long such a pull may take before the pod is refused.
    #[serde(default = "default_pull_secs")]
    pub pull_secs: u64,
    /// The registry prefixes a namespace's pods may name (`REF@sha256:…`), `{namespace}`
    /// standing for the pod's (`reg.example/snaps/{namespace}`): none, and only the node's
    /// store and shared snapshots. The node's credentials are used under these only.
    #[serde(default)]
    pub registries: Vec<String>,
    /// agent-sandbox: the prefix the node agents suspend Sandboxes to (their
    /// `--suspend-to`). A pod resumes (`chalk.io/resume-from`) only from its own Sandbox's
    /// repository there, `SUSPEND_TO/NAMESPACE/POD`, and nothing under it is a
    /// `restore-from`.
    #[serde(default)]
    pub suspend_to: Option<String>,
    /// Golden snapshots an administrator shares with namespaces.
    #[serde(default)]
    pub shared: Vec<Shared>,
    /// The most memory a pod's pull (and the server of its memory) may use: they run in a
    /// cgroup of their own (`chalk-pulls`), which the node's memory accounting sees.
    #[serde(default = "default_pull_memory")]
    pub pull_memory_bytes: u64,
}

fn default_pull_memory() -> u64 {
    512 << 20
}

fn default_hosts_dir() -> std::path::PathBuf {
    "/etc/containerd/certs.d".into()
}

fn default_pull_secs() -> u64 {
    300
}

fn default_wait_secs() -> u64 {
    120
}

impl Default for RestoreFromOptions {
    fn default() -> Self {
        RestoreFromOptions {
            enabled: false,
            namespaces: Vec::new(),
            wait_secs: default_wait_secs(),
            hosts_dir: default_hosts_dir(),
            docker_config: None,
            pull_secs: default_pull_secs(),
            registries: Vec::new(),
            suspend_to: None,
            shared: Vec::new(),
            pull_memory_bytes: default_pull_memory(),
        }
    }
}

/// The snapshot's containers (`expected`) that have not joined the restored pod (`joined`).
pub fn missing<'a>(expected: &'a [String], joined: &[String]) -> Vec<&'a str> {
    expected
        .iter()
        .filter(|n| !joined.contains(n))
        .map(String::as_str)
        .collect()
}

/// What `chalk.io/restore-from` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreSource {
    /// A snapshot in this node's store, by its id (the digest of its OCI manifest).
    Local { id: String },
    /// A snapshot in a registry, pinned by digest: pulled into the store first.
    Remote { reference: String, id: String },
}

/// The snapshot a pod's sandbox spec asks to start from, and the annotation that asks:
/// `chalk.io/resume-from` (its own suspend's) before `chalk.io/restore-from`.
pub fn asked(spec: &serde_json::Value) -> Option<(&'static str, &str)> {
    [RESUME_FROM, RESTORE_FROM]
        .into_iter()
        .find_map(|key| crate::spec::annotation(spec, key).map(|v| (key, v)))
}

impl RestoreSource {
    pub fn parse(value: &str) -> Result<RestoreSource, String> {
        Self::parse_from(RESTORE_FROM, value)
    }

    /// As [`RestoreSource::parse`], `value` given by annotation `key`.
    pub fn parse_from(key: &str, value: &str) -> Result<RestoreSource, String> {
        let value = value.trim();
        let form = "give `sha256:<64 hex digits>` (a snapshot in this node's store) or \
                    `REGISTRY/REPOSITORY[:TAG]@sha256:<64 hex digits>`";
        if is_digest(value) {
            return Ok(RestoreSource::Local { id: value.into() });
        }
        match value.rsplit_once('@') {
            Some((reference, id)) if is_digest(id) && valid_reference(reference) => {
                Ok(RestoreSource::Remote {
                    reference: without_tag(reference).into(),
                    id: id.into(),
                })
            }
            Some((_, id)) if !is_digest(id) => Err(format!(
                "{key} {value:?}: {id:?} is no sha256 digest: {form}"
            )),
            Some(_) => Err(format!(
                "{key} {value:?}: the reference before @ is not a registry reference: \
                 {form}"
            )),
            None => Err(format!(
                "{key} {value:?} is not pinned by digest (a tag could move): {form}"
            )),
        }
    }

    /// The snapshot's id, wherever it is.
    pub fn id(&self) -> &str {
        match self {
            RestoreSource::Local { id } | RestoreSource::Remote { id, .. } => id,
        }
    }
}

fn is_digest(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// `host[:port]/path[:tag]` with the characters a registry reference may have. A tag is
/// allowed (`chalkctl snapshot push` and the PodSnapshot's `restoreFrom` print one) but
/// never used: the digest pins the snapshot.
fn valid_reference(r: &str) -> bool {
    let Some((host, path)) = r.split_once('/') else {
        return false;
    };
    let ok = |s: &str, extra: &[u8]| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || extra.contains(&b))
    };
    let (path, tag) = match path.rsplit_once(':') {
        Some((p, t)) if !t.contains('/') => (p, Some(t)),
        _ => (path, None),
    };
    let tag_ok = tag.is_none_or(|t| {
        t.len() <= 128
            && !t.starts_with(['.', '-'])
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            && !t.is_empty()
    });
    ok(host, b".-:") && path.split('/').all(|p| ok(p, b"._-")) && tag_ok && !r.contains("..")
}

/// A valid reference without its tag, if it has one.
fn without_tag(r: &str) -> &str {
    match r.rsplit_once(':') {
        Some((p, t)) if !t.contains('/') && p.contains('/') => p,
        _ => r,
    }
}

/// Whether pods of Kubernetes namespace `namespace` may start from a snapshot here; if not,
/// the refusal in words, with what a node admin would change.
pub fn admit(opts: &RestoreFromOptions, namespace: &str, pod: &str) -> Result<(), String> {
    if !opts.enabled {
        return Err(format!(
            "pod {namespace}/{pod} asks to start from a snapshot ({RESTORE_FROM}), which this \
             node does not allow: its runtime options need [restore_from] enabled = true and \
             the namespace in namespaces"
        ));
    }
    if !opts.namespaces.iter().any(|n| n == namespace || n == "*") {
        return Err(format!(
            "pod {namespace}/{pod}: namespace {namespace:?} may not start pods from snapshots \
             on this node (allowed: {:?}; see [restore_from] namespaces in the runtime options)",
            opts.namespaces
        ));
    }
    Ok(())
}

/// Checks the new pod's container `name` against the snapshot's pod (`pod`): restored into
/// the sandbox, skipped (an init container that had completed), or refused with why.
pub fn match_member(snapshot: &str, pod: &PodFacts, name: &str) -> Result<MemberRole, String> {
    match pod.role_of(name) {
        MemberRole::Unknown => {
            let names: Vec<String> = pod.containers.iter().map(|m| m.name.clone()).collect();
            let done = if pod.completed.is_empty() {
                String::new()
            } else {
                format!(", and had run {} to completion", list(&pod.completed))
            };
            Err(format!(
                "container {name:?} is not in snapshot {snapshot}, which holds {}{done}: a pod \
                 that starts from a snapshot has the snapshot's containers, by name",
                list(&names)
            ))
        }
        role => Ok(role),
    }
}

/// Container `name` of a pod that starts from a snapshot runs the image (`runs`, by digest)
/// the snapshot's ran (`wanted`).
pub fn same_image(name: &str, wanted: &str, runs: Option<&str>) -> Result<(), String> {
    match runs {
        Some(d) if d == wanted => Ok(()),
        Some(d) => Err(format!(
            "container {name:?} runs image {d}, but the snapshot's ran {wanted}: a restore \
             needs the same image by digest (pin the pod's image to it)"
        )),
        None => Err(format!(
            "container {name:?} has no image record to compare with the snapshot's ({wanted})"
        )),
    }
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "no containers besides its sandbox".into()
    } else {
        names
            .iter()
            .map(|n| format!("{n:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn a_local_id_and_a_pinned_reference_parse() {
        assert_eq!(
            RestoreSource::parse(D).unwrap(),
            RestoreSource::Local { id: D.into() }
        );
        let r = RestoreSource::parse(&format!("127.0.0.1:5000/snaps/app@{D}")).unwrap();
        assert_eq!(
            r,
            RestoreSource::Remote {
                reference: "127.0.0.1:5000/snaps/app".into(),
                id: D.into()
            }
        );
        assert_eq!(r.id(), D);
        // What a push prints (a tag and the digest): the tag is dropped, the digest pins it.
        let tagged = RestoreSource::parse(&format!("127.0.0.1:5000/snaps/app:v1@{D}")).unwrap();
        assert_eq!(tagged, r);
    }

    #[test]
    fn a_suspends_own_snapshot_comes_before_the_templates() {
        let spec = |a: serde_json::Value| serde_json::json!({ "annotations": a });
        assert_eq!(asked(&spec(serde_json::json!({}))), None);
        let golden = spec(serde_json::json!({ RESTORE_FROM: "sha256:golden" }));
        assert_eq!(asked(&golden), Some((RESTORE_FROM, "sha256:golden")));
        let both = spec(serde_json::json!({
            RESTORE_FROM: "sha256:golden",
            RESUME_FROM: "sha256:own",
        }));
        assert_eq!(asked(&both), Some((RESUME_FROM, "sha256:own")));
        let err = RestoreSource::parse_from(RESUME_FROM, "latest").unwrap_err();
        assert!(err.starts_with(RESUME_FROM), "{err}");
    }

    #[test]
    fn bad_sources_are_refused_with_the_form_to_use() {
        for bad in [
            "",
            "sha256:abc",
            "latest",
            "registry.example/app:v1",
            &format!("registry.example/app@{}", &D[..70]),
            &format!("app@{D}"),
            &format!("Registry.example/App@{D}"),
            &format!("host/../x@{D}"),
            &format!("host/x:@{D}"),
            &format!("host/x:-v1@{D}"),
            &format!("host/x:v 1@{D}"),
            &D.to_uppercase(),
        ] {
            let err = RestoreSource::parse(bad).unwrap_err();
            assert!(
                err.contains(RESTORE_FROM) && err.contains("sha256:<64"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn admission_is_off_by_default_and_then_by_namespace() {
        let off = RestoreFromOptions::default();
        let err = admit(&off, "default", "p").unwrap_err();
        assert!(err.contains("enabled = true"), "{err}");
        let on = RestoreFromOptions {
            enabled: true,
            namespaces: vec!["agents".into()],
            ..Default::default()
        };
        assert!(admit(&on, "agents", "p").is_ok());
        let err = admit(&on, "default", "p").unwrap_err();
        assert!(
            err.contains("\"default\"") && err.contains("agents"),
            "{err}"
        );
        let any = RestoreFromOptions {
            enabled: true,
            namespaces: vec!["*".into()],
            ..Default::default()
        };
        assert!(admit(&any, "whatever", "p").is_ok());
    }

    #[test]
    fn a_member_runs_the_snapshots_image_by_digest() {
        assert!(same_image("web", D, Some(D)).is_ok());
        let other = D.replace('0', "f");
        let err = same_image("web", D, Some(&other)).unwrap_err();
        assert!(
            err.contains(&other) && err.contains(D) && err.contains("by digest"),
            "{err}"
        );
        assert!(same_image("web", D, None).is_err());
    }

    #[test]
    fn the_containers_still_missing_are_named() {
        let expected = vec!["web".to_string(), "side".to_string()];
        assert_eq!(missing(&expected, &["web".into()]), ["side"]);
        assert!(missing(&expected, &["side".into(), "web".into()]).is_empty());
        assert_eq!(RestoreFromOptions::default().wait_secs, 120);
    }

    #[test]
    fn containers_match_the_snapshots_by_name_and_init_containers_are_skipped() {
        let pod: PodFacts = serde_json::from_value(serde_json::json!({
            "containers": [
                {"id": "1", "name": "web", "image": "i", "spec": {}},
                {"id": "2", "name": "side", "image": "i", "spec": {}}
            ],
            "completed": ["setup"]
        }))
        .unwrap();
        assert_eq!(match_member(D, &pod, "side").unwrap(), MemberRole::Restored);
        assert_eq!(
            match_member(D, &pod, "setup").unwrap(),
            MemberRole::Completed
        );
        let err = match_member(D, &pod, "other").unwrap_err();
        assert!(
            err.contains("\"other\"")
                && err.contains("\"web\", \"side\"")
                && err.contains("\"setup\""),
            "{err}"
        );
        let err = match_member(D, &PodFacts::default(), "web").unwrap_err();
        assert!(err.contains("no containers"), "{err}");
    }
}
