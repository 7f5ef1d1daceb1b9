//! The snapshot store: a chalkctl snapshot is one blob per file runsc wrote and an OCI
//! manifest, nothing of it copied into containerd's content store; forks and resumes read the
//! blobs in place (lazily where runsc can), and `snapshot delete` and `snapshot gc` free the
//! disk.

use std::os::unix::fs::PermissionsExt;

use chalk_integration::{
    bench::runsc_alone::size_of,
    testkit::{current_runsc, shares_pages},
};

use super::*;

const ARTIFACT: &str = "application/vnd.chalk.snapshot.v1";

fn store(e: &Env) -> PathBuf {
    e.c.snapshot_store()
}

fn content_store(e: &Env) -> PathBuf {
    e.c.content_blobs()
}

/// Snapshot, fork, suspend and resume through the store, and the disk it takes and frees.
pub fn snapshots_are_blobs_restored_in_place(e: &Env) -> TestResult {
    let (src, forks) = ("st-src", ["st-fork-1", "st-fork-2"]);
    let mut taken = Vec::new();
    let result = (|| {
        let fill =
            format!("dd if=/dev/urandom of=/tmp/fill bs=1048576 count=8 iflag=fullblock 2>/dev/null; {COUNTER}");
        e.run_detached(src, &["sh", "-c", &fill])?;
        e.count_reaches(src, 3)?;
        let content_before = size_of(&content_store(e));
        let digest = e.snapshot_of(src)?;
        taken.push(digest.clone());
        let content_added = size_of(&content_store(e)).saturating_sub(content_before);

        // The snapshot: an OCI 1.1 artifact whose subject is the base image, one 0400 blob per
        // file runsc wrote, in a root-only store; nothing of its memory in the content store.
        let (stored, m) = e.stored_snapshot(&digest)?;
        ensure!(
            m["artifactType"] == ARTIFACT
                && m["config"]["mediaType"] == "application/vnd.oci.empty.v1+json",
            "manifest: {m}"
        );
        let got = e.chalkctl_json(&["snapshot", "get", "--snapshot-id", &digest])?;
        let base = got["base_image"].as_str().unwrap_or_default();
        ensure!(
            base.ends_with(m["subject"]["digest"].as_str().unwrap_or("?")),
            "subject {} is not the base image {base}",
            m["subject"]
        );
        let mut files = Vec::new();
        let mut file_bytes = 0;
        for l in m["layers"].as_array().into_iter().flatten() {
            let title = l["annotations"]["org.opencontainers.image.title"]
                .as_str()
                .unwrap_or_default();
            let blob = store(e)
                .join("blobs/sha256")
                .join(&l["digest"].as_str().unwrap_or("sha256:?")[7..]);
            let meta = std::fs::metadata(&blob).map_err(|e| format!("{}: {e}", blob.display()))?;
            ensure!(
                meta.len() == l["size"].as_u64().unwrap_or(0)
                    && meta.permissions().mode() & 0o777 == 0o400,
                "blob of {title}: {meta:?}"
            );
            if title.ends_with(".img") {
                files.push(title.to_string());
                file_bytes += meta.len();
            }
        }
        ensure!(
            files.contains(&"checkpoint.img".to_string()),
            "files: {files:?}"
        );
        if current_runsc() {
            ensure!(
                files.contains(&"pages.img".to_string())
                    && files.contains(&"pages_meta.img".to_string()),
                "runsc's three files are three blobs: {files:?}"
            );
        }
        ensure!(
            file_bytes > 6 << 20,
            "the checkpoint holds {file_bytes} bytes"
        );
        ensure!(
            content_added < 256 << 10,
            "the snapshot added {content_added} bytes to containerd's content store"
        );
        let mode = std::fs::metadata(store(e))
            .map_err(|e| e.to_string())?
            .permissions()
            .mode();
        ensure!(mode & 0o777 == 0o700, "store mode {mode:o}");

        // Two forks read the same blobs in place; no link directory outlives their loading,
        // but where runsc shares pages: there each fork maps its snapshot's memory, and holds
        // its links (so gc keeps the blobs) for as long as it runs.
        let out = e.chalkctl_json(&[
            "fork",
            "--snapshot-id",
            &digest,
            "--fork-id",
            "st-fork",
            "--count",
            "2",
        ])?;
        ensure!(
            out["forks"].as_array().map_or(0, Vec::len) == 2,
            "fork: {out}"
        );
        for f in forks {
            let n = e.count(f)?;
            e.count_reaches(f, n + 2)?;
        }
        let shared = shares_pages();
        let links = || {
            std::fs::read_dir(store(e).join("restores")).map_or(0, |d| {
                d.flatten()
                    .filter(|e| !e.file_name().to_string_lossy().ends_with(".lock"))
                    .count()
            })
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while links() != if shared { forks.len() } else { 0 }
            || (!shared && size_of(&store(e).join("restores")) > 0)
        {
            ensure!(
                Instant::now() < deadline,
                "restore links left: {:?}",
                std::fs::read_dir(store(e).join("restores"))
                    .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // Shims' logs reach containerd's a little after the fact (seconds, on a loaded host).
        let deadline = Instant::now() + Duration::from_secs(30);
        let (log, restores) = loop {
            let log = e.c.log();
            let restores: Vec<String> = log
                .lines()
                .filter(|l| l.contains("chalk-timing op=restore id=st-fork-"))
                .map(String::from)
                .collect();
            if restores.len() >= 2 || Instant::now() > deadline {
                break (log, restores);
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        ensure!(restores.len() == 2, "restore timings: {restores:?}");
        let lazy = restores.iter().all(|l| l.contains("lazy=true"));
        ensure!(
            lazy == current_runsc(),
            "lazy restore where runsc has --background only: {restores:?}"
        );
        ensure!(
            log.contains("restored in place from the store"),
            "the forks did not restore from the store"
        );

        // Suspend and resume go through the store too; gc leaves a suspended sandbox's blobs.
        let out = e.chalkctl_json(&["suspend", "--id", forks[0]])?;
        let suspended = out["snapshot"]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        taken.push(suspended.clone());
        let (susp_manifest, _) = e.stored_snapshot(&suspended)?;
        let gc = e.chalkctl_json(&["snapshot", "gc"])?;
        ensure!(gc["blobs_removed"] == 0, "gc with nothing to remove: {gc}");
        let out = e.chalkctl_json(&["resume", "--id", forks[0]])?;
        ensure!(out["status"] == "running", "resume: {out}");
        let n = e.count(forks[0])?;
        e.count_reaches(forks[0], n + 2)?;

        // A crashed checkpoint's leftovers and a deleted snapshot's blobs go; the forks and the
        // source run on.
        let crashed = store(e).join("ingest").join("chalk-test+crashed");
        std::fs::create_dir_all(&crashed).map_err(|e| e.to_string())?;
        std::fs::write(crashed.join("pages.img"), vec![7u8; 1 << 20]).map_err(|e| e.to_string())?;
        let before = size_of(&store(e).join("blobs"));
        // What a fork still maps stays until it ends.
        let held: u64 = if shared {
            std::fs::read_dir(store(e).join("restores"))
                .map_err(|e| e.to_string())?
                .flatten()
                .filter(|d| d.path().is_dir())
                .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
                .filter_map(|l| std::fs::metadata(l.path()).ok())
                .map(|m| m.len())
                .sum()
        } else {
            0
        };
        let out = e.chalkctl_json(&["snapshot", "delete", "--snapshot-id", &digest])?;
        taken.retain(|t| t != &digest);
        let freed = out["freed_bytes"].as_u64().unwrap_or(0);
        ensure!(
            freed + held >= file_bytes,
            "delete freed {freed} of {file_bytes} bytes ({held} held by forks that map them): {out}"
        );
        ensure!(
            before - size_of(&store(e).join("blobs")) == freed,
            "the store shrank by {} bytes, delete says {freed}",
            before - size_of(&store(e).join("blobs"))
        );
        ensure!(
            !store(e).join("blobs/sha256").join(&stored[7..]).exists(),
            "manifest kept"
        );
        ensure!(
            !crashed.exists(),
            "the crashed checkpoint's directory was kept"
        );
        ensure!(
            store(e)
                .join("blobs/sha256")
                .join(&susp_manifest[7..])
                .exists(),
            "the suspend snapshot went with another's delete"
        );
        for id in [src, forks[0], forks[1]] {
            let n = e.count(id)?;
            e.count_reaches(id, n + 1)?;
        }
        Ok(())
    })();
    e.conclude(result, &[src, forks[0], forks[1]], &taken)
}
