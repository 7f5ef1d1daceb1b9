//! Checkpoint and restore on fakes: a failing checkpoint, hooks while a restore runs, exits
//! during a checkpoint, and requests that wait on a busy sandbox.

use super::fakes::*;

#[test]
fn a_failing_checkpoint_leaves_the_source_running_and_the_directory_empty() {
    let w = world_with(|r| r.fail_checkpoint = true);
    w.create("web").unwrap();
    w.shim.start("web", "").unwrap();
    let dir = w.dir.path().join("ck");
    let err = w
        .shim
        .checkpoint(
            "web",
            &dir.display().to_string(),
            CheckpointRequest::default(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("no space left on device"), "{err}");
    assert_eq!(w.status("web"), Status::Running);
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "nothing left in it"
    );
    assert!(!w.events.topics().contains(&"/tasks/checkpointed"));
    // A non-empty directory is refused before anything is touched.
    std::fs::write(dir.join("mine"), b"x").unwrap();
    let err = w
        .shim
        .checkpoint(
            "web",
            &dir.display().to_string(),
            CheckpointRequest::default(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("not empty"), "{err}");
    let checkpoints = w
        .runtime
        .state
        .lock()
        .unwrap()
        .calls
        .iter()
        .filter(|c| c.starts_with("checkpoint"))
        .count();
    assert_eq!(checkpoints, 1);
}

#[test]
fn state_and_kill_answer_while_a_restore_runs_its_post_restore_hook() {
    let w = world_with(|r| r.exec_takes = Duration::from_millis(1500));
    w.create("src").unwrap();
    w.shim.start("src", "").unwrap();
    let dir = w.dir.path().join("ck");
    w.shim
        .checkpoint(
            "src",
            &dir.display().to_string(),
            CheckpointRequest::default(),
        )
        .unwrap();
    assert!(dir.join("chalk.manifest.json").exists(), "sealed");
    let hook = HookSpec {
        stage: Stage::PostRestore,
        command: vec!["/bin/sleep".into(), "1".into()],
        place: Place::Sandbox,
        timeout_secs: 30,
    };
    w.create_with(
        "fork",
        serde_json::json!({}),
        &dir.display().to_string(),
        vec![hook],
    )
    .unwrap();
    let shim = w.shim.clone();
    let started = Instant::now();
    let start = std::thread::spawn(move || shim.start("fork", ""));
    std::thread::sleep(Duration::from_millis(300));
    let asked = Instant::now();
    let state = w.shim.state("fork", "").unwrap();
    assert!(
        asked.elapsed() < Duration::from_millis(200),
        "State waited for the hook"
    );
    assert!(
        state.pid > 0,
        "the restored sandbox's pid is known: {state:?}"
    );
    assert!(start.join().unwrap().is_ok());
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "Start waited for its hook"
    );
    assert_eq!(w.status("fork"), Status::Running);
    // Its exit comes after its TaskStart.
    w.shim.kill("fork", "", 9, false).unwrap();
    wait_for_events(&w.events, EXIT, 1);
    let topics = w.events.topics();
    let last_start = topics.iter().rposition(|t| *t == START).unwrap();
    let exit = topics.iter().rposition(|t| *t == EXIT).unwrap();
    assert!(last_start < exit, "{topics:?}");
}

#[test]
fn an_exit_during_a_checkpoint_is_reported_after_it() {
    // The source dies while its checkpoint runs: reported once the checkpoint ends.
    let w = world();
    w.create("web").unwrap();
    w.shim.start("web", "").unwrap();
    let c = w.shim.container("web").unwrap();
    c.state.lock().unwrap().init.busy = Some(crate::container::Busy::Checkpointing);
    w.runtime.end("web", 137);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(w.status("web"), Status::Running, "not while busy");
    let mut st = c.state.lock().unwrap();
    w.shim.finish_busy(&c, &mut st);
    drop(st);
    assert_eq!(w.status("web"), Status::Stopped);
    assert_eq!(w.shim.wait("web", "").unwrap().status, 137);
}

#[test]
fn requests_waiting_on_a_busy_sandbox_are_bounded_and_named() {
    use crate::container::{Busy, MAX_WAITING};
    let w = std::sync::Arc::new(world());
    w.create("web").unwrap();
    w.shim.start("web", "").unwrap();
    let c = w.shim.container("web").unwrap();
    c.state.lock().unwrap().init.busy = Some(Busy::Checkpointing);
    let waiters: Vec<_> = (0..MAX_WAITING)
        .map(|_| {
            let w = w.clone();
            std::thread::spawn(move || w.shim.pause("web"))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.state.lock().unwrap().waiting < MAX_WAITING {
        assert!(Instant::now() < deadline, "the waiters never queued");
        std::thread::sleep(Duration::from_millis(10));
    }
    let refused = w.shim.pause("web").unwrap_err();
    assert_eq!(
        refused.code(),
        containerd_shim::protos::ttrpc::Code::RESOURCE_EXHAUSTED
    );
    let said = refused.to_string();
    assert!(
        said.contains("16") && said.contains("checkpoint") && said.contains("try again"),
        "{said}"
    );
    let mut st = c.state.lock().unwrap();
    w.shim.finish_busy(&c, &mut st);
    drop(st);
    let outcomes: Vec<_> = waiters.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(
        outcomes.iter().filter(|r| r.is_ok()).count(),
        1,
        "one pauses"
    );
    assert_eq!(c.state.lock().unwrap().waiting, 0);
}
