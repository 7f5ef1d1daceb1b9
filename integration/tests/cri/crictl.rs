//! Pods through Kubernetes' own CRI command line (crictl), with a pod cgroup as the kubelet
//! makes one: the limits a sandbox sees, and a pod with an init container from a snapshot.

use super::*;

/// A pod cgroup for this run, as the kubelet names one (`pod<uid>`), with `mib` MiB of memory
/// and 0.6 of a CPU.
fn pod_cgroup(name: &str, mib: u64) -> Result<PodCgroup, Failed> {
    let path = format!("/chalk-crictl-{}/pod{name}", std::process::id());
    Ok(PodCgroup::make(&path, mib << 20, 60_000)?)
}

/// The sandbox's MemTotal, in kB.
fn mem_total(crictl: &Crictl, id: &str) -> Result<u64, Failed> {
    let out = crictl.exec(id, &["grep", "MemTotal", "/proc/meminfo"])?;
    out.split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| Failed::from(format!("MemTotal in {id}: {out:?}")))
}

/// Through crictl: a pod whose cgroup (the kubelet's, with the pod's limits) gives it 320 MiB
/// sees 320 MiB inside its sandbox, not the host's memory: runsc sizes a sandbox from the
/// cgroup it runs in, and the shim puts a pod's sandbox in its pod's.
pub fn crictl_a_pods_limits_are_what_its_sandbox_sees(e: &CriEnv) -> TestResult {
    let crictl = e.crictl.as_ref().ok_or("no crictl")?;
    let cgroup = pod_cgroup("limits", 320)?;
    let pod = PodConfig {
        name: "limits",
        cgroup_parent: Some(&cgroup.path),
        ..Default::default()
    };
    let id = crictl.runp(&pod, CRI_HANDLER)?;
    let web = crictl.run_container(&id, &pod, "web", IMAGE, COUNTER)?;
    let kb = mem_total(crictl, &web)?;
    ensure!(
        kb == 320 << 10,
        "MemTotal inside is {kb} kB; the pod's cgroup allows {} kB",
        320 << 10
    );
    crictl.remove_pod(&id)?;
    e.gone(&id)
}

/// Through crictl, a pod with an init container starts from a snapshot of another: the init
/// container, which the snapshot had run to completion, is skipped (it reads exited 0 and
/// never ran: its log is empty), the app carries on from the snapshot's memory, and the
/// sandbox is sized by the new pod's cgroup (other limits than the source's).
pub fn crictl_a_pod_with_an_init_container_starts_from_a_snapshot(e: &CriEnv) -> TestResult {
    let crictl = e.crictl.as_ref().ok_or("no crictl")?;
    let (c1, c2) = (pod_cgroup("src", 320)?, pod_cgroup("restored", 384)?);
    const INIT: &[&str] = &["/bin/sh", "-c", "echo init-ran"];
    let exited_zero = |id: &str| -> TestResult {
        let deadline = Instant::now() + 20 * SECOND;
        loop {
            let s = crictl.inspect(id)?;
            if s["state"] == "CONTAINER_EXITED" {
                ensure!(s["exitCode"] == 0, "{id} exited: {s}");
                return Ok(());
            }
            ensure!(Instant::now() < deadline, "{id} did not exit: {s}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let source = PodConfig {
        name: "with-init",
        cgroup_parent: Some(&c1.path),
        ..Default::default()
    };
    let src = crictl.runp(&source, CRI_HANDLER)?;
    let init = crictl.run_container(&src, &source, "setup", IMAGE, INIT)?;
    exited_zero(&init)?;
    ensure!(
        crictl.log("with-init", "setup").contains("init-ran"),
        "the source's init container did not run"
    );
    let web = crictl.run_container(&src, &source, "web", IMAGE, COUNTER)?;
    std::thread::sleep(Duration::from_millis(2500));
    let snapshot = pod_snapshot(e, &src)?;
    let at_snapshot: u64 = crictl.exec(&web, &["cat", "/tmp/n"])?.parse().unwrap_or(0);

    let restored = PodConfig {
        name: "from-snapshot",
        annotations: &[(RESTORE_FROM, &snapshot)],
        cgroup_parent: Some(&c2.path),
    };
    let started = Instant::now();
    let pod = crictl.runp(&restored, CRI_HANDLER)?;
    let init2 = crictl.run_container(&pod, &restored, "setup", IMAGE, INIT)?;
    exited_zero(&init2)?;
    let web2 = crictl.run_container(&pod, &restored, "web", IMAGE, COUNTER)?;
    let running_in = started.elapsed();
    ensure!(
        !crictl.log("from-snapshot", "setup").contains("init-ran"),
        "the restored pod ran its init container again"
    );
    let n: u64 = crictl.exec(&web2, &["cat", "/tmp/n"])?.parse().unwrap_or(0);
    ensure!(
        n + 1 >= at_snapshot && at_snapshot > 0,
        "the restored web counts from {n}; the source had {at_snapshot} at the snapshot"
    );
    let kb = mem_total(crictl, &web2)?;
    ensure!(
        kb == 384 << 10,
        "the restored pod's MemTotal is {kb} kB; its own pod cgroup allows {} kB (the \
         source's, {})",
        384 << 10,
        320 << 10
    );
    eprintln!(
        "pod with an init container from a snapshot, through crictl: running in {running_in:?}"
    );
    crictl.remove_pod(&pod)?;
    e.gone(&pod)?;
    crictl.remove_pod(&src)?;
    e.gone(&src)?;
    e.chalkctl(&["snapshot", "delete", "--snapshot-id", &snapshot]);
    Ok(())
}
