//! The manifest's unit tests; `sample()` is shared with the store's.

use super::*;

#[test]
fn references_pinned_by_digest_carry_their_digest() {
    let d = format!("sha256:{}", "ab".repeat(32));
    assert_eq!(
        ImageRef::pinned(&format!("docker.io/library/busybox@{d}")),
        Some(("docker.io/library/busybox", d.as_str()))
    );
    assert_eq!(ImageRef::pinned("docker.io/library/busybox:latest"), None);
    assert_eq!(
        ImageRef::unpinned(&format!("docker.io/library/busybox@{d}")),
        "docker.io/library/busybox"
    );
    assert_eq!(ImageRef::unpinned("busybox:latest"), "busybox:latest");
    assert_eq!(ImageRef::pinned("busybox@sha256:short"), None);
    assert_eq!(ImageRef::pinned("busybox@md5:abc"), None);
}

pub fn sample() -> Manifest {
    Manifest {
        schema_version: SCHEMA_VERSION,
        kind: Kind::Snapshot,
        created: rfc3339_now(),
        source: Source {
            namespace: "default".into(),
            container_id: "c1".into(),
            sandbox_id: "c1".into(),
        },
        runsc: RunscInfo {
            version: "runsc version 0.0~20221219.0".into(),
            platform: "ptrace".into(),
            network: "none".into(),
            overlay: Some("--overlay".into()),
            flags: vec!["--platform=ptrace".into()],
        },
        host: HostInfo::current(),
        image: Some(ImageRef {
            name: "docker.io/library/busybox:latest".into(),
            digest: "sha256:abc".into(),
        }),
        spec: SpecInfo {
            sha256: "00".into(),
            resources: serde_json::json!({}),
            isolation: Isolation::default(),
        },
        excluded_mounts: vec![ExcludedMount {
            destination: "/data".into(),
            source: "/srv/data".into(),
            kind: "bind".into(),
        }],
        files: Vec::new(),
        memory_bytes: None,
        terminal: None,
        extra: Extra::default(),
        owner: None,
    }
}

fn snapshot_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("checkpoint.img"), b"memory").unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::fs::write(dir.path().join("sub/pages.img"), vec![7u8; 4096]).unwrap();
    dir
}

#[test]
fn round_trip_and_verify() {
    let dir = snapshot_dir();
    let mut m = sample();
    m.seal(dir.path(), 2).unwrap();
    assert_eq!(m.files.len(), 2);
    assert_eq!(m.files[0].path, "checkpoint.img");
    assert_eq!(m.files[1].path, "sub/pages.img");
    let loaded = Manifest::load(dir.path()).unwrap();
    assert_eq!(loaded, m);
    loaded.verify_files(dir.path(), 2).unwrap();
    assert_eq!(loaded.total_size(), 6 + 4096);
    let mode = std::fs::metadata(dir.path().join(FILE_NAME))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn a_flipped_byte_is_named_with_both_digests() {
    let dir = snapshot_dir();
    let mut m = sample();
    m.seal(dir.path(), 1).unwrap();
    std::fs::write(dir.path().join("checkpoint.img"), b"memorz").unwrap();
    let err = Manifest::load(dir.path())
        .unwrap()
        .verify_files(dir.path(), 1)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("checkpoint.img") && err.contains(&m.files[0].sha256),
        "{err}"
    );
}

#[test]
fn missing_extra_and_resized_files_are_refused() {
    let dir = snapshot_dir();
    sample().seal(dir.path(), 1).unwrap();
    std::fs::write(dir.path().join("intruder"), b"x").unwrap();
    let m = Manifest::load(dir.path()).unwrap();
    let err = m.verify_files(dir.path(), 1).unwrap_err().to_string();
    assert!(err.contains("\"intruder\" is not in the manifest"), "{err}");
    std::fs::remove_file(dir.path().join("intruder")).unwrap();
    std::fs::write(dir.path().join("checkpoint.img"), b"more memory").unwrap();
    let err = m.verify_files(dir.path(), 1).unwrap_err().to_string();
    assert!(err.contains("11 bytes, the manifest says 6"), "{err}");
    std::fs::remove_file(dir.path().join("checkpoint.img")).unwrap();
    let err = m.verify_files(dir.path(), 1).unwrap_err().to_string();
    assert!(
        err.contains("\"checkpoint.img\" of the manifest is missing"),
        "{err}"
    );
}

#[test]
fn missing_manifest_and_unknown_schema_are_refused() {
    let dir = snapshot_dir();
    let err = Manifest::load(dir.path()).unwrap_err().to_string();
    assert!(err.contains("not a chalk snapshot"), "{err}");
    let mut m = sample();
    m.seal(dir.path(), 1).unwrap();
    let path = dir.path().join(FILE_NAME);
    let mut raw: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    raw["schema_version"] = 99.into();
    std::fs::write(&path, raw.to_string()).unwrap();
    let err = Manifest::load(dir.path()).unwrap_err().to_string();
    assert!(err.contains("schema_version Some(99)"), "{err}");
    std::fs::write(&path, b"{not json").unwrap();
    assert!(Manifest::load(dir.path()).is_err());
}

#[test]
fn paths_outside_the_snapshot_are_refused() {
    let dir = snapshot_dir();
    let mut m = sample();
    m.seal(dir.path(), 1).unwrap();
    m.files[0].path = "../etc/shadow".into();
    let err = m.verify_files(dir.path(), 1).unwrap_err().to_string();
    assert!(err.contains("outside the snapshot"), "{err}");
}

#[test]
fn symlinks_are_refused() {
    let dir = snapshot_dir();
    std::os::unix::fs::symlink("/etc/passwd", dir.path().join("link")).unwrap();
    assert!(sample().seal(dir.path(), 1).is_err());
}

#[test]
fn runtime_differences_are_named() {
    let m = sample();
    assert!(m
        .check_runtime(
            "runsc version 0.0~20221219.0",
            "ptrace",
            std::env::consts::ARCH
        )
        .is_empty());
    let got = m.check_runtime("runsc version 2026", "systrap", "riscv64");
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(got[1].contains("\"ptrace\"") && got[1].contains("\"systrap\""));
}

#[test]
fn permissions_are_root_only() {
    let dir = snapshot_dir();
    restrict_permissions(dir.path()).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(dir.path()), 0o700);
    assert_eq!(mode(&dir.path().join("sub")), 0o700);
    assert_eq!(mode(&dir.path().join("sub/pages.img")), 0o600);
}

#[test]
fn pieces_of_another_size_or_count_are_refused() {
    let digest = "ab".repeat(32);
    let ok = Pieces {
        size: PIECE_SIZE,
        sha256: vec![digest.clone(); 2],
    };
    check_pieces(&ok, PIECE_SIZE + 1).unwrap();
    // A hostile size would be allocated as given.
    let huge = Pieces {
        size: 1 << 40,
        sha256: vec![digest.clone()],
    };
    let err = check_pieces(&huge, 10).unwrap_err();
    assert!(err.contains("not the format's piece size"), "{err}");
    let short = Pieces {
        size: PIECE_SIZE,
        sha256: vec![digest.clone()],
    };
    let err = check_pieces(&short, PIECE_SIZE * 3).unwrap_err();
    assert!(err.contains("1 digests for a file of"), "{err}");
    assert!(err.contains("which has 3 pieces"), "{err}");
    let bad = Pieces {
        size: PIECE_SIZE,
        sha256: vec![digest, "zz".into()],
    };
    let err = check_pieces(&bad, PIECE_SIZE * 2).unwrap_err();
    assert!(err.contains("digest 1 is not 64 hex"), "{err}");
}
