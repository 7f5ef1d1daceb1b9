//! Bad input, generated: every parser of what comes from outside (a snapshot's manifest and
//! OCI manifest, runtime options, `chalk.io/*` annotations, ids, image references) answers
//! anything with a value or an error that names what is wrong, never a panic; and the
//! malicious manifests a registry could serve are refused before runsc sees them.

use std::path::Path;

use proptest::prelude::*;
use serde_json::{json, Value};

use crate::{
    ids,
    lifetime::{Lifetime, LIFETIME_ANNOTATION, ON_TIMEOUT_ANNOTATION},
    options::RuntimeOptions,
    snapshot::{
        manifest::{self, FileEntry, ImageRef, Manifest, MAX_FILES, MAX_MANIFEST_BYTES},
        oci::ImageManifest,
    },
};

/// Any JSON value, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        ".{0,40}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            prop::collection::btree_map("[a-z_]{1,12}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn sample_json() -> Value {
    let mut m = manifest::tests::sample();
    m.files = vec![FileEntry {
        path: "checkpoint.img".into(),
        size: 3,
        sha256: "a".repeat(64),
        chunks: Vec::new(),
        pieces: None,
    }];
    let mut v = serde_json::to_value(m).unwrap();
    // Fields left out when empty, present so that they can be changed.
    v["memory_bytes"] = json!(4096);
    v["terminal"] = Value::Null;
    v
}

/// The places a field of a manifest can be, as JSON pointers and the name an error gives.
const FIELDS: &[(&str, &str)] = &[
    ("/kind", "kind"),
    ("/created", "created"),
    ("/source", "source"),
    ("/source/container_id", "source.container_id"),
    ("/runsc", "runsc"),
    ("/runsc/version", "runsc.version"),
    ("/runsc/flags", "runsc.flags"),
    ("/host", "host"),
    ("/host/arch", "host.arch"),
    ("/image", "image"),
    ("/spec", "spec"),
    ("/spec/sha256", "spec.sha256"),
    ("/excluded_mounts", "excluded_mounts"),
    ("/files", "files"),
    ("/files/0", "files[0]"),
    ("/files/0/path", "files[0].path"),
    ("/files/0/size", "files[0].size"),
    ("/files/0/sha256", "files[0].sha256"),
    ("/memory_bytes", "memory_bytes"),
    ("/terminal", "terminal"),
];

fn refused_naming(result: crate::Result<Manifest>, name: &str) -> Result<(), TestCaseError> {
    if let Err(e) = result {
        let text = e.to_string();
        prop_assert!(
            text.contains(name),
            "the error does not name {name}: {text}"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn manifest_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
        let _ = Manifest::parse(&bytes, Path::new("/snap"));
        let _ = ImageManifest::parse(&bytes).map(|m| m.layout());
    }

    #[test]
    fn any_json_is_a_manifest_or_an_error(v in any_json()) {
        let bytes = serde_json::to_vec(&v).unwrap();
        let _ = Manifest::parse(&bytes, Path::new("/snap"));
        let _ = ImageManifest::parse(&bytes).map(|m| m.layout());
    }

    #[test]
    fn a_changed_field_is_named(field in 0..FIELDS.len(), value in any_json()) {
        let (pointer, name) = FIELDS[field];
        let mut v = sample_json();
        *v.pointer_mut(pointer).unwrap() = value;
        let bytes = serde_json::to_vec(&v).unwrap();
        refused_naming(Manifest::parse(&bytes, Path::new("/snap")), name)?;
    }

    #[test]
    fn a_file_name_outside_the_snapshot_is_refused(name in "(\\.\\./|/|[a-z]{1,8}/\\.\\./\\.\\./)[a-z./]{0,20}") {
        let mut v = sample_json();
        v["files"][0]["path"] = name.clone().into();
        let err = Manifest::parse(&serde_json::to_vec(&v).unwrap(), Path::new("/snap"));
        prop_assert!(err.is_err(), "{name:?} was accepted");
        refused_naming(err, "files[0].path")?;
    }

    #[test]
    fn ids_are_checked_without_panic(value in ".{0,100}") {
        match ids::container_id(&value) {
            Ok(()) => {
                prop_assert!(!value.is_empty() && value.len() <= 76);
                prop_assert!(value.chars().all(|c| c.is_ascii_alphanumeric() || ".-_".contains(c)));
                prop_assert!(value.chars().next().unwrap().is_ascii_alphanumeric());
                prop_assert!(value.chars().last().unwrap().is_ascii_alphanumeric());
            }
            Err(e) => {
                let text = e.to_string();
                prop_assert!(text.contains("container id"), "{text}");
            }
        }
    }

    #[test]
    fn image_references_split_without_panic(name in ".{0,60}", digest in ".{0,80}") {
        let reference = format!("{name}@{digest}");
        if let Some((n, d)) = ImageRef::pinned(&reference) {
            prop_assert_eq!(format!("{n}@{d}"), reference.clone());
            prop_assert!(d.starts_with("sha256:") && d.len() == 71);
        }
        let _ = ImageRef::unpinned(&reference);
        let _ = ImageRef::pinned(&name);
    }

    #[test]
    fn lifetime_annotations_are_named_when_wrong(lifetime in ".{0,24}", on_timeout in ".{0,12}") {
        let spec = json!({"annotations": {LIFETIME_ANNOTATION: lifetime, ON_TIMEOUT_ANNOTATION: on_timeout}});
        if let Err(e) = Lifetime::of_spec(&spec) {
            prop_assert!(e.contains("chalk.io/"), "{e}");
        }
        let typed = json!({"annotations": {LIFETIME_ANNOTATION: 5}});
        let _ = Lifetime::of_spec(&typed);
    }

    #[test]
    fn options_text_never_panics(text in ".{0,200}") {
        let _ = RuntimeOptions::parse(&text, "chalk.toml");
    }

    #[test]
    fn a_wrong_option_is_named(key in prop::sample::select(vec![
        "binary_name", "root", "log_level", "allow_annotation_hooks", "no_such_key",
    ]), value in prop_oneof![
        Just("3".to_string()), Just("true".to_string()), Just("\"relative/dir\"".to_string()),
        Just("[1, 2]".to_string()), Just("\"\"".to_string()), Just("\"verbose\"".to_string()),
    ]) {
        let text = format!("{key} = {value}\n");
        if let Err(e) = RuntimeOptions::parse(&text, "chalk.toml") {
            let msg = e.to_string();
            prop_assert!(msg.contains(key) && msg.contains("chalk.toml"), "{msg}");
        }
    }
}

fn parse(v: &Value) -> String {
    Manifest::parse(&serde_json::to_vec(v).unwrap(), Path::new("/snap"))
        .map(|_| "accepted".to_string())
        .unwrap_or_else(|e| e.to_string())
}

#[test]
fn malicious_manifests_are_refused_by_name() {
    // Too many files.
    let mut v = sample_json();
    let file = v["files"][0].clone();
    v["files"] = Value::from(vec![file; MAX_FILES + 1]);
    assert!(
        parse(&v).contains(&format!("more than the {MAX_FILES}")),
        "{}",
        parse(&v)
    );
    // A name twice, an absolute name, a name too long, a digest that is not one.
    let mut v = sample_json();
    let file = v["files"][0].clone();
    v["files"] = Value::from(vec![file.clone(), file]);
    assert!(parse(&v).contains("listed twice"), "{}", parse(&v));
    let mut v = sample_json();
    v["files"][0]["path"] = "/etc/shadow".into();
    assert!(parse(&v).contains("files[0].path"), "{}", parse(&v));
    v["files"][0]["path"] = "a".repeat(300).into();
    assert!(parse(&v).contains("more than 255"), "{}", parse(&v));
    let mut v = sample_json();
    v["files"][0]["sha256"] = "../../x".into();
    assert!(parse(&v).contains("files[0].sha256"), "{}", parse(&v));
    // Huge numbers where counts go: a type error that names the field.
    let mut v = sample_json();
    v["files"][0]["size"] = json!(-1);
    assert!(parse(&v).contains("files[0].size"), "{}", parse(&v));
    // Too big to read, and nested too deep to parse: refused, no stack overflow.
    let big = vec![b' '; MAX_MANIFEST_BYTES + 1];
    let err = Manifest::parse(&big, Path::new("/snap"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("more than the"), "{err}");
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let err = Manifest::parse(deep.as_bytes(), Path::new("/snap"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("not valid JSON"), "{err}");
    assert!(ImageManifest::parse(deep.as_bytes()).is_err());
    assert_eq!(parse(&sample_json()), "accepted");
}

#[test]
fn an_oci_manifest_naming_a_file_twice_or_too_many_is_refused() {
    use crate::snapshot::oci::{self, Descriptor};
    let layer = |title: &str| {
        let mut d = Descriptor::new("application/vnd.chalk.file", &oci::sha256_digest(b"x"), 1);
        d.annotations
            .insert("org.opencontainers.image.title".into(), title.into());
        serde_json::to_value(d).unwrap()
    };
    let mut m = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": "application/vnd.chalk.snapshot.v1",
        "config": serde_json::to_value(Descriptor::empty()).unwrap(),
        "layers": [layer("a.img"), layer("a.img")],
    });
    let parsed = ImageManifest::parse(&serde_json::to_vec(&m).unwrap()).unwrap();
    assert!(parsed
        .layout()
        .unwrap_err()
        .contains("two layers name file \"a.img\""));
    m["layers"] = Value::from(vec![layer("a.img"); MAX_FILES + 3]);
    let err = ImageManifest::parse(&serde_json::to_vec(&m).unwrap()).unwrap_err();
    assert!(err.contains("layers, more than"), "{err}");
}
