//! A snapshot's manifest from what the shim knows of its source, and the checks a restore
//! passes before anything is made for it. Pure, but for the host facts read from /proc.

use std::path::Path;

use serde_json::Value;

use super::{
    hash::sha256_hex,
    manifest::{
        ExcludedMount, HostInfo, ImageRef, Kind, Manifest, RunscInfo, Source, SpecInfo,
        SCHEMA_VERSION,
    },
    Isolation,
};
use crate::runsc::GlobalArgs;

/// What a manifest says of its source, before the checkpoint's files are hashed into it.
pub fn describe(
    kind: Kind,
    source: Source,
    runsc_version: &str,
    global: &GlobalArgs,
    spec_bytes: &[u8],
    image: Option<ImageRef>,
) -> Result<Manifest, String> {
    let spec: Value =
        serde_json::from_slice(spec_bytes).map_err(|e| format!("the spec is not JSON: {e}"))?;
    let network = global.network().to_string();
    Ok(Manifest {
        schema_version: SCHEMA_VERSION,
        kind,
        created: super::manifest::rfc3339_now(),
        source,
        runsc: RunscInfo {
            version: runsc_version.to_string(),
            platform: global.platform().to_string(),
            network: network.clone(),
            overlay: global.overlay().map(String::from),
            flags: global.flags.clone(),
        },
        host: HostInfo::current(),
        image,
        spec: SpecInfo {
            sha256: sha256_hex(spec_bytes),
            resources: spec["linux"]["resources"].clone(),
            isolation: Isolation::from_spec(&spec, &network),
        },
        excluded_mounts: excluded_mounts(&spec),
        files: Vec::new(),
        memory_bytes: None,
        terminal: None,
        extra: Default::default(),
        owner: None,
    })
}

/// Bind mounts: their content lives on the host and is not in the snapshot.
pub fn excluded_mounts(spec: &Value) -> Vec<ExcludedMount> {
    spec["mounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| crate::spec::is_bind_mount(m))
        .map(|m| ExcludedMount {
            destination: m["destination"].as_str().unwrap_or_default().to_string(),
            source: m["source"].as_str().unwrap_or_default().to_string(),
            kind: m["type"].as_str().unwrap_or("bind").to_string(),
        })
        .collect()
}

/// Where a restore would run: this host's runsc and the container it restores into.
pub struct Target<'a> {
    pub id: &'a str,
    pub runsc_version: &'a str,
    pub global: &'a GlobalArgs,
    /// The spec as runsc will get it.
    pub spec: &'a Value,
    /// The image the container runs (containerd's record of it).
    pub image: Option<&'a ImageRef>,
}

/// Refuses a restore of `m` (from `dir`) into `t`, naming what differs: another runsc,
/// platform, arch or overlay; a sandbox that would reach further than its source; another
/// image (by digest) than the one the snapshot was taken from.
pub fn check_restore(m: &Manifest, dir: &Path, t: &Target) -> Result<(), String> {
    let mut problems =
        m.check_runtime(t.runsc_version, t.global.platform(), std::env::consts::ARCH);
    let overlay = t.global.overlay().map(String::from);
    if m.runsc.overlay != overlay {
        problems.push(format!(
            "root filesystem overlay: snapshot {:?}, here {overlay:?}",
            m.runsc.overlay
        ));
    }
    if !problems.is_empty() {
        return Err(format!(
            "snapshot {} cannot be restored here: {}",
            dir.display(),
            problems.join("; ")
        ));
    }
    let wider = m
        .spec
        .isolation
        .widenings(&Isolation::from_spec(t.spec, t.global.network()));
    if !wider.is_empty() {
        return Err(format!(
            "restoring {} as {} would let the sandbox reach further than its source: {}",
            dir.display(),
            t.id,
            wider.join("; ")
        ));
    }
    match (&m.image, t.image) {
        (None, _) => Ok(()),
        (Some(source), Some(here)) if here.digest == source.digest => Ok(()),
        (Some(source), Some(here)) => Err(format!(
            "container {} uses image {} at {}, but the snapshot was taken from {} at {}: \
             restore onto the image by that digest",
            t.id, here.name, here.digest, source.name, source.digest
        )),
        (Some(source), None) => Err(format!(
            "container {} has no image, but the snapshot was taken from {} at {}",
            t.id, source.name, source.digest
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn global(flags: &[&str]) -> GlobalArgs {
        GlobalArgs {
            root: "/run/chalk/default/web".into(),
            flags: flags.iter().map(|f| f.to_string()).collect(),
        }
    }

    fn source() -> Source {
        Source {
            namespace: "default".into(),
            container_id: "web".into(),
            sandbox_id: "web".into(),
        }
    }

    const SPEC: &str = r#"{"process": {"args": ["sh"], "capabilities": {"bounding": ["CAP_KILL"]}},
        "linux": {"resources": {"memory": {"limit": 1048576}}},
        "mounts": [{"destination": "/data", "type": "bind", "source": "/srv"}]}"#;

    #[test]
    fn the_manifest_describes_runsc_spec_and_image() {
        let g = global(&[
            "--platform=ptrace",
            "--network=none",
            "--overlay2=root:memory",
        ]);
        let image = ImageRef {
            name: "busybox".into(),
            digest: "sha256:aa".into(),
        };
        let m = describe(
            Kind::Snapshot,
            source(),
            "runsc 1",
            &g,
            SPEC.as_bytes(),
            Some(image),
        )
        .unwrap();
        assert_eq!(m.runsc.platform, "ptrace");
        assert_eq!(m.runsc.network, "none");
        assert_eq!(m.runsc.overlay.as_deref(), Some("--overlay2=root:memory"));
        assert_eq!(m.spec.resources["memory"]["limit"], 1048576);
        assert_eq!(m.spec.sha256, sha256_hex(SPEC.as_bytes()));
        assert_eq!(m.excluded_mounts[0].destination, "/data");
        assert!(describe(Kind::Snapshot, source(), "v", &g, b"nope", None).is_err());
    }

    #[test]
    fn bind_mounts_are_listed_as_outside_the_snapshot() {
        let spec = json!({"mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/data", "type": "bind", "source": "/srv/data", "options": ["rbind"]},
            {"destination": "/etc/hosts", "source": "/var/hosts", "options": ["bind", "ro"]},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"}
        ]});
        let got = excluded_mounts(&spec);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].destination, "/data");
        assert_eq!(got[1].source, "/var/hosts");
    }

    #[test]
    fn a_restore_is_refused_with_what_differs() {
        let g = global(&["--platform=ptrace", "--network=none"]);
        let image = ImageRef {
            name: "busybox".into(),
            digest: "sha256:aa".into(),
        };
        let m = describe(
            Kind::Snapshot,
            source(),
            "runsc 1",
            &g,
            SPEC.as_bytes(),
            Some(image.clone()),
        )
        .unwrap();
        let spec: Value = serde_json::from_str(SPEC).unwrap();
        let dir = Path::new("/ck");
        let target = |version, global, spec, image| Target {
            id: "fork",
            runsc_version: version,
            global,
            spec,
            image,
        };
        assert!(check_restore(&m, dir, &target("runsc 1", &g, &spec, Some(&image))).is_ok());
        let err = check_restore(&m, dir, &target("runsc 2", &g, &spec, Some(&image))).unwrap_err();
        assert!(
            err.contains("runsc version") && err.contains("runsc 2"),
            "{err}"
        );
        let other = global(&["--platform=ptrace", "--network=none", "--overlay"]);
        let err =
            check_restore(&m, dir, &target("runsc 1", &other, &spec, Some(&image))).unwrap_err();
        assert!(err.contains("overlay"), "{err}");
        let mut wider = spec.clone();
        wider["process"]["capabilities"]["bounding"] = json!(["CAP_KILL", "CAP_SYS_ADMIN"]);
        let err = check_restore(&m, dir, &target("runsc 1", &g, &wider, Some(&image))).unwrap_err();
        assert!(
            err.contains("reach further") && err.contains("CAP_SYS_ADMIN"),
            "{err}"
        );
        let moved = ImageRef {
            digest: "sha256:bb".into(),
            ..image.clone()
        };
        let err = check_restore(&m, dir, &target("runsc 1", &g, &spec, Some(&moved))).unwrap_err();
        assert!(
            err.contains("sha256:aa") && err.contains("sha256:bb"),
            "{err}"
        );
        let err = check_restore(&m, dir, &target("runsc 1", &g, &spec, None)).unwrap_err();
        assert!(err.contains("has no image"), "{err}");
    }
}
