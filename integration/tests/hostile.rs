//! Snapshots made by hand to do harm, from a registry this host did not take them from: a
//! spec that brings hooks (a prestart and a createRuntime hook that would write a marker on
//! the host), a device, runtime and CDI annotations, a pod member's spec with the same; a
//! manifest with a 32 GiB piece size, one declaring a 2 TB memory file, an oversized manifest,
//! and a registry that never ends a body. Each is refused or neutralised, and nothing of it is
//! left on the host: no marker, no record, no ingest, no lazy blob, no sandbox. Real
//! containerd, runsc and Distribution registries; the lies are told by a proxy of the test's
//! own in front of a real registry (`chalk_integration::hostile_registry`).

use std::time::{Duration, Instant};

use chalk_integration::{
    cases, ensure,
    hostile_registry::{HostileRegistry, Lie},
    registry::{self, Secured},
    testkit::{self, Env, Failed, TestResult},
    Containerd, CtrOutput,
};
use serde_json::Value;

struct Host {
    env: Env,
    /// Where hostile artifacts are pushed (HTTPS, credentials).
    registry: Secured,
    /// A plain-HTTP registry the lying proxy fronts, and its files.
    plain: String,
    _plain_guard: registry::Guard,
    _plain_dir: tempfile::TempDir,
    /// The source sandbox's snapshot, as pushed to `base/app` of both registries.
    base: Base,
}

/// The honest snapshot every hostile one is made from.
struct Base {
    id: String,
    manifest: Value,
}

const REPO: &str = "base/app";

impl Host {
    fn chalkctl(&self, args: &[&str]) -> CtrOutput {
        let mut cmd = self.env.c.chalkctl_command().expect("chalkctl is built");
        self.registry.client(&mut cmd).args(args);
        cmd.output().expect("run chalkctl").into()
    }

    /// chalkctl with the runtime options at `options` instead of this containerd's.
    fn chalkctl_with(&self, options: &std::path::Path, args: &[&str]) -> CtrOutput {
        let mut argv = self.env.c.chalkctl_argv().expect("chalkctl is built");
        if let Some(i) = argv.iter().position(|a| a == "--config") {
            argv[i + 1] = options.display().to_string();
        }
        let mut cmd = std::process::Command::new(&argv[0]);
        cmd.args(&argv[1..]).stdin(std::process::Stdio::null());
        self.registry.client(&mut cmd).args(args);
        cmd.output().expect("run chalkctl").into()
    }

    /// Pushes `m` (a snapshot's OCI manifest, changed) to `repo`: what a pull names.
    fn put(&self, repo: &str, m: &Value) -> Result<String, Failed> {
        let bytes = serde_json::to_vec(m).map_err(|e| e.to_string())?;
        let digest = format!(
            "sha256:{}",
            chalk_runtime::snapshot::hash::sha256_hex(&bytes)
        );
        self.registry
            .put_manifest(&format!("{repo}/manifests/{digest}"), m)?;
        Ok(format!("{}/{repo}@{digest}", self.registry.addr))
    }

    /// The base snapshot's layer of media type `media` (its index in the layers, its bytes).
    fn layer(&self, media: &str) -> Result<(usize, Vec<u8>), Failed> {
        let layers = self.base.manifest["layers"].as_array().ok_or("no layers")?;
        let i = layers
            .iter()
            .position(|l| l["mediaType"] == media)
            .ok_or_else(|| format!("no {media} layer"))?;
        let digest = layers[i]["digest"].as_str().unwrap_or_default();
        Ok((i, self.registry.get_blob(REPO, digest)?))
    }

    /// The base snapshot with layer `i` replaced by `bytes` (uploaded to `repo`, and every
    /// other blob linked there).
    fn with_layer(&self, repo: &str, i: usize, bytes: &[u8]) -> Result<Value, Failed> {
        let mut m = self.base.manifest.clone();
        let mut blobs = vec![m["config"]["digest"]
            .as_str()
            .unwrap_or_default()
            .to_string()];
        for l in m["layers"].as_array().into_iter().flatten() {
            blobs.push(l["digest"].as_str().unwrap_or_default().to_string());
        }
        for b in &blobs {
            self.registry.mount_blob(REPO, repo, b)?;
        }
        if let Some(subject) = m["subject"]["digest"].as_str() {
            // The base image: a manifest of its own, in the source repository.
            let image = self
                .registry
                .get_manifest(&format!("{REPO}/manifests/{subject}"))?;
            for d in std::iter::once(&image["config"])
                .chain(image["layers"].as_array().into_iter().flatten())
            {
                self.registry
                    .mount_blob(REPO, repo, d["digest"].as_str().unwrap_or_default())?;
            }
            self.registry
                .put_manifest(&format!("{repo}/manifests/{subject}"), &image)?;
        }
        let digest = self.registry.put_blob(repo, bytes)?;
        m["layers"][i]["digest"] = digest.into();
        m["layers"][i]["size"] = bytes.len().into();
        Ok(m)
    }

    /// The base snapshot with layer `i` replaced by `value` (JSON), pushed to `repo` and
    /// forked as `fork` by chalkctl (memory fetched whole): the snapshot's id, what chalkctl
    /// said.
    fn fork_with_layer(
        &self,
        repo: &str,
        i: usize,
        value: &Value,
        fork: &str,
    ) -> Result<(String, CtrOutput), Failed> {
        let bytes = serde_json::to_vec(value).map_err(|e| e.to_string())?;
        let reference = self.put(repo, &self.with_layer(repo, i, &bytes)?)?;
        let id = reference.rsplit('@').next().unwrap_or_default().to_string();
        let out = self.chalkctl(&[
            "fork",
            "--snapshot",
            &reference,
            "--fork-id",
            fork,
            "--whole",
        ]);
        Ok((id, out))
    }

    /// What a hostile pull may not leave: a record of `id`, a part in an ingest, a lazy blob,
    /// a restore directory.
    /// How many requests the registry logged for blob `digest`.
    fn registry_requests_for(&self, digest: &str) -> usize {
        self.registry
            .requests_since(0)
            .iter()
            .filter(|r| r.contains(&format!("/blobs/{digest}")))
            .count()
    }

    fn nothing_left(&self, id: &str) -> TestResult {
        let list = self.chalkctl(&["snapshot", "list", "-o", "json"]);
        ensure!(
            !list.stdout.contains(id),
            "a record of {id} is left: {}",
            list.stdout
        );
        let store = self.env.c.snapshot_store();
        for dir in ["ingest", "lazy", "restores"] {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let left: Vec<String> = std::fs::read_dir(store.join(dir))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| !n.ends_with(".lock"))
                    .collect();
                if left.is_empty() {
                    break;
                }
                ensure!(
                    Instant::now() < deadline,
                    "the store's {dir}/ holds {left:?} after a refused pull"
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        Ok(())
    }
}

/// A marker a hook would write on the host, and the hooks that would write it.
fn hooks(marker: &std::path::Path) -> Value {
    let hook = serde_json::json!({
        "path": "/bin/sh",
        "args": ["sh", "-c", format!("touch {}", marker.display())]
    });
    serde_json::json!({"prestart": [hook.clone()], "createRuntime": [hook.clone()],
                       "createContainer": [hook.clone()], "poststart": [hook]})
}

/// A spec's worst: hooks, a device, runtime and CDI annotations.
fn poisoned(spec: &mut Value, marker: &std::path::Path) {
    spec["hooks"] = hooks(marker);
    spec["linux"]["devices"] = serde_json::json!([{
        "path": "/dev/chalk-hostile", "type": "c", "major": 1, "minor": 3,
        "fileMode": 438, "uid": 0, "gid": 0
    }]);
    spec["linux"]["resources"]["devices"] = serde_json::json!([{"allow": true, "access": "rwm"}]);
    let a = spec["annotations"].as_object_mut().map(|_| ());
    if a.is_none() {
        spec["annotations"] = serde_json::json!({});
    }
    spec["annotations"]["dev.gvisor.flag.debug-log"] =
        format!("{}-debug/", marker.display()).into();
    spec["annotations"]["cdi.k8s.io/hostile"] = "vendor.example/dev=all".into();
}

/// A spec with hooks, a device, a CDI and a runsc annotation: the fork runs without any of
/// them (chalkctl rebuilt its spec), no hook ran on the host, and the fork is removed whole.
fn a_foreign_spec_brings_no_hook_device_or_annotation(h: &Host) -> TestResult {
    let marker = h.env.c.dir().join("hostile-spec-marker");
    let (i, spec) = h.layer(chalk_runtime::snapshot::oci::SPEC)?;
    let mut spec: Value = serde_json::from_slice(&spec).map_err(|e| e.to_string())?;
    poisoned(&mut spec, &marker);
    let fork = "hostile-spec-fork";
    let (id, out) = h.fork_with_layer("hostile/spec", i, &spec, fork)?;
    ensure!(out.code == 0, "the fork of a rebuilt spec: {out:?}");
    ensure!(
        out.stderr.contains("rebuilt without") && out.stderr.contains("hooks"),
        "chalkctl did not say what it left out: {out:?}"
    );
    let config = std::fs::read_to_string(h.env.bundle(fork).join("config.json"))
        .map_err(|e| e.to_string())?;
    let ran: Value = serde_json::from_str(&config).map_err(|e| e.to_string())?;
    ensure!(ran.get("hooks").is_none(), "hooks reached runsc: {config}");
    ensure!(
        ran["linux"]["devices"]
            .as_array()
            .is_none_or(|d| d.is_empty()),
        "a device reached runsc: {config}"
    );
    ensure!(
        !config.contains("dev.gvisor.flag") && !config.contains("cdi.k8s.io"),
        "runtime or CDI annotations reached runsc: {config}"
    );
    ensure!(h.env.count(fork)? > 0, "the fork does not run");
    ensure!(!marker.exists(), "a hook of the snapshot ran on the host");
    let rm = h.chalkctl(&["rm", "--force", "--id", fork]);
    ensure!(rm.code == 0, "rm: {rm:?}");
    h.env.assert_clean(fork)?;
    h.chalkctl(&["snapshot", "delete", "--snapshot-id", &id]);
    ensure!(!marker.exists(), "a hook of the snapshot ran on the host");
    h.nothing_left(&id)
}

/// The same worst in a pod member's spec (in the chalk manifest's `extra.pod`), of a
/// sandbox that is no pod: refused, nothing made, and the member's hooks never run. (A pod's
/// members' specs from elsewhere are rebuilt as the sandbox's is: see chalk-client's unit
/// tests; a pod's fork from elsewhere is refused for its bind mounts in any case.)
fn a_foreign_pod_members_spec_brings_nothing_either(h: &Host) -> TestResult {
    let marker = h.env.c.dir().join("hostile-member-marker");
    let (i, chalk) = h.layer(chalk_runtime::snapshot::oci::CHALK_MANIFEST)?;
    let mut chalk: Value = serde_json::from_slice(&chalk).map_err(|e| e.to_string())?;
    let (_, spec) = h.layer(chalk_runtime::snapshot::oci::SPEC)?;
    let mut member: Value = serde_json::from_slice(&spec).map_err(|e| e.to_string())?;
    poisoned(&mut member, &marker);
    chalk["extra"]["pod"] = serde_json::json!({"containers": [{
        "id": "hostile-member", "name": "member",
        "image": chalk_integration::containerd::IMAGE, "spec": member
    }]});
    let fork = "hostile-member-fork";
    let (id, out) = h.fork_with_layer("hostile/member", i, &chalk, fork)?;
    ensure!(
        out.code != 0 && out.stderr.contains("its sandbox is no pod's"),
        "a non-pod snapshot listing a member: {out:?}"
    );
    for made in [fork, "member-hostile-member-fork"] {
        h.env.assert_clean(made)?;
    }
    h.chalkctl(&["snapshot", "delete", "--snapshot-id", &id]);
    ensure!(
        !marker.exists(),
        "a hook of the member's spec ran on the host"
    );
    h.nothing_left(&id)
}

/// The chalk manifest with `edit` applied to its memory file's entry (and `layer`, a size
/// and digest, if given, on the layer too, as a consistent liar would): pulled, it is refused
/// with `why`, nothing fetched or sized.
fn refused_manifest(
    h: &Host,
    repo: &str,
    edit: impl Fn(&mut Value),
    layer: Option<(u64, &str)>,
    why: &str,
) -> TestResult {
    let (i, chalk) = h.layer(chalk_runtime::snapshot::oci::CHALK_MANIFEST)?;
    let mut chalk: Value = serde_json::from_slice(&chalk).map_err(|e| e.to_string())?;
    let files = chalk["files"].as_array_mut().ok_or("no files")?;
    // The memory file: runsc's pages.img, or its one checkpoint.img (the 2022 build).
    let memory = files
        .iter_mut()
        .max_by_key(|f| f["size"].as_u64().unwrap_or(0))
        .ok_or("no files")?;
    let title = memory["path"].as_str().unwrap_or_default().to_string();
    edit(memory);
    let mut m = h.with_layer(
        repo,
        i,
        &serde_json::to_vec(&chalk).map_err(|e| e.to_string())?,
    )?;
    if let Some((size, digest)) = layer {
        for l in m["layers"].as_array_mut().into_iter().flatten() {
            if l["annotations"][chalk_runtime::snapshot::oci::TITLE] == title.as_str() {
                l["size"] = size.into();
                l["digest"] = digest.into();
            }
        }
    }
    let reference = h.put(repo, &m)?;
    let id = reference.rsplit('@').next().unwrap_or_default().to_string();
    let started = Instant::now();
    let out = h.chalkctl(&["snapshot", "pull", "--lazy", &reference]);
    ensure!(
        out.code != 0 && out.stderr.contains(why),
        "{repo}: expected a refusal saying {why:?}: {out:?}"
    );
    testkit::note(format!("{repo}: refused in {:?}", started.elapsed()));
    h.nothing_left(&id)
}

/// A piece size of 32 GiB (the format's is 1 MiB), and a memory file of 2 TB (consistent in
/// both manifests): refused before anything is fetched or a file is sized.
fn hostile_sizes_are_refused_before_anything_is_allocated(h: &Host) -> TestResult {
    refused_manifest(
        h,
        "hostile/pieces",
        |f| {
            let size = f["size"].as_u64().unwrap_or(0);
            f["pieces"] = serde_json::json!({
                "size": 32u64 << 30,
                "sha256": vec!["0".repeat(64); size.div_ceil(32 << 30).max(1) as usize]
            });
        },
        None,
        "is not the format's piece size",
    )?;
    // A memory file the store lacks (so that nothing of it is "already here"): a blob the
    // registry has, or it would not take the manifest (its base image's config).
    let tb = 2u64 << 40;
    let subject = h.base.manifest["subject"]["digest"]
        .as_str()
        .ok_or("no subject")?;
    let image = h
        .registry
        .get_manifest(&format!("{REPO}/manifests/{subject}"))?;
    let config = image["config"]["digest"].as_str().ok_or("no config")?;
    let hex = config.trim_start_matches("sha256:").to_string();
    refused_manifest(
        h,
        "hostile/huge",
        |f| {
            f["size"] = tb.into();
            f["sha256"] = hex.clone().into();
            if let Some(o) = f.as_object_mut() {
                o.remove("pieces");
            }
        },
        Some((tb, &format!("sha256:{hex}"))),
        "max_pull_bytes",
    )
}

/// A snapshot in the packed form whose memory index lies: a piece stored past the end of its
/// pack, then an index for a memory file twice the manifest's. Refused naming the index,
/// before any memory is fetched, with nothing left.
fn a_forged_memory_index_is_refused(h: &Host) -> TestResult {
    use chalk_runtime::snapshot::{memory, oci, packed};
    let repo = "hostile/index";
    // Every blob of the base linked into `repo` (its chalk manifest put back as it was).
    let (i, chalk) = h.layer(oci::CHALK_MANIFEST)?;
    let m = h.with_layer(repo, i, &chalk)?;
    let plain = serde_json::to_vec(&m).map_err(|e| e.to_string())?;
    let plain_digest = h.registry.put_blob(repo, &plain)?;
    let pack = b"not a pack";
    let pack_digest = h.registry.put_blob(repo, pack)?;
    let layers = m["layers"].as_array().ok_or("no layers")?;
    let memory = layers
        .iter()
        .find(|l| l["annotations"][oci::TITLE] == "pages.img")
        .ok_or("the base has no pages.img")?;
    let size = memory["size"].as_u64().unwrap_or(0);
    let descriptor = |media: &str, digest: &str, size: u64| serde_json::json!({"mediaType": media, "digest": digest, "size": size});
    for (name, index_size, stored, why) in [
        ("past-its-pack", size, 100, "which has 10 bytes"),
        ("twice-the-file", size * 2, 10, "the memory file has"),
    ] {
        let index = serde_json::json!({
            "size": index_size, "depth": 0, "packs": [pack_digest],
            "pieces": [["ab".repeat(32), 4096, 0, 0, stored]],
            "extents": [[0, 4096, 0, 0]],
        });
        let bytes = serde_json::to_vec(&index).map_err(|e| e.to_string())?;
        let index_digest = h.registry.put_blob(repo, &bytes)?;
        let mut sent = vec![descriptor(oci::MANIFEST, &plain_digest, plain.len() as u64)];
        sent.extend(
            layers
                .iter()
                .filter(|l| l["annotations"][oci::TITLE] != "pages.img")
                .cloned(),
        );
        sent.push(descriptor(
            memory::index::MEDIA_TYPE,
            &index_digest,
            bytes.len() as u64,
        ));
        sent.push(descriptor(
            memory::pack::MEDIA_TYPE,
            &pack_digest,
            pack.len() as u64,
        ));
        let forged = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": oci::MANIFEST,
            "artifactType": packed::ARTIFACT,
            "config": m["config"],
            "layers": sent,
            "subject": m["subject"],
        });
        let reference = h.put(repo, &forged)?;
        let out = h.chalkctl(&["snapshot", "pull", "--lazy", &reference]);
        ensure!(
            out.code != 0 && out.stderr.contains("its memory index") && out.stderr.contains(why),
            "{name}: expected a refusal of the index saying {why:?}: {out:?}"
        );
        ensure!(
            h.registry_requests_for(&pack_digest) == 0,
            "{name}: the pack was fetched"
        );
        h.nothing_left(&plain_digest)?;
    }
    Ok(())
}

/// A registry whose manifest answer never stops: cut off at the cap, nothing kept.
fn an_oversized_manifest_is_cut_off(h: &Host) -> TestResult {
    let liar =
        HostileRegistry::start(&h.plain, Lie::HugeManifest(64 << 20)).map_err(|e| e.to_string())?;
    let reference = format!("{}/{REPO}@{}", liar.addr, h.base.id);
    let started = Instant::now();
    let out = h.chalkctl(&["snapshot", "pull", "--plain-http", &reference]);
    ensure!(
        out.code != 0 && out.stderr.contains("bytes a manifest may have"),
        "an endless manifest: {out:?}"
    );
    testkit::note(format!(
        "oversized manifest refused in {:?}",
        started.elapsed()
    ));
    Ok(())
}

/// A registry that sends the memory file's headers and then a byte every two seconds: the
/// pull is cut off at its time limit (a pod's pull_secs; here --timeout) with why, and
/// leaves nothing.
fn a_registry_that_never_ends_a_body_is_cut_off(h: &Host) -> TestResult {
    // The memory file (pages.img, or the 2022 build's one checkpoint.img): the largest.
    let pages = h.base.manifest["layers"]
        .as_array()
        .into_iter()
        .flatten()
        .max_by_key(|l| l["size"].as_u64().unwrap_or(0))
        .and_then(|l| l["digest"].as_str())
        .ok_or("no layers")?
        .to_string();
    let liar = HostileRegistry::start(&h.plain, Lie::TrickleBlobs(vec![pages]))
        .map_err(|e| e.to_string())?;
    let reference = format!("{}/{REPO}@{}", liar.addr, h.base.id);
    // Every snapshot of the host goes first, so that the pull has to fetch.
    let list = h
        .env
        .chalkctl_json(&["snapshot", "list", "--limit", "1000"])?;
    for s in list["items"].as_array().into_iter().flatten() {
        let id = s["name"].as_str().unwrap_or_default();
        let del = h.chalkctl(&["snapshot", "delete", "--snapshot-id", id]);
        ensure!(del.code == 0, "delete {id}: {del:?}");
    }
    let started = Instant::now();
    let out = h.chalkctl(&[
        "snapshot",
        "pull",
        "--plain-http",
        "--timeout",
        "12",
        &reference,
    ]);
    let took = started.elapsed();
    ensure!(
        out.code != 0 && out.stderr.contains("did not finish within"),
        "a body that never ends: {out:?}"
    );
    ensure!(took < Duration::from_secs(40), "the pull took {took:?}");
    testkit::note(format!("endless body cut off in {took:?}"));
    h.nothing_left(&h.base.id)
}

/// A node that starts pods from snapshots and says nothing in `[trust]` refuses every
/// registry snapshot, and says how to allow one.
fn a_node_that_restores_pods_trusts_nothing_by_default(h: &Host) -> TestResult {
    let options = h.env.options_with(
        "restores-pods.toml",
        "[restore_from]\nenabled = true\nnamespaces = [\"team\"]\n",
    )?;
    let reference = format!("{}/{REPO}@{}", h.registry.addr, h.base.id);
    let out = h.chalkctl_with(&options, &["snapshot", "pull", &reference]);
    ensure!(
        out.code != 0
            && out.stderr.contains("refused by the trust policy")
            && out.stderr.contains("[[trust.rules]]"),
        "a node with restore-from and no [trust]: {out:?}"
    );
    Ok(())
}

fn main() {
    testkit::check_args();
    let Some(bin) = std::env::var_os("CHALK_REGISTRY").filter(|v| !v.is_empty()) else {
        eprintln!("hostile: CHALK_REGISTRY is not set (scripts/peers builds the registry)");
        return;
    };
    let bin = std::path::PathBuf::from(bin);
    let registry = Secured::start(&bin, None, &[]).unwrap_or_else(|e| panic!("registry: {e}"));
    let plain_dir = tempfile::tempdir().expect("a directory");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a port")
        .port();
    let plain = format!("127.0.0.1:{port}");
    let plain_guard = registry::serve_plain(&bin, plain_dir.path(), &plain)
        .unwrap_or_else(|e| panic!("plain registry: {e}"));
    let c = Containerd::start().unwrap_or_else(|e| panic!("containerd: {e}"));
    c.import_busybox()
        .unwrap_or_else(|e| panic!("busybox: {e}"));
    // The cases forge the snapshot's own form (one blob per file, memory whole), which pulls
    // still take: the base is pushed in it, with options of its own. (A forged memory index
    // is refused by rules unit tested in `runtime/src/snapshot/memory/index.rs`.)
    let mut opts = chalk_runtime::options::RuntimeOptions::load(&c.options_path())
        .unwrap_or_else(|e| panic!("options: {e}"));
    opts.snapshot.push_pieces = false;
    let whole = c.dir().join("push-whole.toml");
    std::fs::write(
        &whole,
        toml::to_string(&opts).unwrap_or_else(|e| panic!("options: {e}")),
    )
    .unwrap_or_else(|e| panic!("options: {e}"));
    let env = Env { c };
    let source = "hostile-source";
    env.start_counter(source)
        .unwrap_or_else(|e| panic!("source: {e:?}"));
    let id = env
        .snapshot_of(source)
        .unwrap_or_else(|e| panic!("snapshot: {e:?}"));
    let push = |to: &str, extra: &[&str]| {
        let mut argv = env.c.chalkctl_argv().expect("chalkctl is built");
        let at = argv.iter().position(|a| a == "--config").expect("--config") + 1;
        argv[at] = whole.display().to_string();
        let mut cmd = std::process::Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        registry.client(&mut cmd);
        let mut args = vec!["snapshot", "push", "--snapshot-id", id.as_str(), to];
        args.extend_from_slice(extra);
        let out: CtrOutput = cmd.args(&args).output().expect("chalkctl").into();
        assert!(out.code == 0, "push to {to}: {out:?}");
    };
    push(&format!("{}/{REPO}:v1", registry.addr), &[]);
    push(&format!("{plain}/{REPO}:v1"), &["--plain-http"]);
    let manifest = registry
        .get_manifest(&format!("{REPO}/manifests/{id}"))
        .unwrap_or_else(|e| panic!("manifest: {e}"));
    env.remove(source);
    let host = Host {
        env,
        registry,
        plain,
        _plain_guard: plain_guard,
        _plain_dir: plain_dir,
        base: Base { id, manifest },
    };
    let all = cases![
        a_foreign_spec_brings_no_hook_device_or_annotation,
        a_foreign_pod_members_spec_brings_nothing_either,
        hostile_sizes_are_refused_before_anything_is_allocated,
        an_oversized_manifest_is_cut_off,
        a_node_that_restores_pods_trusts_nothing_by_default,
        a_registry_that_never_ends_a_body_is_cut_off,
    ];
    // Debian's runsc has no pages.img: its snapshots are never packed.
    let mut all = all;
    all.extend(
        cases![a_forged_memory_index_is_refused]
            .into_iter()
            .map(|c| c.ignored_if(!testkit::current_runsc())),
    );
    testkit::run(host, all, |_| Ok(()))
}
