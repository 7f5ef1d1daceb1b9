//! A sandbox's life on fakes: events and statuses, execs, pod members, kills racing exits, and
//! an exec's output fifos.

use super::fakes::*;

#[test]
fn a_sandbox_lives_and_ends_with_exact_events_and_statuses() {
    let w = world();
    let pid = w.create("web").unwrap();
    assert!(pid > 0);
    assert_eq!(w.status("web"), Status::Created);
    assert!(matches!(w.create("web"), Err(ShimError::AlreadyExists(_))));
    assert_eq!(w.shim.start("web", "").unwrap(), pid);
    assert_eq!(w.status("web"), Status::Running);
    w.shim.pause("web").unwrap();
    assert_eq!(w.status("web"), Status::Paused);
    w.shim.resume("web").unwrap();

    // An exec runs and ends on its own.
    w.shim
        .exec(ExecRequest {
            id: "web".into(),
            exec_id: "e1".into(),
            stdio: StdioPaths::default(),
            spec: br#"{"args": ["/bin/true"], "cwd": "/"}"#.to_vec(),
        })
        .unwrap();
    w.shim.start("web", "e1").unwrap();
    assert_eq!(w.shim.wait("web", "e1").unwrap().status, 0);
    w.shim.delete("web", "e1").unwrap();

    w.shim.kill("web", "", 9, false).unwrap();
    assert_eq!(w.shim.wait("web", "").unwrap().status, KILLED);
    let (deleted_pid, exit) = w.shim.delete("web", "").unwrap();
    assert_eq!((deleted_pid, exit.status), (pid, KILLED));
    assert!(matches!(
        w.shim.state("web", ""),
        Err(ShimError::NoContainer(_))
    ));
    assert_eq!(
        w.events.topics(),
        [
            CREATE,
            START,
            "/tasks/paused",
            "/tasks/resumed",
            "/tasks/exec-added",
            "/tasks/exec-started",
            EXIT,
            EXIT,
            DELETE
        ]
    );
    assert!(
        !w.dir.path().join("bundles/web/chalk-shim.json").exists(),
        "the record goes"
    );
}

#[test]
fn an_exec_that_never_started_ends_at_delete() {
    let w = world();
    w.create("web").unwrap();
    w.shim.start("web", "").unwrap();
    w.shim
        .exec(ExecRequest {
            id: "web".into(),
            exec_id: "never".into(),
            stdio: StdioPaths::default(),
            spec: br#"{"args": ["/bin/true"], "cwd": "/"}"#.to_vec(),
        })
        .unwrap();
    let shim = w.shim.clone();
    let waiter = std::thread::spawn(move || shim.wait("web", "never").unwrap().status);
    std::thread::sleep(Duration::from_millis(200)); // the Wait is in
    let (_, exit) = w.shim.delete("web", "never").unwrap();
    assert_eq!(
        exit.status, 0,
        "as runc's shim says of an exec never started"
    );
    assert_eq!(waiter.join().unwrap(), 0, "its Wait returns");
    assert!(matches!(
        w.shim.kill("web", "never", 9, false),
        Err(ShimError::NoExec { .. })
    ));
    assert!(matches!(
        w.shim.exec(ExecRequest {
            id: "web".into(),
            exec_id: "../x".into(),
            stdio: StdioPaths::default(),
            spec: b"{}".to_vec(),
        }),
        Err(ShimError::Runtime(_))
    ));
}

#[test]
fn a_pod_containers_delete_leaves_its_pod_running() {
    let w = world();
    let pod = serde_json::json!({
        "io.kubernetes.cri.container-type": "sandbox",
        "io.kubernetes.cri.sandbox-id": "pod1",
    });
    let member = serde_json::json!({
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.sandbox-id": "pod1",
    });
    w.create_with("pod1", pod, "", Vec::new()).unwrap();
    assert!(w
        .create_with("early", member.clone(), "", Vec::new())
        .is_ok());
    w.shim.start("pod1", "").unwrap();
    w.shim.start("early", "").unwrap();
    w.shim.kill("early", "", 15, false).unwrap();
    wait_for_events(&w.events, EXIT, 1);
    assert_eq!(w.shim.wait("early", "").unwrap().status, 128 + 15);
    w.shim.delete("early", "").unwrap();
    assert_eq!(w.status("pod1"), Status::Running, "the pod goes on");
    // A pod's container is not checkpointed, paused or restored on its own.
    w.create_with("m2", member.clone(), "", Vec::new()).unwrap();
    assert!(matches!(
        w.shim.pause("m2"),
        Err(ShimError::FailedPrecondition(_))
    ));
    let want = CheckpointRequest::default();
    assert!(matches!(
        w.shim.checkpoint("m2", "/ck", want),
        Err(ShimError::FailedPrecondition(_))
    ));
    // A created member that never started: deleted with a SIGKILL's status, at once.
    let started = Instant::now();
    let (_, exit) = w.shim.delete("m2", "").unwrap();
    assert_eq!(exit.status, KILLED);
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[test]
fn a_kill_that_races_the_exit_reads_finished_and_the_exit_counts_once() {
    let w = world_with(|r| r.kill_races_exit = true);
    w.create("web").unwrap();
    w.shim.start("web", "").unwrap();
    let err = w.shim.kill("web", "", 9, false).unwrap_err();
    assert!(matches!(err, ShimError::Finished { .. }), "{err}");
    assert_eq!(w.shim.wait("web", "").unwrap().status, KILLED);
    assert!(matches!(
        w.shim.kill("web", "", 9, false),
        Err(ShimError::Finished { .. })
    ));
    w.shim.delete("web", "").unwrap();
    let exits = w.events.topics().iter().filter(|t| **t == EXIT).count();
    assert_eq!(exits, 1, "one TaskExit: {:?}", w.events.topics());
}

#[test]
fn an_execs_client_that_opens_its_output_only_after_the_exit_is_not_left_waiting() {
    use std::io::Read;
    let w = world();
    w.create("web").unwrap();
    w.shim.start("web", "").unwrap();
    let out = w.dir.path().join("e1-stdout");
    nix::unistd::mkfifo(&out, nix::sys::stat::Mode::from_bits(0o600).unwrap()).unwrap();
    w.shim
        .exec(ExecRequest {
            id: "web".into(),
            exec_id: "e1".into(),
            stdio: StdioPaths {
                stdout: out.display().to_string(),
                ..Default::default()
            },
            spec: br#"{"args": ["/bin/true"], "cwd": "/"}"#.to_vec(),
        })
        .unwrap();
    w.shim.start("web", "e1").unwrap();
    assert_eq!(w.shim.wait("web", "e1").unwrap().status, 0);
    // `ctr task exec` of a short command: its blocking open comes after the exit.
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let mut got = Vec::new();
        let read = std::fs::File::open(&out).and_then(|mut f| f.read_to_end(&mut got));
        let _ = tx.send(read.map(|_| got));
    });
    let got = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the client's open of its output fifo hung");
    assert!(got.unwrap().is_empty(), "end-of-file");
    w.shim.delete("web", "e1").unwrap();
}

#[test]
fn a_pod_remembers_the_containers_that_ran_to_completion() {
    let w = world();
    let pod = serde_json::json!({
        "io.kubernetes.cri.container-type": "sandbox",
        "io.kubernetes.cri.sandbox-id": "pod2",
    });
    let member = |name: &str| {
        serde_json::json!({
            "io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.sandbox-id": "pod2",
            "io.kubernetes.cri.container-name": name,
        })
    };
    w.create_with("pod2", pod, "", Vec::new()).unwrap();
    w.shim.start("pod2", "").unwrap();
    for (id, name) in [("init1", "setup"), ("bad1", "broken"), ("app1", "app")] {
        w.create_with(id, member(name), "", Vec::new()).unwrap();
        w.shim.start(id, "").unwrap();
    }
    // An init container completes; another fails; the app runs on.
    w.runtime.end("init1", 0);
    w.runtime.end("bad1", 1);
    wait_for_events(&w.events, EXIT, 2);
    assert_eq!(w.shim.wait("init1", "").unwrap().status, 0);
    let root = w.shim.container("pod2").unwrap();
    // What a snapshot of the pod records as completed, and a pod restored from it skips.
    assert_eq!(*root.completed_members.lock().unwrap(), ["setup"]);
}

#[test]
fn an_armed_pod_holds_its_containers_stop_until_the_agent_says() {
    let w = world();
    let pod = serde_json::json!({
        "io.kubernetes.cri.container-type": "sandbox",
        "io.kubernetes.cri.sandbox-id": "pod3",
    });
    let member = serde_json::json!({
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.sandbox-id": "pod3",
    });
    w.create_with("pod3", pod, "", Vec::new()).unwrap();
    w.create_with("app", member.clone(), "", Vec::new())
        .unwrap();
    w.create_with("side", member, "", Vec::new()).unwrap();
    for id in ["pod3", "app", "side"] {
        w.shim.start(id, "").unwrap();
    }
    let kills = || {
        w.runtime
            .state
            .lock()
            .unwrap()
            .calls
            .iter()
            .filter(|c| c.starts_with("kill "))
            .cloned()
            .collect::<Vec<_>>()
    };
    let say = |id: &str, v: &str| {
        let a = std::collections::HashMap::from([(chalk_labels::HOLD_STOP.to_string(), v.into())]);
        w.shim.update_task(id, &[], &a)
    };
    assert!(matches!(
        say("app", "arm"),
        Err(ShimError::FailedPrecondition(_))
    ));
    assert!(matches!(
        say("pod3", "later"),
        Err(ShimError::InvalidArgument(_))
    ));
    say("pod3", "arm").unwrap();
    // The kubelet's stop: SIGTERM to each container, answered and kept.
    w.shim.kill("app", "", 15, false).unwrap();
    w.shim.kill("side", "", 15, false).unwrap();
    assert_eq!(kills(), Vec::<String>::new());
    assert_eq!(w.status("app"), Status::Running);
    // The grace period ends for one of them: its SIGKILL goes through at once.
    w.shim.kill("side", "", 9, false).unwrap();
    assert_eq!(w.shim.wait("side", "").unwrap().status, KILLED);
    // Snapshotted: what is held is delivered as SIGKILL, and the pod is no longer armed.
    say("pod3", "kill").unwrap();
    assert_eq!(w.shim.wait("app", "").unwrap().status, KILLED);
    assert_eq!(kills().len(), 2, "{:?}", kills());
    assert!(kills().iter().all(|k| k.contains(" 9 ")), "{:?}", kills());
    w.shim.kill("pod3", "", 15, false).unwrap();
    assert_eq!(w.shim.wait("pod3", "").unwrap().status, 128 + 15);
}
