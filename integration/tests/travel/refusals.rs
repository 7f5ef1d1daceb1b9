//! What a host refuses of a registry or a snapshot, and says why: wrong credentials, a
//! snapshot binding host paths, another runsc; and a mirror hosts.toml names.

use super::*;

/// Wrong or missing credentials are refused with what to do, and the password never shows;
/// the docker config's credentials work.
pub fn wrong_credentials_are_refused_clearly(h: &Hosts) -> TestResult {
    let id = "tr-creds";
    let mut on_a = Vec::new();
    let result = (|| {
        counter(h, id)?;
        let snap = h.a.snapshot_of(id)?;
        on_a.push(snap.clone());
        let reference = h.reference("travel/creds:1");
        let wrong = format!("{USER}:not-the-pw-93");
        let out = h.chalkctl(
            &h.a,
            &[
                "snapshot",
                "push",
                "--snapshot-id",
                &snap,
                &reference,
                "--user",
                &wrong,
            ],
        );
        ensure!(
            out.code != 0
                && out.stderr.contains("unauthorized")
                && out.stderr.contains("--user")
                && !out.stderr.contains("not-the-pw-93"),
            "push with a wrong password: {out:?}"
        );
        // No credentials at all: refused too.
        let none = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = h.chalkctl_with(
            &h.a,
            &["snapshot", "push", "--snapshot-id", &snap, &reference],
            none.path(),
        );
        ensure!(
            out.code != 0
                && out.stderr.contains("anonymous")
                && out.stderr.contains("unauthorized"),
            "push without credentials: {out:?}"
        );
        // The right ones, from the docker config.json.
        h.json(
            &h.a,
            &["snapshot", "push", "--snapshot-id", &snap, &reference],
        )?;
        for (user, what) in [
            (wrong.as_str(), "a wrong password"),
            ("nobody:x", "another user"),
        ] {
            let out = h.chalkctl(&h.b, &["snapshot", "pull", &reference, "--user", user]);
            ensure!(
                out.code != 0 && out.stderr.contains("unauthorized") && !out.stderr.contains(user),
                "pull with {what}: {out:?}"
            );
        }
        // No CA for the registry: refused, saying how to trust it.
        let out = h.chalkctl(
            &h.b,
            &[
                "snapshot",
                "pull",
                &reference,
                "--hosts-dir",
                "/nonexistent",
            ],
        );
        ensure!(
            out.code != 0 && out.stderr.contains("CA"),
            "pull without the registry's CA: {out:?}"
        );
        let left = h.json(&h.b, &["snapshot", "list", "--sandbox-id", id])?;
        ensure!(
            left["items"].as_array().is_some_and(Vec::is_empty),
            "a refused pull left a record: {left}"
        );
        Ok(())
    })();
    h.a.conclude(result, &[id], &on_a)
}

/// A pull through a mirror that hosts.toml names, with its own CA file, while the upstream
/// itself cannot be reached: the snapshot keeps its id.
pub fn a_mirror_in_hosts_toml_serves_the_pull(h: &Hosts) -> TestResult {
    let id = "tr-mirror";
    let mut on_a = Vec::new();
    let result = (|| {
        counter(h, id)?;
        let snap = h.a.snapshot_of(id)?;
        on_a.push(snap.clone());
        let reference = h.reference("travel/mirror:1");
        h.json(
            &h.a,
            &["snapshot", "push", "--snapshot-id", &snap, &reference],
        )?;
        // `upstream.invalid` resolves nowhere; its hosts.toml sends pulls to the registry.
        let hosts = tempfile::tempdir().map_err(|e| e.to_string())?;
        let dir = hosts.path().join("upstream.invalid");
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let ca = h.registry.hosts_dir.join(&h.registry.addr).join("ca.crt");
        std::fs::write(
            dir.join("hosts.toml"),
            format!(
                "server = \"https://upstream.invalid\"\n\n[host.\"https://{}\"]\n  \
                 capabilities = [\"pull\", \"resolve\"]\n  ca = \"{}\"\n",
                h.registry.addr,
                ca.display()
            ),
        )
        .map_err(|e| e.to_string())?;
        let upstream = reference.replacen(&h.registry.addr, "upstream.invalid", 1);
        let hosts_dir = hosts.path().display().to_string();
        let pulled = h.json(
            &h.b,
            &["snapshot", "pull", &upstream, "--hosts-dir", &hosts_dir],
        )?;
        ensure!(
            pulled["id"] == snap.as_str(),
            "pull through the mirror: {pulled}"
        );
        // Pushes do not go to a pull-only mirror: the unreachable upstream is tried.
        let out = h.chalkctl(
            &h.b,
            &[
                "snapshot",
                "push",
                "--snapshot-id",
                &snap,
                &upstream,
                "--hosts-dir",
                &hosts_dir,
            ],
        );
        ensure!(
            out.code != 0 && out.stderr.contains("upstream.invalid"),
            "push with only a pull mirror: {out:?}"
        );
        h.json(&h.b, &["snapshot", "delete", "--snapshot-id", &snap])?;
        Ok(())
    })();
    h.a.conclude(result, &[id], &on_a)
}

/// A snapshot whose spec binds a host path is pushed and pulled, but no sandbox is made from
/// it on another host: that would reach the other host's files.
pub fn a_pulled_snapshot_may_not_bind_host_paths(h: &Hosts) -> TestResult {
    let id = "tr-bind";
    let mut on_a = Vec::new();
    let result = (|| {
        let shared = h.a.c.dir().join("shared-data");
        std::fs::create_dir_all(&shared).map_err(|e| e.to_string())?;
        let mount = format!(
            "type=bind,src={},dst=/data,options=rbind:ro",
            shared.display()
        );
        let out = h.a.ctr(&[
            "run",
            "-d",
            "--runtime",
            RUNTIME,
            "--mount",
            &mount,
            IMAGE,
            id,
            "sh",
            "-c",
            COUNTER,
        ]);
        ensure!(out.code == 0, "ctr run with a bind mount: {out:?}");
        h.a.count_reaches(id, 3)?;
        let snap = h.a.snapshot_of(id)?;
        on_a.push(snap.clone());
        let reference = h.reference("travel/bind:1");
        h.json(
            &h.a,
            &["snapshot", "push", "--snapshot-id", &snap, &reference],
        )?;
        let out = h.chalkctl(
            &h.b,
            &["fork", "--snapshot", &reference, "--fork-id", "tr-bind-f"],
        );
        ensure!(
            out.code != 0
                && out.stderr.contains("binds host paths")
                && out.stderr.contains("/data")
                && h.b.task_status("tr-bind-f").is_none(),
            "fork on B of a snapshot binding a host path: {out:?}"
        );
        h.json(&h.b, &["snapshot", "delete", "--snapshot-id", &snap])?;
        Ok(())
    })();
    h.a.conclude(result, &[id], &on_a)
}

/// A host whose runsc is another build refuses the snapshot before fetching any of it.
pub fn a_host_with_another_runsc_refuses_before_pulling(h: &Hosts) -> TestResult {
    let Some(c) = &h.c else { return Ok(()) };
    let id = "tr-other";
    let mut on_a = Vec::new();
    let result = (|| {
        counter(h, id)?;
        let snap = h.a.snapshot_of(id)?;
        on_a.push(snap.clone());
        let reference = h.reference("travel/other:1");
        h.json(
            &h.a,
            &["snapshot", "push", "--snapshot-id", &snap, &reference],
        )?;
        let out = h.chalkctl(c, &["resume", "--id", id, "--from", &reference]);
        ensure!(
            out.code != 0
                && out.stderr.contains("cannot be restored on this host")
                && out.stderr.contains("runsc version")
                && out.stderr.contains("nothing was fetched"),
            "resume on a host with another runsc: {out:?}"
        );
        let store = c.c.snapshot_store();
        ensure!(
            files_under(&store.join("blobs/sha256")) == 0 && files_under(&c.c.content_blobs()) == 0,
            "the refused host fetched {} store blob(s) and {} content blob(s)",
            files_under(&store.join("blobs/sha256")),
            files_under(&c.c.content_blobs())
        );
        ensure!(
            c.task_status(id).is_none(),
            "{id} runs on the refusing host"
        );
        Ok(())
    })();
    h.a.conclude(result, &[id], &on_a)
}
