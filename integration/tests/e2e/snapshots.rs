//! Snapshot, fork, suspend/resume and the manifest's refusals, through containerd's checkpoint
//! API with real containerd and runsc.

use std::{os::unix::fs::PermissionsExt, path::Path};

use chalk_integration::api::Descriptor;

use super::*;
use chalk_integration::testkit::SmallFs;

fn snapshot_dir(e: &Env, name: &str) -> PathBuf {
    let dir = e.c.dir().join("snapshots").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn manifest(dir: &Path) -> Result<serde_json::Value, Failed> {
    let bytes = std::fs::read(dir.join("chalk.manifest.json")).map_err(|e| e.to_string())?;
    serde_json::from_slice(&bytes).map_err(|e| Failed::from(e.to_string()))
}

pub fn snapshot_keeps_the_source_and_forks_continue(e: &Env) -> TestResult {
    let (src, f1, f2, snap) = ("snap-src", "snap-f1", "snap-f2", "chalk/snap-src:1");
    let ids = [src, f1, f2];
    for id in ids {
        e.remove(id);
    }
    e.ctr(&["images", "rm", snap]);
    let result = (|| {
        e.start_counter(src)?;
        // An exec'd process: it must not reach the forks.
        let bg = e.ctr(&[
            "task",
            "exec",
            "--detach",
            "--exec-id",
            "bg",
            src,
            "sleep",
            "1000",
        ]);
        ensure!(bg.code == 0, "exec bg: {bg:?}");
        let events = e.background(&["events"]);
        let before = e.count(src)?;
        let out = e.ctr(&["containers", "checkpoint", "--task", src, snap]);
        ensure!(out.code == 0, "checkpoint: {out:?}");

        // The source goes on: running, counting, answering exec.
        ensure!(
            e.task_status(src).as_deref() == Some("RUNNING"),
            "source is {:?} after the snapshot",
            e.task_status(src)
        );
        let after = e.count(src)?;
        std::thread::sleep(Duration::from_millis(300));
        ensure!(e.count(src)? > after, "the source stopped counting");

        for fork in [f1, f2] {
            let out = e.restore_live(fork, snap);
            ensure!(out.code == 0, "restore {fork}: {out:?}");
            ensure!(
                e.task_status(fork).as_deref() == Some("RUNNING"),
                "{fork} is {:?}",
                e.task_status(fork)
            );
            let n = e.count(fork)?;
            ensure!(
                n >= before,
                "{fork} counts from {n}, the snapshot was at {before}"
            );
            let files = e.sh(fork, "files", "cat /workspace/notes.txt /tmp/t");
            ensure!(
                files.stdout == "hello\ntmp\n",
                "{fork} lost files written before the snapshot: {files:?}"
            );
            let ps = e.sh(fork, "ps", "ps");
            ensure!(
                ps.code == 0 && !ps.stdout.contains("sleep 1000"),
                "an exec'd process survived into {fork}: {}",
                ps.stdout
            );
        }
        // Forks are independent: a change in one reaches neither the other nor the source.
        let mark = e.sh(f1, "mark", "echo f1 > /workspace/mark; echo f1 > /tmp/mark");
        ensure!(mark.code == 0, "write in {f1}: {mark:?}");
        for other in [f2, src] {
            let seen = e.sh(other, "look", "cat /workspace/mark /tmp/mark 2>/dev/null");
            ensure!(
                seen.stdout.is_empty(),
                "{other} sees {f1}'s files: {seen:?}"
            );
        }

        // Exits are still reported: the source's and a fork's.
        let api = e.api();
        let kill = e.ctr(&["task", "kill", "-s", "SIGKILL", src]);
        ensure!(kill.code == 0, "kill source: {kill:?}");
        let (status, _) = api.wait(src, "")?;
        ensure!(status == 137, "the source exited with {status}, not 137");
        let kill = e.ctr(&["task", "kill", "-s", "SIGKILL", f1]);
        ensure!(kill.code == 0, "kill {f1}: {kill:?}");
        let (status, _) = api.wait(f1, "")?;
        ensure!(status == 137, "{f1} exited with {status}, not 137");

        let ctr_events = e.ctr(&["task", "ls"]); // any call, so `ctr events` has flushed
        drop(ctr_events);
        let mut events = events;
        let _ = events.0.kill();
        let seen = events.finish().stdout;
        ensure!(
            seen.contains("/tasks/checkpointed"),
            "no /tasks/checkpointed event in:\n{seen}"
        );
        Ok(())
    })();
    for id in ids {
        e.remove(id);
    }
    e.ctr(&["images", "rm", snap]);
    result?;
    for id in ids {
        e.assert_clean(id)?;
    }
    Ok(())
}

pub fn suspend_releases_the_sandbox_and_resume_continues(e: &Env) -> TestResult {
    let id = "suspend";
    e.remove(id);
    let mut api = e.api();
    api.lease("suspend-test")?;
    let result = (|| {
        e.start_counter(id)?;
        let before = e.count(id)?;
        let snapshot = api.checkpoint(id, true)?;
        e.wait_status(id, "STOPPED", Duration::from_secs(10))?;
        // No sandbox process is left while suspended.
        let left: Vec<String> = e
            .leftovers(id)
            .into_iter()
            .filter(|l| l.starts_with("process"))
            .collect();
        ensure!(left.is_empty(), "suspended {id} still runs: {left:?}");
        let m = stored_manifest(e, &snapshot)?;
        ensure!(m["kind"] == "suspend", "manifest kind: {}", m["kind"]);

        let del = e.ctr(&["task", "delete", id]);
        ensure!(del.code == 0, "task delete: {del:?}");
        api.create_task_from(id, &snapshot)?;
        api.start(id)?;
        ensure!(
            e.task_status(id).as_deref() == Some("RUNNING"),
            "resumed {id} is {:?}",
            e.task_status(id)
        );
        let n = e.count(id)?;
        ensure!(n >= before, "resumed at {n}, suspended at {before}");
        let files = e.sh(id, "files", "cat /workspace/notes.txt /tmp/t");
        ensure!(
            files.stdout == "hello\ntmp\n",
            "files after resume: {files:?}"
        );
        Ok(())
    })();
    api.release();
    e.remove(id);
    result?;
    e.assert_clean(id)
}

/// Where containerd keeps the blob of `d`.
fn blob_path(e: &Env, d: &Descriptor) -> PathBuf {
    e.c.content_blob(&d.digest)
}

/// `(header offset, data offset, size)` of entry `name` in a tar.
fn tar_entry(tar_bytes: &[u8], name: &str) -> Result<(usize, usize, usize), Failed> {
    let mut archive = tar::Archive::new(tar_bytes);
    for entry in archive.entries().map_err(|e| e.to_string())? {
        let entry = entry.map_err(|e| e.to_string())?;
        let path = entry.path().map_err(|e| e.to_string())?;
        if path.to_string_lossy().trim_start_matches("./") == name {
            return Ok((
                entry.raw_header_position() as usize,
                entry.raw_file_position() as usize,
                entry.size() as usize,
            ));
        }
    }
    Err(format!("no {name} in the checkpoint tar").into())
}

/// The manifest inside a checkpoint stored in containerd's content store.
fn stored_manifest(e: &Env, d: &Descriptor) -> Result<serde_json::Value, Failed> {
    let bytes = std::fs::read(blob_path(e, d)).map_err(|e| e.to_string())?;
    let (_, data, size) = tar_entry(&bytes, "chalk.manifest.json")?;
    serde_json::from_slice(&bytes[data..data + size]).map_err(|e| Failed::from(e.to_string()))
}

/// `ctr containers create` of container `id` running `cmd`. ctr 1.6 and 2.x need a `--`
/// before a command with flags of its own (they read `-c` as theirs otherwise); ctr 1.7 keeps
/// a `--` as the command's first word, and leaves the command's flags to it.
fn create_running(e: &Env, id: &str, cmd: &[&str]) -> CtrOutput {
    let version = e.ctr(&["--version"]).stdout;
    let mut args = vec!["containers", "create", "--runtime", RUNTIME, IMAGE, id];
    if !version.split_whitespace().any(|w| w.starts_with("1.7.")) {
        args.push("--");
    }
    args.extend_from_slice(cmd);
    e.ctr(&args)
}

pub fn tampered_snapshots_are_refused(e: &Env) -> TestResult {
    let (src, src_dir) = ("tamper-src", "dir-for-tamper");
    e.remove(src);
    e.remove(src_dir);
    let dir = snapshot_dir(e, "tamper");
    let mut api = e.api();
    api.lease("tamper-test")?;
    let taken = (|| {
        // Into the content store, and into a directory of our choosing (image_path). Two
        // sources: containerd 1.6 fails a second checkpoint of one unchanged container
        // (storing its spec again is "already exists").
        e.start_counter(src)?;
        e.run_detached(src_dir, &["sh", "-c", &format!("{COUNTER}; : dir")])?;
        api.checkpoint_to(src_dir, &dir, false)?;
        api.checkpoint(src, false).map_err(Failed::from)
    })();
    e.remove(src);
    e.remove(src_dir);
    let stored = match taken {
        Ok(d) => d,
        Err(err) => {
            api.release();
            return Err(err);
        }
    };
    let result = (|| {
        e.assert_clean(src)?;
        e.assert_clean(src_dir)?;
        // The snapshot on disk: root-only, with a manifest describing it.
        let m = manifest(&dir)?;
        ensure!(m["kind"] == "snapshot", "manifest kind: {}", m["kind"]);
        ensure!(
            m["source"]["container_id"] == src_dir,
            "manifest source: {}",
            m["source"]
        );
        ensure!(
            m["image"]["digest"]
                .as_str()
                .is_some_and(|d| d.starts_with("sha256:")),
            "manifest image: {}",
            m["image"]
        );
        let mode = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.permissions().mode() & 0o777);
        ensure!(mode(&dir) == 0o700, "snapshot dir mode {:o}", mode(&dir));
        for f in m["files"].as_array().into_iter().flatten() {
            let path = dir.join(f["path"].as_str().unwrap_or_default());
            ensure!(mode(&path) == 0o600, "{} is not 0600", path.display());
        }

        // Tampering with the stored checkpoint, in place (containerd does not re-check a
        // blob's digest when it unpacks it for a restore).
        let blob = blob_path(e, &stored);
        let original = std::fs::read(&blob).map_err(|e| e.to_string())?;
        type Tamper = fn(&mut Vec<u8>) -> TestResult;
        let flip: Tamper = |tar| {
            let (_, data, size) = tar_entry(tar, "checkpoint.img")?;
            tar[data + size / 2] ^= 1;
            Ok(())
        };
        let unlink: Tamper = |tar| {
            let (header, _, _) = tar_entry(tar, "chalk.manifest.json")?;
            let mut h = tar::Header::new_old();
            h.as_mut_bytes().copy_from_slice(&tar[header..header + 512]);
            h.set_path("renamed.manifest.json")
                .map_err(|e| e.to_string())?;
            h.set_cksum();
            tar[header..header + 512].copy_from_slice(h.as_bytes());
            Ok(())
        };
        let edit: Tamper = |tar| {
            let (_, data, size) = tar_entry(tar, "chalk.manifest.json")?;
            let text = String::from_utf8_lossy(&tar[data..data + size]).into_owned();
            let files = text.find("\"files\"").ok_or("no files in the manifest")?;
            let key = "\"sha256\": \"";
            let at = files + text[files..].find(key).ok_or("no file digest")? + key.len();
            tar[data + at..data + at + 64].copy_from_slice(&[b'0'; 64]);
            Ok(())
        };
        let cases: [(&str, Tamper, &str); 3] = [
            ("flipped", flip, "the snapshot was changed or damaged"),
            ("unlinked", unlink, "not a chalk snapshot"),
            ("edited", edit, "the manifest says 0000"),
        ];
        for (name, tamper, expect) in cases {
            let id = format!("tamper-{name}");
            let mut bytes = original.clone();
            tamper(&mut bytes)?;
            std::fs::write(&blob, &bytes).map_err(|e| e.to_string())?;
            let made = create_running(e, &id, &["sh", "-c", COUNTER]);
            ensure!(made.code == 0, "create {id}: {made:?}");
            let refused = api.create_task_from(&id, &stored);
            let leftovers = e.leftovers(&id);
            e.remove(&id);
            match refused {
                Ok(()) => return Err(format!("{name} snapshot was restored").into()),
                Err(msg) => ensure!(
                    msg.contains(expect),
                    "{name}: error {msg:?} lacks {expect:?}"
                ),
            }
            ensure!(leftovers.is_empty(), "refused {name} left {leftovers:?}");
            e.assert_clean(&id)?;
        }
        std::fs::write(&blob, &original).map_err(|e| e.to_string())?;

        // An intact snapshot into a sandbox that may reach further than its source.
        let id = "tamper-wider";
        // (Refused before runsc sees the process, so any will do; ctr misreads `--` and `-c`
        // after --privileged.)
        let made = e.ctr(&[
            "containers",
            "create",
            "--runtime",
            RUNTIME,
            "--privileged",
            IMAGE,
            id,
            "sleep",
            "1000",
        ]);
        ensure!(made.code == 0, "create {id}: {made:?}");
        let refused = api.create_task_from(id, &stored);
        e.remove(id);
        match refused {
            Ok(()) => return Err("a privileged restore of an unprivileged snapshot ran".into()),
            Err(msg) => ensure!(
                msg.contains("reach further than its source") && msg.contains("CAP_SYS_ADMIN"),
                "widening: error {msg:?}"
            ),
        }
        e.assert_clean(id)?;

        // The intact snapshot restores: the refusals were about the tampering.
        let id = "tamper-intact";
        let made = create_running(e, id, &["sh", "-c", COUNTER]);
        // The same process as the source: current runsc checks the spec against the one
        // checkpointed.
        ensure!(made.code == 0, "create {id}: {made:?}");
        let restored = api
            .create_task_from(id, &stored)
            .and_then(|_| api.start(id).map(drop));
        let n = e.count(id);
        e.remove(id);
        restored?;
        ensure!(n? >= 3, "the intact snapshot did not carry the counter");
        e.assert_clean(id)
    })();
    api.release();
    result
}

pub fn restore_is_pinned_to_the_image_digest(e: &Env) -> TestResult {
    let (image, src, fork, snap) = (
        "docker.io/chalk/pinned:v1",
        "pin-src",
        "pin-fork",
        "chalk/pin-src:1",
    );
    for id in [src, fork] {
        e.remove(id);
    }
    e.c.import_variant(image, "").map_err(|e| e.to_string())?;
    let result = (|| {
        let out = e.ctr(&[
            "run",
            "-d",
            "--runtime",
            RUNTIME,
            image,
            src,
            "sh",
            "-c",
            COUNTER,
        ]);
        ensure!(out.code == 0, "run {src}: {out:?}");
        let out = e.ctr(&["containers", "checkpoint", "--task", src, snap]);
        ensure!(out.code == 0, "checkpoint: {out:?}");
        // The tag now names another image.
        e.c.import_variant(image, "moved")
            .map_err(|e| e.to_string())?;
        let out = e.restore_live(fork, snap);
        ensure!(out.code != 0, "restore onto a moved tag succeeded: {out:?}");
        ensure!(
            out.stderr.contains("restore onto the image by that digest")
                && out.stderr.matches("sha256:").count() >= 2,
            "the refusal should name both digests: {}",
            out.stderr
        );
        Ok(())
    })();
    for id in [src, fork] {
        e.remove(id);
    }
    e.ctr(&["images", "rm", snap, image]);
    result?;
    e.assert_clean(src)?;
    e.assert_clean(fork)
}

pub fn failed_checkpoint_leaves_the_source_running(e: &Env) -> TestResult {
    let id = "ckfail";
    e.remove(id);
    let dir = snapshot_dir(e, id);
    let result = (|| {
        e.start_counter(id)?;
        // runsc writes fresh files: a directory holding something is refused, untouched.
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        std::fs::write(dir.join("keep.txt"), b"mine").map_err(|e| e.to_string())?;
        let err = match e.api().checkpoint_to(id, &dir, false) {
            Ok(()) => return Err("a checkpoint into a non-empty directory succeeded".into()),
            Err(err) => err,
        };
        ensure!(err.contains("not empty"), "error should say why: {err}");
        ensure!(
            std::fs::read(dir.join("keep.txt")).ok().as_deref() == Some(&b"mine"[..]),
            "the directory's file was touched"
        );
        ensure!(
            e.task_status(id).as_deref() == Some("RUNNING"),
            "source is {:?} after a failed checkpoint",
            e.task_status(id)
        );
        let before = e.count(id)?;
        std::thread::sleep(Duration::from_millis(300));
        ensure!(e.count(id)? > before, "the source stopped counting");
        Ok(())
    })();
    e.remove(id);
    result?;
    e.assert_clean(id)
}

/// A checkpoint its filesystem has no room for: refused before the sandbox is touched (it runs
/// on, on both runsc generations), with the figures; with the check off, it fails half-way
/// with "no space left on device", and the source runs on where runsc can checkpoint in place
/// (the 2022 build's checkpoint stops the sandbox: then it is cleanly gone, its exit reported).
pub fn failed_snapshot_never_costs_the_source(e: &Env) -> TestResult {
    let (src, unchecked) = ("full-src", "full-unchecked");
    for id in [src, unchecked] {
        e.remove(id);
    }
    // 32 MiB in the sandbox's memory: its checkpoint cannot fit in 8 MiB.
    let filler = format!(
        "dd if=/dev/urandom of=/tmp/fill bs=1M count=32 iflag=fullblock 2>/dev/null; {COUNTER}"
    );
    let small = SmallFs::mount(e.c.dir().join("small"), 8)?;
    let api = e.api();
    let result = (|| {
        e.run_detached(src, &["sh", "-c", &filler])?;
        e.count_reaches(src, 3)?;
        for exit in [false, true] {
            let dir = small.0.join(if exit { "suspend" } else { "snapshot" });
            let err = match api.checkpoint_to(src, &dir, exit) {
                Ok(()) => return Err("a checkpoint with no room succeeded".into()),
                Err(err) => err,
            };
            ensure!(
                err.contains("no room for the checkpoint") && err.contains("MiB free"),
                "the refusal should give the figures: {err}"
            );
            ensure!(
                small.is_empty(if exit { "suspend" } else { "snapshot" }),
                "files left in {}",
                dir.display()
            );
            ensure!(
                e.task_status(src).as_deref() == Some("RUNNING"),
                "refused checkpoint (exit {exit}): the source is {:?}",
                e.task_status(src)
            );
            let n = e.count(src)?;
            e.count_reaches(src, n + 2)?;
        }

        // The check off: runsc runs out of room half-way.
        let options = e.options_with("unchecked.toml", "[snapshot]\ncheck_free_space = false\n")?;
        e.run_detached_with(unchecked, &options, &["sh", "-c", &filler])?;
        e.count_reaches(unchecked, 3)?;
        let dir = small.0.join("unchecked");
        let err = match api.checkpoint_to(unchecked, &dir, false) {
            Ok(()) => return Err("a checkpoint into a full filesystem succeeded".into()),
            Err(err) => err,
        };
        ensure!(err.contains("no space left on device"), "error: {err}");
        ensure!(
            small.is_empty("unchecked"),
            "a failed checkpoint left files"
        );
        if testkit::current_runsc() {
            ensure!(
                e.task_status(unchecked).as_deref() == Some("RUNNING"),
                "a half-written checkpoint cost the source: {:?}",
                e.task_status(unchecked)
            );
            let n = e.count(unchecked)?;
            e.count_reaches(unchecked, n + 2)?;
        } else {
            ensure!(
                err.contains("stopped with it"),
                "the error should say the sandbox stopped: {err}"
            );
            e.wait_status(unchecked, "STOPPED", Duration::from_secs(10))?;
            let (status, _) = api.wait(unchecked, "")?;
            eprintln!("half-written checkpoint on the 2022 runsc: source stopped, exit {status}");
        }
        Ok(())
    })();
    for id in [src, unchecked] {
        e.remove(id);
    }
    drop(small);
    result?;
    e.assert_clean(src)?;
    e.assert_clean(unchecked)
}
