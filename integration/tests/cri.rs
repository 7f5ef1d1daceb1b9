//! Pods through Kubernetes' runtime interface: containerd's CRI plugin with the `chalk` handler
//! that packaging/install.sh registers, driven over CRI gRPC as the kubelet drives it. Real
//! containerd, real runsc, nothing faked; host-network pods, but for a second node whose pods
//! get CNI networks (cri/network.rs).

use std::{
    ops::Deref,
    time::{Duration, Instant},
};

use chalk_integration::{
    cases,
    containerd::{CRI_HANDLER, IMAGE, PAUSE_IMAGE},
    cri::{ContainerState, Cri},
    crictl::{Crictl, PodCgroup, PodConfig},
    ensure, procs,
    registry::Secured,
    sealing,
    testkit::{self, Env, Failed, TestResult},
    Containerd,
};
use chalk_runtime::pod_restore::RESTORE_FROM;

#[path = "cri/crictl.rs"]
mod crictl;
#[path = "cri/network.rs"]
mod network;
#[path = "cri/registry.rs"]
mod registry;
#[path = "cri/restore.rs"]
mod restore;
use registry::SigningKeys;
use restore::remove_refused;
#[path = "cri/tenants.rs"]
mod tenants;

/// The shared environment with containerd's CRI plugin as a client.
struct CriEnv {
    env: Env,
    cri: Cri,
    /// A registry this node pulls pods' snapshots from (when CHALK_REGISTRY names one).
    registry: Option<Secured>,
    /// Kubernetes' CRI command line (when CHALK_CRICTL names one).
    crictl: Option<Crictl>,
    /// The signing keys of the node's `[trust]` rule over the registry's `signed/`.
    keys: Option<SigningKeys>,
    /// A second node whose pods get CNI networks of their own (current runsc, with the CNI
    /// plugins of `CHALK_CNI_BIN`).
    net: Option<Box<CriEnv>>,
}

impl Deref for CriEnv {
    type Target = Env;
    fn deref(&self) -> &Env {
        &self.env
    }
}

const SECOND: Duration = Duration::from_secs(1);

/// A shell loop that counts seconds into /tmp/n and says it started.
const COUNTER: &[&str] = &[
    "/bin/sh",
    "-c",
    "echo started; i=0; while true; do i=$((i+1)); echo $i > /tmp/n; sleep 1; done",
];

impl CriEnv {
    /// Shim daemons and runsc sandbox processes of this containerd serving `id` (a pod or a
    /// container).
    fn processes_for(&self, id: &str) -> (usize, usize) {
        let mine = self.c.dir().display().to_string();
        let ps: Vec<_> = procs::processes()
            .into_iter()
            .filter(|(_, a)| a.iter().any(|x| x.contains(&mine)))
            .collect();
        let shims = ps
            .iter()
            .filter(|(_, a)| {
                a.first()
                    .is_some_and(|a0| a0.ends_with("containerd-shim-chalk-v1"))
                    && a.iter().any(|x| x == id)
            })
            .count();
        let sandboxes = ps
            .iter()
            .filter(|(_, a)| {
                a.first().is_some_and(|a0| a0.contains("runsc-sandbox"))
                    && a.last().is_some_and(|x| x == id)
            })
            .count();
        (shims, sandboxes)
    }

    /// Waits until nothing serves `pod` any more.
    fn gone(&self, pod: &str) -> TestResult {
        let deadline = Instant::now() + 10 * SECOND;
        loop {
            let left = self.processes_for(pod);
            if left == (0, 0) {
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "pod {pod}: {} shim(s), {} sandbox(es) left",
                left.0,
                left.1
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let root = self.c.dir().join("runsc").join("k8s.io").join(pod);
        ensure!(!root.exists(), "runsc state left in {}", root.display());
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        ensure!(
            !mounts.lines().any(|l| l.contains(pod)),
            "mounts of {pod} left"
        );
        Ok(())
    }

    fn counter(&self, id: &str) -> Result<u64, Failed> {
        // A snapshot may catch the shell between `>` truncating /tmp/n and echo writing it:
        // the restored container then shows it empty until its next write, 0.2 s later.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            let r = self.cri.exec_sync(id, &["cat", "/tmp/n"], 10 * SECOND)?;
            ensure!(r.exit_code == 0, "cat /tmp/n in {id}: {r:?}");
            if r.stdout.trim().is_empty() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(100));
                continue;
            }
            return r
                .stdout
                .trim()
                .parse()
                .map_err(|e| Failed::from(format!("counter of {id} is {:?}: {e}", r.stdout)));
        }
    }

    fn stop_and_remove(&self, pod: &str) -> TestResult {
        self.cri.stop_pod(pod)?;
        self.cri.remove_pod(pod)?;
        self.gone(pod)
    }
}

/// Two containers in one pod: one sandbox, one shim; ExecSync, status, exit codes, stats,
/// logs; stopping one leaves the other; stopping the pod leaves nothing.
fn pod_runs_its_containers_in_one_sandbox(e: &CriEnv) -> TestResult {
    let pod = e.cri.run_pod("two", CRI_HANDLER, false)?;
    let web = e.cri.run_container(&pod, "web", IMAGE, COUNTER)?;
    let side = e.cri.run_container(&pod, "side", IMAGE, COUNTER)?;
    ensure!(
        e.processes_for(&pod) == (1, 1),
        "pod {pod} should have one shim and one sandbox: {:?}",
        e.processes_for(&pod)
    );
    for c in [&web, &side] {
        ensure!(
            e.processes_for(c) == (0, 0),
            "container {c} has a shim or sandbox of its own"
        );
        let s = e.cri.container_status(c)?;
        ensure!(
            s.state == ContainerState::ContainerRunning as i32,
            "{c} is {:?}",
            s.state
        );
    }
    // ExecSync in each, with its own output and exit code.
    let r = e.cri.exec_sync(
        &web,
        &["sh", "-c", "echo out-web; echo err-web >&2; exit 3"],
        10 * SECOND,
    )?;
    ensure!(
        r.exit_code == 3 && r.stdout == "out-web\n" && r.stderr == "err-web\n",
        "exec in web: {r:?}"
    );
    let r = e.cri.exec_sync(&side, &["hostname"], 10 * SECOND)?;
    ensure!(
        r.exit_code == 0 && !r.stdout.trim().is_empty(),
        "exec in side: {r:?}"
    );
    // Each has its own root filesystem: a file written in one is not in the other.
    e.cri
        .exec_sync(&web, &["sh", "-c", "echo mine > /only-web"], 10 * SECOND)?;
    let r = e.cri.exec_sync(&side, &["cat", "/only-web"], 10 * SECOND)?;
    ensure!(r.exit_code != 0, "side sees web's file: {r:?}");

    // Stats per container.
    let stats = e.cri.container_stats(&web)?;
    let memory = stats
        .memory
        .and_then(|m| m.working_set_bytes)
        .map(|v| v.value)
        .unwrap_or(0);
    let cpu = stats.cpu.map(|c| c.timestamp).unwrap_or(0);
    ensure!(
        memory > 0 && cpu > 0,
        "stats of web: memory {memory}, cpu at {cpu}"
    );

    // A container that ends by itself: its exit code and its log.
    let done = e.cri.run_container(
        &pod,
        "done",
        IMAGE,
        &["/bin/sh", "-c", "echo bye from done; exit 7"],
    )?;
    let s = e.cri.wait_exited(&done, 20 * SECOND)?;
    ensure!(s.exit_code == 7, "done exited with {} ({s:?})", s.exit_code);
    let log_dir = e.cri.log_directory(&pod).unwrap_or_default();
    let log = std::fs::read_to_string(format!("{log_dir}/done.log")).unwrap_or_default();
    ensure!(
        log.contains("stdout F bye from done"),
        "done's log: {log:?}"
    );
    let log = std::fs::read_to_string(format!("{log_dir}/web.log")).unwrap_or_default();
    ensure!(log.contains("stdout F started"), "web's log: {log:?}");
    e.cri.remove_container(&done)?;

    // Stopping one container (SIGTERM ends the shell) leaves the other running.
    let started = Instant::now();
    e.cri.stop_container(&side, 10 * SECOND)?;
    let s = e.cri.wait_exited(&side, 10 * SECOND)?;
    ensure!(
        s.exit_code == 128 + 15,
        "side stopped with {} ({s:?})",
        s.exit_code
    );
    ensure!(
        started.elapsed() < 8 * SECOND,
        "StopContainer took {:?}: SIGTERM was not delivered",
        started.elapsed()
    );
    let before = e.counter(&web)?;
    std::thread::sleep(Duration::from_millis(1500));
    ensure!(
        e.counter(&web)? > before,
        "web stopped counting after side was stopped"
    );
    ensure!(
        e.cri.exec_sync(&side, &["true"], 5 * SECOND).is_err(),
        "ExecSync in a stopped container worked"
    );
    e.stop_and_remove(&pod)?;
    ensure!(
        e.cri.containers_of(&pod)?.is_empty(),
        "CRI still lists containers of the removed pod"
    );
    Ok(())
}

/// A container that cannot start fails with its reason; its pod carries on.
fn a_failing_container_leaves_its_pod_running(e: &CriEnv) -> TestResult {
    let pod = e.cri.run_pod("failing", CRI_HANDLER, false)?;
    let err = e
        .cri
        .run_container(&pod, "bad", IMAGE, &["/no/such/program"])
        .err()
        .unwrap_or_default();
    ensure!(
        err.contains("/no/such/program") && err.contains("not found"),
        "the failure does not say why: {err:?}"
    );
    let ok = e.cri.run_container(&pod, "ok", IMAGE, COUNTER)?;
    let r = e.cri.exec_sync(&ok, &["echo", "fine"], 10 * SECOND)?;
    ensure!(r.stdout == "fine\n", "exec after a failed container: {r:?}");
    e.stop_and_remove(&pod)
}

/// The node agent's hold on a pod's stop (`chalk.io/hold-stop`, a task Update's annotation,
/// through containerd's own API): the kubelet's StopContainer is answered while the container
/// runs on, until the agent's `kill` ends it with SIGKILL; the SIGKILL that StopContainer
/// sends at its timeout goes through without the agent.
fn an_armed_pod_runs_through_its_stop_until_the_agent_says(e: &CriEnv) -> TestResult {
    use chalk_integration::api::Api;
    let pod = e.cri.run_pod("held", CRI_HANDLER, false)?;
    let web = e.cri.run_container(&pod, "web", IMAGE, COUNTER)?;
    let side = e.cri.run_container(&pod, "side", IMAGE, COUNTER)?;
    let api = Api::connect(&e.c.socket(), "k8s.io")?;
    let hold = chalk_labels::HOLD_STOP;
    let refused = api.update_annotations(&web, &[(hold, "arm")]).unwrap_err();
    ensure!(refused.contains("sandbox container"), "{refused}");
    api.update_annotations(&pod, &[(hold, "arm")])?;
    let stopping = {
        let cri = Cri::connect(&e.c.socket())?;
        let web = web.clone();
        std::thread::spawn(move || {
            let t = Instant::now();
            cri.stop_container(&web, 60 * SECOND).map(|()| t.elapsed())
        })
    };
    // The timeout is what ends a hold nobody releases.
    let started = Instant::now();
    e.cri.stop_container(&side, 2 * SECOND)?;
    let side_took = started.elapsed();
    ensure!(
        side_took >= 2 * SECOND && side_took < 10 * SECOND,
        "the side container's stop took {side_took:?}: its SIGKILL at 2 s ends it"
    );
    let before = e.counter(&web)?;
    std::thread::sleep(Duration::from_millis(1500));
    let after = e.counter(&web)?;
    ensure!(
        after > before,
        "web stopped counting while its stop was held"
    );
    ensure!(
        !stopping.is_finished(),
        "web's StopContainer returned while held"
    );
    api.update_annotations(&pod, &[(hold, "kill")])?;
    let took = stopping
        .join()
        .map_err(|_| Failed::from("the stopping thread panicked"))??;
    ensure!(
        took < 10 * SECOND,
        "web's stop took {took:?} after the agent's kill"
    );
    let status = e.cri.container_status(&web)?;
    ensure!(
        status.exit_code == 137,
        "web ended with {} (SIGKILL: 137)",
        status.exit_code
    );
    e.stop_and_remove(&pod)
}

/// chalkctl snapshots a pod's whole sandbox through its sandbox container, and the pod keeps
/// running; a pod's other containers are not checkpointed on their own. A runsc that cannot
/// checkpoint a running pod in place refuses before touching it.
fn pod_snapshot_keeps_the_pod_running(e: &CriEnv) -> TestResult {
    let pod = e.cri.run_pod("snap", CRI_HANDLER, false)?;
    let web = e.cri.run_container(&pod, "web", IMAGE, COUNTER)?;
    std::thread::sleep(Duration::from_millis(1500));

    let out = e.chalkctl(&["snapshot", "create", "--id", &web]);
    ensure!(
        out.code == 1 && out.stderr.contains("whole sandbox") && out.stderr.contains(&pod),
        "snapshot of a pod's container: {out:?}"
    );
    let list = e.chalkctl(&["snapshot", "list", "-o", "json"]);
    ensure!(
        list.code == 0 && !list.stdout.contains(&web),
        "the refused snapshot of a pod's container left a record: {list:?}"
    );
    let out = e.chalkctl(&["snapshot", "create", "--id", &pod, "-o", "json"]);
    // Debian's runsc (2022) checkpoints by stopping the sandbox; current ones do it in place.
    let in_place = std::env::var_os("CHALK_RUNSC").is_some_and(|v| !v.is_empty());
    if in_place {
        ensure!(out.code == 0, "pod snapshot: {out:?}");
        let v: serde_json::Value = serde_json::from_str(&out.stdout)
            .map_err(|err| format!("chalkctl json: {err}: {out:?}"))?;
        ensure!(v["status"] == "completed", "pod snapshot: {v}");
        let id = v["id"].as_str().unwrap_or_default();
        let get = e.chalkctl(&["snapshot", "get", "--snapshot-id", id, "-o", "json"]);
        ensure!(
            get.stdout.contains("\"web\""),
            "the manifest misses web: {get:?}"
        );
        // A pending record was there before this one was completed.
        records_are_no_images(e)?;
        e.chalkctl(&["snapshot", "delete", "--snapshot-id", id]);
    } else {
        ensure!(
            out.stderr.contains("cannot checkpoint a pod") && out.stderr.contains("runsc"),
            "pod snapshot refused without the reason: {out:?}"
        );
        // Its record stays, failed.
        records_are_no_images(e)?;
    }
    // Either way the pod runs on, untouched.
    let before = e.counter(&web)?;
    std::thread::sleep(Duration::from_millis(1500));
    ensure!(
        e.counter(&web)? > before,
        "web stopped counting after the snapshot"
    );
    let s = e.cri.container_status(&web)?;
    ensure!(
        s.state == ContainerState::ContainerRunning as i32,
        "web is {:?} after the snapshot",
        s.state
    );
    e.stop_and_remove(&pod)
}

/// Snapshot records (in CRI's own namespace) are no names of an image for CRI: containerd
/// 1.6 and 1.7 took a record that named the pause image for one, sorted it first, and then
/// started new pods through it ("unexpected media type ...criu.checkpoint..."). CRI reads
/// image events as they come, so its list is read for a while; then a new pod is started.
fn records_are_no_images(e: &CriEnv) -> TestResult {
    for _ in 0..6 {
        let names = e.cri.image_names()?;
        let records: Vec<&String> = names
            .iter()
            .filter(|n| n.starts_with("chalk.io/snapshots/"))
            .collect();
        ensure!(
            records.is_empty(),
            "CRI lists snapshot records as images: {records:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let pod = e.cri.run_pod("beside-a-record", CRI_HANDLER, false)?;
    e.stop_and_remove(&pod)
}

/// A side container's command: it writes its state to /tmp/side, then waits.
const SIDE: &[&str] = &[
    "/bin/sh",
    "-c",
    "echo side-state > /tmp/side; while true; do sleep 1; done",
];

/// Pod `name` with a counting `web` and a `side` holding state: (pod, web, side).
fn web_and_side(e: &CriEnv, name: &str) -> Result<(String, String, String), Failed> {
    let pod = e.cri.run_pod(name, CRI_HANDLER, false)?;
    let web = e.cri.run_container(&pod, "web", IMAGE, COUNTER)?;
    let side = e.cri.run_container(&pod, "side", IMAGE, SIDE)?;
    Ok((pod, web, side))
}

/// A snapshot of pod `pod`, by chalkctl: its id.
fn pod_snapshot(e: &CriEnv, pod: &str) -> Result<String, Failed> {
    let out = e.chalkctl(&["snapshot", "create", "--id", pod, "-o", "json"]);
    ensure!(out.code == 0, "pod snapshot: {out:?}");
    let v: serde_json::Value =
        serde_json::from_str(&out.stdout).map_err(|err| format!("{err}: {out:?}"))?;
    Ok(v["id"].as_str().unwrap_or_default().to_string())
}

/// chalkctl with `args`, pointed at the test registry.
fn chalkctl_to_registry(e: &CriEnv, args: &[&str]) -> chalk_integration::CtrOutput {
    let mut cmd = e.c.chalkctl_command().expect("chalkctl is built");
    if let Some(r) = &e.registry {
        r.client(&mut cmd);
    }
    cmd.args(args).output().expect("run chalkctl").into()
}

/// Runs `cmd` in task `id` with ctr (a fork's containers are containerd's, not CRI's).
fn ctr_exec(e: &CriEnv, id: &str, cmd: &[&str]) -> chalk_integration::CtrOutput {
    static EXECS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = EXECS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let exec_id = format!("x{n}");
    let mut args = vec!["task", "exec", "--exec-id", &exec_id, id];
    args.extend_from_slice(cmd);
    e.c.ctr(&args)
}

/// A pod's snapshot forks into a new sandbox holding all its containers, each carrying on
/// from the snapshot, with copies of the pod's own files; Kubernetes does not see the fork.
fn pod_fork_restores_every_container(e: &CriEnv) -> TestResult {
    let (pod, web, side) = web_and_side(e, "forked")?;
    std::thread::sleep(Duration::from_millis(2500));
    let snapshot = pod_snapshot(e, &pod)?;
    let at_snapshot = e.counter(&web)?;

    let started = Instant::now();
    let fork = e.chalkctl(&["fork", "--snapshot-id", &snapshot, "--fork-id", "pf"]);
    ensure!(fork.code == 0, "fork of the pod: {fork:?}");
    let forked_in = started.elapsed();
    ensure!(
        e.processes_for("pf") == (1, 1),
        "the fork should be one sandbox under one shim: {:?}",
        e.processes_for("pf")
    );
    // Each container carries on from the snapshot, in the fork's one sandbox.
    std::thread::sleep(Duration::from_millis(1500));
    let n = ctr_exec(e, "web-pf", &["cat", "/tmp/n"]);
    let forked: u64 = n.stdout.trim().parse().unwrap_or(0);
    ensure!(
        n.code == 0 && forked + 1 >= at_snapshot,
        "the fork's web counter {:?} (source had {at_snapshot} at the snapshot): {n:?}",
        n.stdout
    );
    let state = ctr_exec(e, "side-pf", &["cat", "/tmp/side"]);
    ensure!(
        state.stdout == "side-state\n",
        "the fork's side lost its memory: {state:?}"
    );
    // The fork's /etc/hosts is a copy: writing it leaves the source's alone.
    let w = ctr_exec(
        e,
        "web-pf",
        &["sh", "-c", "echo 10.9.9.9 forked >> /etc/hosts"],
    );
    let src = e.cri.exec_sync(&web, &["cat", "/etc/hosts"], 10 * SECOND)?;
    ensure!(
        w.code == 0 && !src.stdout.contains("forked"),
        "the fork wrote into its source's /etc/hosts: {w:?} {src:?}"
    );
    // Both go on independently; Kubernetes knows only the source.
    ensure!(e.counter(&web)? >= at_snapshot, "the source stopped");
    ensure!(
        e.cri.containers_of(&pod)?.len() == 2,
        "CRI lists more than the source's two containers"
    );
    let list = e.chalkctl(&["list"]);
    ensure!(
        list.stdout.contains("web-pf") && list.stdout.contains("side-pf"),
        "chalkctl list misses the fork's containers: {list:?}"
    );
    eprintln!("pod fork (3 containers) in {forked_in:?}");

    for id in ["web-pf", "side-pf", "pf"] {
        e.c.ctr(["task", "kill", "-s", "SIGKILL", id]);
    }
    for id in ["web-pf", "side-pf", "pf"] {
        let deadline = Instant::now() + 10 * SECOND;
        while e.c.ctr(["task", "delete", id]).code != 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        e.c.ctr(["containers", "rm", id]);
    }
    let deadline = Instant::now() + 10 * SECOND;
    while e.processes_for("pf") != (0, 0) {
        ensure!(
            Instant::now() < deadline,
            "the fork left processes: {:?}; tasks: {}",
            e.processes_for("pf"),
            e.c.ctr(["task", "ls"]).stdout
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    e.chalkctl(&["snapshot", "delete", "--snapshot-id", &snapshot]);
    let _ = side;
    e.stop_and_remove(&pod)
}

fn main() {
    testkit::check_args();
    let registry = std::env::var_os("CHALK_REGISTRY")
        .filter(|v| !v.is_empty())
        .map(|bin| {
            Secured::start(std::path::Path::new(&bin), None, &[])
                .unwrap_or_else(|e| panic!("cannot start the registry: {e}"))
        });
    let (keys, trust) = match &registry {
        Some(r) => {
            let (keys, options) = SigningKeys::make(&format!("{}/signed", r.addr))
                .unwrap_or_else(|e| panic!("cannot make keys: {e}"));
            (Some(keys), format!("{options}{}", tenants::trust(&r.addr)))
        }
        None => (None, String::new()),
    };
    let c = Containerd::start_cri(chalk_integration::containerd::CriOptions {
        registry_hosts: registry.as_ref().map(|r| r.hosts_dir.clone()),
        registry_auth: registry.as_ref().map(|r| r.docker_config.clone()),
        options: trust,
        restore_from: registry
            .as_ref()
            .map(|r| tenants::restore_from(&r.addr))
            .unwrap_or_default(),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("cannot start containerd: {e}"));
    let cri = Cri::connect(&c.socket()).unwrap_or_else(|e| panic!("CRI: {e}"));
    let crictl = Crictl::from_env(&c.socket());
    // Debian's runsc (2022) cannot snapshot a running pod (see above), so nor fork one.
    let old_runsc = !testkit::current_runsc();
    let net = network::node(old_runsc).map(Box::new);
    let no_net = net.is_none();
    let all = cases![
        pod_runs_its_containers_in_one_sandbox,
        a_failing_container_leaves_its_pod_running,
        pod_snapshot_keeps_the_pod_running,
        restore::a_pod_from_a_missing_or_disallowed_snapshot_fails_with_why,
        an_armed_pod_runs_through_its_stop_until_the_agent_says,
    ]
    .into_iter()
    .chain(
        cases![
            pod_fork_restores_every_container,
            restore::a_pod_starts_from_a_snapshot
        ]
        .into_iter()
        .map(|c| c.ignored_if(old_runsc)),
    )
    .chain(
        cases![crictl::crictl_a_pods_limits_are_what_its_sandbox_sees]
            .into_iter()
            .map(|c| c.ignored_if(crictl.is_none())),
    )
    .chain(
        cases![crictl::crictl_a_pod_with_an_init_container_starts_from_a_snapshot]
            .into_iter()
            .map(|c| c.ignored_if(old_runsc || crictl.is_none())),
    )
    .chain(
        cases![
            registry::a_pod_starts_from_a_registry_snapshot_this_node_lacks,
            registry::a_pod_starts_only_from_a_snapshot_its_node_trusts,
            tenants::a_namespace_never_restores_anothers_snapshot
        ]
        .into_iter()
        .map(|c| c.ignored_if(old_runsc || registry.is_none())),
    )
    .chain(
        cases![network::a_restored_pod_has_its_new_pods_address]
            .into_iter()
            .map(|c| c.ignored_if(no_net)),
    )
    .collect();
    testkit::run(
        CriEnv {
            env: Env { c },
            cri,
            registry,
            crictl,
            keys,
            net,
        },
        all,
        |_| Ok(()),
    )
}
