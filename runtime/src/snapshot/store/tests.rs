use std::{collections::BTreeMap, fs, os::unix::fs::PermissionsExt, path::Path, time::Duration};

use super::{lock::lock_path, *};
use crate::snapshot::{
    manifest::{tests::sample, FILE_NAME},
    oci::{self, Descriptor},
    owner::Owner,
};

/// A sealed checkpoint in a fresh ingest of `store`: `files` as runsc would write them.
fn sealed(store: &Store, token: &str, files: &[(&str, &[u8])]) -> Ingest {
    let ingest = store.begin_ingest(token).unwrap();
    for (name, bytes) in files {
        fs::write(ingest.dir().join(name), bytes).unwrap();
    }
    let mut m = sample();
    m.seal(ingest.dir(), 1).unwrap();
    ingest
}

fn commit(store: &Store, ingest: Ingest) -> Committed {
    store
        .commit(
            ingest,
            Commit {
                namespace: "default",
                spec: br#"{"process":{}}"#,
                subject: Some(Descriptor::new(
                    oci::MANIFEST,
                    &oci::sha256_digest(b"base"),
                    4,
                )),
                annotations: BTreeMap::new(),
            },
        )
        .unwrap()
}

/// A snapshot (checkpoint.img "state", pages.img "pages") committed to a store under
/// `root/a`, and the small blobs a pull fetches before its files: the chalk manifest, the
/// spec and the empty config.
fn committed_on_a(root: &Path) -> (Store, Committed, Vec<Vec<u8>>) {
    let a = Store::open(&root.join("a")).unwrap();
    let files: &[(&str, &[u8])] = &[("checkpoint.img", b"state"), ("pages.img", b"pages")];
    let c = commit(&a, sealed(&a, "default+one", files));
    let snap = a.open_snapshot(&c.manifest.digest).unwrap();
    let small = [&snap.layout.chalk_manifest, &snap.layout.spec]
        .iter()
        .map(|d| a.read_blob(&d.digest).unwrap())
        .chain([oci::EMPTY_DATA.to_vec()])
        .collect();
    (a, c, small)
}

#[test]
fn an_imported_snapshot_needs_only_the_blobs_the_store_lacks() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, c, small) = committed_on_a(tmp.path());
    let small: Vec<&[u8]> = small.iter().map(Vec::as_slice).collect();

    // Host B already has pages.img (an earlier snapshot): only checkpoint.img is fetched.
    let b = Store::open(&tmp.path().join("b")).unwrap();
    b.put(b"pages", "").unwrap();
    let ingest = b.begin_ingest("default+pulled").unwrap();
    let state = oci::sha256_digest(b"state");
    fs::write(ingest.part_path(&state["sha256:".len()..]), b"state").unwrap();
    let origin = Origin {
        owner: Some(Owner::puller("default", Some("team-b"))),
        pulled_from: Some("reg.example/snaps/team-b/app".into()),
    };
    let (got, _) = b
        .import(ingest, "default", origin, &c.manifest_bytes, &small)
        .unwrap();
    let refs = b.refs_of(&c.manifest.digest).unwrap();
    assert_eq!(refs.len(), 1);
    assert_eq!(
        refs[0].owner.as_ref().unwrap().pod_namespace(),
        Some("team-b")
    );
    assert_eq!(
        refs[0].pulled_from.as_deref(),
        Some("reg.example/snaps/team-b/app")
    );
    assert_eq!(
        got.manifest.digest, c.manifest.digest,
        "the same id on every host"
    );
    assert_eq!((got.stored, got.reused), (5, 5));
    assert_eq!(
        b.find_ref("default+pulled").unwrap().manifest,
        c.manifest.digest
    );
    b.prepare_restore(&b.open_snapshot(&c.manifest.digest).unwrap(), "default+r")
        .unwrap();

    // A file that was never fetched: refused, and no ref is written.
    let other = commit(&a, sealed(&a, "default+two", &[("pages.img", b"other")]));
    let ingest = b.begin_ingest("default+half").unwrap();
    let err = b
        .import(
            ingest,
            "default",
            Default::default(),
            &other.manifest_bytes,
            &small,
        )
        .unwrap_err();
    assert!(err.to_string().contains("was not fetched"), "{err}");
    assert!(b.find_ref("default+half").is_none());
}

#[test]
fn a_blob_a_pull_counted_on_survives_a_gc_before_its_import() {
    let tmp = tempfile::tempdir().unwrap();
    let (_a, c, small) = committed_on_a(tmp.path());
    let small: Vec<&[u8]> = small.iter().map(Vec::as_slice).collect();
    let b = Store::open(&tmp.path().join("b")).unwrap();
    // A failed pull's pages.img, which no ref holds: the next gc collects it.
    let pages = b.put(b"pages", "").unwrap();
    let ingest = b.begin_ingest("default+again").unwrap();
    assert!(b.hold_blob(&ingest, &pages.digest));
    let absent = oci::sha256_digest(b"state");
    assert!(!b.hold_blob(&ingest, &absent), "checkpoint.img is fetched");
    fs::write(ingest.part_path(&absent["sha256:".len()..]), b"state").unwrap();
    b.gc(&[]).unwrap();
    assert!(
        !b.has_blob(&pages.digest),
        "the gc took the blob's own name"
    );
    b.import(
        ingest,
        "default",
        Default::default(),
        &c.manifest_bytes,
        &small,
    )
    .unwrap();
    assert!(
        b.has_blob(&pages.digest),
        "the import adopted the held part"
    );
}

#[test]
fn a_committed_snapshot_is_blobs_a_manifest_and_a_ref() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(&tmp.path().join("store")).unwrap();
    let token = Store::token("default", "chalk.io/snapshots/web:2026");
    assert_eq!(token, "default+chalk.io_snapshots_web_2026");
    let ingest = sealed(
        &store,
        &token,
        &[("checkpoint.img", b"state"), ("pages.img", b"pages")],
    );
    let dir = ingest.dir().to_path_buf();
    assert_eq!(
        Store::ingest_token_under(store.root(), &dir).as_deref(),
        Some(token.as_str())
    );
    let c = commit(&store, ingest);
    assert!(!dir.exists(), "the ingest directory goes once committed");
    assert_eq!(c.stored, 10);
    let pages = store.blob_path(&oci::sha256_digest(b"pages")).unwrap();
    assert_eq!(fs::read(&pages).unwrap(), b"pages");
    assert_eq!(
        fs::metadata(&pages).unwrap().permissions().mode() & 0o777,
        0o400
    );
    assert_eq!(
        fs::metadata(store.root()).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let r = store.find_ref(&token).unwrap();
    assert_eq!(r.manifest, c.manifest.digest);
    let snap = store.open_snapshot(&c.manifest.digest).unwrap();
    assert_eq!(snap.spec, br#"{"process":{}}"#);
    assert_eq!(snap.layout.files.len(), 2);
    assert_eq!(
        snap.oci.subject.unwrap().digest,
        oci::sha256_digest(b"base")
    );
    // The same files again are stored once.
    let again = sealed(
        &store,
        "default+second",
        &[("checkpoint.img", b"state"), ("pages.img", b"pages")],
    );
    let c2 = commit(&store, again);
    assert_eq!((c2.stored, c2.reused), (0, 10));
}

#[test]
fn a_restore_links_verified_blobs_and_refuses_a_changed_one() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(&tmp.path().join("store")).unwrap();
    let ingest = sealed(&store, "default+s", &[("pages.img", b"pages")]);
    let c = commit(&store, ingest);
    let snap = store.open_snapshot(&c.manifest.digest).unwrap();
    let restore = store.prepare_restore(&snap, "default+web+1").unwrap();
    let link = restore.dir().join("pages.img");
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::read(&link).unwrap(), b"pages");
    let dir = restore.dir().to_path_buf();
    drop(restore);
    assert!(!dir.exists() && !lock_path(&dir).exists());
    // Same size, other bytes: its identity changed, so it is hashed again and refused.
    let blob = store.blob_path(&oci::sha256_digest(b"pages")).unwrap();
    fs::set_permissions(&blob, fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(&blob, b"PAGES").unwrap();
    let err = store
        .prepare_restore(&snap, "default+web+2")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("changed or damaged") && err.contains("pages.img"),
        "{err}"
    );
    assert!(!store.root().join("restores/default+web+2").exists());
    // A missing blob is named.
    fs::remove_file(&blob).unwrap();
    let err = store
        .prepare_restore(&snap, "default+web+3")
        .unwrap_err()
        .to_string();
    assert!(err.contains("missing"), "{err}");
}

#[test]
fn gc_keeps_what_refs_and_restores_need_and_removes_the_rest() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(&tmp.path().join("store")).unwrap();
    let a = commit(
        &store,
        sealed(&store, "default+a", &[("pages.img", b"aaaa")]),
    );
    let b = commit(
        &store,
        sealed(&store, "default+b", &[("pages.img", b"bbbb")]),
    );
    // A crashed checkpoint: its directory and lock, held by nobody.
    fs::create_dir(store.ingest_path("default+crashed")).unwrap();
    fs::write(store.ingest_path("default+crashed").join("pages.img"), b"x").unwrap();
    fs::write(store.root().join("ingest/default+crashed.lock"), b"").unwrap();
    // Being written now (tokens have dots).
    let live = store.begin_ingest("default+chalk.io_live").unwrap();
    let _other = store.begin_ingest("default+chalk.io_other").unwrap();
    assert_eq!(store.gc(&[]).unwrap().blobs_removed, 0);
    assert!(!store.ingest_path("default+crashed").exists());
    assert!(live.dir().exists());
    // b's ref goes while a restore of b runs: b's blobs stay until the restore ends.
    let snap_b = store.open_snapshot(&b.manifest.digest).unwrap();
    let restoring = store.prepare_restore(&snap_b, "default+fork").unwrap();
    store.remove_ref("default+b").unwrap();
    let report = store.gc(&[]).unwrap();
    assert_eq!(report.blobs_removed, 2, "{report:?}"); // its manifest, its chalk manifest
    assert!(!store.blob_path(&b.manifest.digest).unwrap().exists());
    assert_eq!(
        fs::read(restoring.dir().join("pages.img")).unwrap(),
        b"bbbb"
    );
    drop(restoring);
    let report = store.gc(&[]).unwrap();
    assert_eq!(
        (report.blobs_removed, report.bytes_freed),
        (1, 4),
        "{report:?}"
    );
    assert!(store.open_snapshot(&a.manifest.digest).is_ok());
    // A root given by the caller (a suspended sandbox's snapshot) is kept without a ref.
    store.remove_ref("default+a").unwrap();
    store.gc(std::slice::from_ref(&a.manifest.digest)).unwrap();
    assert!(store.open_snapshot(&a.manifest.digest).is_ok());
    store.gc(&[]).unwrap();
    assert!(!store.blob_path(&a.manifest.digest).unwrap().exists());
    drop(live);
    store.gc(&[]).unwrap();
    assert_eq!(store.usage(), 0);
}

#[test]
fn bad_names_and_foreign_manifests_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(&tmp.path().join("store")).unwrap();
    assert!(store.begin_ingest("../x").is_err());
    assert!(store.begin_ingest(".hidden").is_err());
    assert!(store.blob_path("sha256:../../etc").is_err());
    assert!(Store::open(Path::new("relative")).is_err());
    assert!(Store::ingest_token_under(store.root(), Path::new("/elsewhere/default+x")).is_none());
    let _held = store.begin_ingest("default+same").unwrap();
    assert!(store.begin_ingest("default+same").is_err());
    // A blob that is no snapshot manifest.
    let d = store.put(b"{}", oci::EMPTY).unwrap();
    let err = store.open_snapshot(&d.digest).unwrap_err().to_string();
    assert!(
        err.contains("not a chalk snapshot") || err.contains("not an OCI"),
        "{err}"
    );
    let _ = FILE_NAME;
}

/// runsc's files in an ingest of `store`, not yet sealed.
fn written(store: &Store, token: &str, files: &[(&str, &[u8])]) -> Ingest {
    let ingest = store.begin_ingest(token).unwrap();
    for (name, bytes) in files {
        fs::write(ingest.dir().join(name), bytes).unwrap();
    }
    ingest
}

#[test]
fn a_fresh_snapshot_restores_while_it_is_sealed_and_its_links_outlive_the_seal() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path()).unwrap();
    let files: &[(&str, &[u8])] = &[("checkpoint.img", b"state"), ("pages.img", b"pages")];
    let ingest = written(&store, "default+s", files);
    let fresh = store
        .publish_fresh(ingest.dir(), "default+s", &sample())
        .unwrap();
    assert_eq!(store.seal_state("default+s"), Seal::Sealing);
    let m = store.fresh_manifest("default+s").unwrap();
    assert!(m.files.is_empty(), "an unsealed manifest lists no digests");

    let (_, linked) = store
        .prepare_fresh_restore("default+s", "default+r1")
        .unwrap()
        .expect("fresh");
    // The seal: hashed, committed (its files renamed into blobs), the fresh links removed.
    let mut sealed = sample();
    sealed.seal(ingest.dir(), 1).unwrap();
    let c = commit(&store, ingest);
    drop(fresh);
    store.record_identities(&sealed).unwrap();
    assert_eq!(
        fs::read(linked.dir().join("pages.img")).unwrap(),
        b"pages",
        "a restore's links keep its files"
    );
    assert!(!store.fresh_path("default+s").exists());
    match store.seal_state("default+s") {
        Seal::Sealed(r) => assert_eq!(r.manifest, c.manifest.digest),
        other => panic!("{other:?}"),
    }
    // Gone fresh: a later restore is told so, and goes by the ref.
    assert!(store
        .prepare_fresh_restore("default+s", "default+r2")
        .unwrap()
        .is_none());
    assert!(!store.root().join("restores/default+r2").exists());
    let r = store
        .wait_sealed("default+s", Duration::from_secs(1))
        .unwrap();
    store
        .prepare_restore(&store.open_snapshot(&r.manifest).unwrap(), "default+r3")
        .unwrap();
}

#[test]
fn a_seal_that_failed_is_told_once_and_a_lost_one_leaves_no_files() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path()).unwrap();
    let ingest = written(&store, "default+f", &[("pages.img", b"pages")]);
    let fresh = store
        .publish_fresh(ingest.dir(), "default+f", &sample())
        .unwrap();
    store.note_seal_failure("default+f", "disk full");
    drop((ingest, fresh));
    let err = store
        .wait_sealed("default+f", Duration::from_secs(1))
        .unwrap_err();
    assert!(err.to_string().contains("disk full"), "{err}");
    assert_eq!(store.seal_state("default+f"), Seal::Lost, "told once");

    // A shim that died: nobody holds the ingest or the fresh directory.
    let ingest = written(&store, "default+l", &[("pages.img", b"pages")]);
    let fresh = store
        .publish_fresh(ingest.dir(), "default+l", &sample())
        .unwrap();
    fresh.hand_over();
    drop(ingest);
    let err = store
        .wait_sealed("default+l", Duration::from_secs(1))
        .unwrap_err();
    assert!(err.to_string().contains("never sealed"), "{err}");
    assert!(
        !store.fresh_path("default+l").exists(),
        "its memory is gone"
    );
}

#[test]
fn a_handed_over_fresh_directory_is_kept_by_gc_until_it_is_old() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path()).unwrap();
    let ingest = written(&store, "default+h", &[("pages.img", b"pages")]);
    store
        .publish_fresh(ingest.dir(), "default+h", &sample())
        .unwrap()
        .hand_over();
    drop(ingest);
    store.gc(&[]).unwrap();
    assert!(
        store.fresh_path("default+h").exists(),
        "its caller forks from it"
    );
    let old = std::time::SystemTime::now() - FRESH_MAX_AGE - Duration::from_secs(1);
    fs::File::open(store.fresh_path("default+h"))
        .unwrap()
        .set_modified(old)
        .unwrap();
    store.gc(&[]).unwrap();
    assert!(
        !store.fresh_path("default+h").exists(),
        "left behind: taken"
    );
    store.remove_fresh("default+h").unwrap();
}

#[test]
fn a_pointer_names_a_snapshot_by_digest_or_by_token() {
    let tmp = tempfile::tempdir().unwrap();
    let write = |p: &[u8]| {
        fs::write(tmp.path().join(POINTER), p).unwrap();
        Pointer::read(tmp.path())
    };
    let digest = oci::sha256_digest(b"x");
    assert_eq!(
        write(&Pointer::to_snapshot(&digest).to_bytes()).unwrap(),
        Some(Pointer::to_snapshot(&digest))
    );
    assert_eq!(
        write(&Pointer::to_token("default+t").to_bytes()).unwrap(),
        Some(Pointer::to_token("default+t"))
    );
    for bad in [
        r#"{"token":"../x"}"#.to_string(),
        format!(r#"{{"snapshot":"{digest}","token":"default+t"}}"#),
        "{}".to_string(),
    ] {
        assert!(write(bad.as_bytes()).is_err(), "{bad}");
    }
}

/// A blob served while it arrives: imported without its bytes, restored through the server's
/// file, and an ordinary blob once complete; a failure's reason is kept, the bytes are not.
#[test]
fn a_lazy_blob_is_read_through_its_server_until_it_is_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, c, small) = committed_on_a(tmp.path());
    let small: Vec<&[u8]> = small.iter().map(Vec::as_slice).collect();
    let pages = &oci::sha256_digest(b"pages")["sha256:".len()..];

    let b = Store::open(&tmp.path().join("b")).unwrap();
    let lazy = b.begin_lazy(pages, 5).unwrap();
    assert!(b.begin_lazy(pages, 5).is_err(), "one server per blob");
    assert_eq!(b.lazy_file(pages), None, "not served before it says so");
    lazy.serving().unwrap();
    assert_eq!(b.lazy_file(pages), Some(lazy.mountpoint()));
    assert_eq!(fs::metadata(lazy.data()).unwrap().len(), 5);
    assert_eq!(
        fs::metadata(lazy.data()).unwrap().permissions().mode() & 0o777,
        0o600
    );

    let ingest = b.begin_ingest("default+pulled").unwrap();
    let state = oci::sha256_digest(b"state");
    fs::write(ingest.part_path(&state["sha256:".len()..]), b"state").unwrap();
    let (_, stored) = b
        .import(
            ingest,
            "default",
            Default::default(),
            &c.manifest_bytes,
            &small,
        )
        .unwrap();
    let restore = b.prepare_restore(&stored, "default+r1").unwrap();
    assert_eq!(restore.arriving(), [pages.to_string()]);
    assert_eq!(
        fs::read_link(restore.dir().join("pages.img")).unwrap(),
        lazy.mountpoint()
    );
    drop(restore);
    // gc leaves a served blob's directory alone.
    b.gc(&[]).unwrap();
    assert!(lazy.mountpoint().exists());

    fs::write(lazy.data(), b"pages").unwrap();
    lazy.complete(&b).unwrap();
    lazy.finish();
    assert!(b.has_blob(&format!("sha256:{pages}")));
    assert_eq!(b.lazy_file(pages), None);
    let restore = b.prepare_restore(&stored, "default+r2").unwrap();
    assert!(restore.arriving().is_empty());
    drop(restore);

    // A failed one: its reason stays (and survives gc), its bytes do not.
    let other = "ab".repeat(32);
    let failed = b.begin_lazy(&other, 7).unwrap();
    failed.serving().unwrap();
    failed.fail("piece 3 does not match its digest");
    assert_eq!(b.lazy_file(&other), None);
    let data = failed.data();
    failed.finish();
    assert!(!data.exists());
    b.gc(&[]).unwrap();
    assert_eq!(
        b.lazy_failure(&other).as_deref(),
        Some("piece 3 does not match its digest")
    );
    // A new server of the same blob starts clean.
    let again = b.begin_lazy(&other, 7).unwrap();
    assert_eq!(b.lazy_failure(&other), None);
    drop(again);
    // A dead server's directory goes at the next gc.
    b.gc(&[]).unwrap();
    assert!(!tmp.path().join("b/lazy").join(&other).exists());
}

/// A lazily served blob whose server failed before a restore looked (the background fetch
/// found a bad piece first): the restore, and an import, say the server's reason, not that
/// the store lost the blob.
#[test]
fn a_lazy_blob_that_failed_before_its_restore_is_reported_with_its_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, c, small) = committed_on_a(tmp.path());
    let small: Vec<&[u8]> = small.iter().map(Vec::as_slice).collect();
    let pages = &oci::sha256_digest(b"pages")["sha256:".len()..];
    let state = oci::sha256_digest(b"state");
    let b = Store::open(&tmp.path().join("b")).unwrap();
    let why = "bytes 0..5 of sha256:… from the registry do not match their digest";

    // Served when the pull imported it, failed before the shim's restore.
    // A pull's import under `token`: the state fetched, pages.img left to its server.
    let import = |token: &str| {
        let ingest = b.begin_ingest(token).unwrap();
        fs::write(ingest.part_path(&state["sha256:".len()..]), b"state").unwrap();
        b.import(
            ingest,
            "default",
            Default::default(),
            &c.manifest_bytes,
            &small,
        )
    };
    let lazy = b.begin_lazy(pages, 5).unwrap();
    lazy.serving().unwrap();
    let (_, stored) = import("default+pulled").unwrap();
    lazy.failure_note().write(why);
    let refused = |token: &str| {
        let err = b.prepare_restore(&stored, token).unwrap_err().to_string();
        assert!(
            err.contains("(pages.img) never arrived") && err.contains(why),
            "{err}"
        );
        assert!(!err.contains("delete it"), "{err}");
        assert!(!b.root().join("restores").join(token).exists());
    };
    // While the server still winds down (its lock held), and once it has ended.
    refused("default+r1");
    lazy.fail(why);
    lazy.finish();
    refused("default+r2");

    // Failed before the pull's import: the import says why, and writes no ref.
    let err = import("default+again").unwrap_err().to_string();
    assert!(err.contains("never arrived") && err.contains(why), "{err}");
    assert!(b.find_ref("default+again").is_none());

    // Without a server's reason, a blob that is not there is still the store's loss.
    fs::remove_dir_all(b.root().join("lazy")).unwrap();
    let err = b
        .prepare_restore(&stored, "default+r3")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("is missing") && err.contains("delete it"),
        "{err}"
    );
}
