//! The shim binary's lifecycle: `start` (spawn the daemon, one per pod or container),
//! `delete` (clean up after a shim that died), and serving the Task service.

use std::{path::Path, sync::Arc};

use chalk_runtime::{
    bundle::Record,
    runsc::{GlobalArgs, Runsc},
};
use containerd_shim::{
    api::DeleteResponse, publisher::RemotePublisher, util::write_address, Config, Error,
    ExitSignal, Flags, Shim, StartOpts,
};

use crate::{
    container::KILLED,
    containerd::Containerd,
    events::{timestamp, EventSender},
    reaper,
    runtimes::RunscRuntimes,
    sandbox::Sandboxes,
    task::TaskService,
};

pub struct Service {
    namespace: String,
    /// containerd's gRPC address (`-address`).
    address: String,
    id: String,
    bundle: String,
    exit: Arc<ExitSignal>,
    /// Snapshots still being sealed: the process waits for them before it exits.
    seals: Arc<crate::sandbox::Seals>,
}

/// The shim grouping key for a bundle: the pod's sandbox id if it has one, else the id.
pub fn grouping(bundle: &Path, id: &str) -> String {
    let spec: Option<serde_json::Value> = std::fs::read(bundle.join("config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    chalk_runtime::spec::sandbox_id_of(spec.as_ref(), id)
}

/// Whether a shim daemon answers on `address` (`unix://PATH`).
fn serving(address: &str) -> bool {
    let path = address.strip_prefix("unix://").unwrap_or(address);
    std::os::unix::net::UnixStream::connect(path).is_ok()
}

/// Moves the shim daemon into the cgroup the task options name (ShimCgroup) and makes it a
/// little more OOM-killable than containerd, as the runc shim does.
fn place_shim(pid: u32) -> containerd_shim::Result<()> {
    use std::io::Read;
    let mut stdin = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut stdin);
    if let Some(opts) =
        crate::runtime_options::start_options(&stdin).filter(|o| !o.shim_cgroup.is_empty())
    {
        containerd_shim::cgroup::add_task_to_cgroup(&opts.shim_cgroup, pid)?;
    }
    containerd_shim::cgroup::adjust_oom_score(pid)
}

impl Shim for Service {
    type T = TaskService;

    fn new(_runtime_id: &str, args: &Flags, _config: &mut Config) -> Self {
        // The crate hands SIGPIPE to its signal thread, which logs it, to containerd's log
        // fifo: with containerd gone, that write raises SIGPIPE again, for ever (a shim
        // spinning a core). A write to a closed pipe is an EPIPE error here, as with std.
        // SAFETY: setting a signal's disposition to ignore has no preconditions.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        Service {
            namespace: args.namespace.clone(),
            address: args.address.clone(),
            id: args.id.clone(),
            bundle: args.bundle.clone(),
            exit: Arc::new(ExitSignal::default()),
            seals: Default::default(),
        }
    }

    fn start_shim(&mut self, opts: StartOpts) -> containerd_shim::Result<String> {
        let cwd = std::env::current_dir().map_err(|e| Error::Other(format!("cwd: {e}")))?;
        let group = grouping(&cwd, &opts.id);
        // A pod's later containers join the shim its sandbox started. Spawning a daemon only
        // to see it exit (the crate's way) makes its SIGCHLD race this process's exit, where
        // the crate's signal handling can spin for ever; answer with the running one instead.
        let existing = containerd_shim::socket_address(&opts.address, &opts.namespace, &group);
        if group != opts.id && serving(&existing) {
            write_address(&existing)?;
            return Ok(existing);
        }
        let (pid, address) = containerd_shim::spawn(opts, &group, Vec::new())?;
        // The daemon goes into the cgroup containerd asks for (runc options' ShimCgroup, sent
        // on stdin) and is a little more OOM-killable than containerd, as with the runc shim.
        if let Err(e) = place_shim(pid) {
            log::warn!("shim {pid}: cgroup/OOM score not set: {e}");
        }
        write_address(&address)?;
        Ok(address)
    }

    fn delete_shim(&mut self) -> containerd_shim::Result<DeleteResponse> {
        reaper::start();
        let bundle = if self.bundle.is_empty() {
            std::env::current_dir().map_err(|e| Error::Other(format!("cwd: {e}")))?
        } else {
            self.bundle.clone().into()
        };
        match Record::read(&bundle) {
            Ok(Some(record)) => {
                let runsc = Runsc::new(
                    record.binary.clone(),
                    GlobalArgs {
                        root: record.root.clone(),
                        flags: record.flags.clone(),
                    },
                    &bundle,
                    Arc::new(reaper::ReaperSpawner),
                );
                if let Err(e) = runsc.delete(&self.id, true) {
                    // Already gone is the common case after a clean exit.
                    log::warn!("cleanup of {} in {}: {e}", self.id, self.namespace);
                }
                crate::rootfs::cleanup(&bundle, record.rootfs_mounted, record.netns.as_deref());
                // A shim that died mid-restore left containerd's unpacked copy of the
                // checkpoint (dropping it removes it, if it still is one of containerd's).
                drop(record.unpacked.as_deref().and_then(|d| {
                    crate::unpacked::UnpackedCheckpoint::of(
                        d,
                        &crate::unpacked::containerd_temp_dir(),
                    )
                }));
            }
            Ok(None) => {}
            Err(e) => log::warn!("cleanup of {}: {e}", self.id),
        }
        let mut resp = DeleteResponse::new();
        resp.exit_status = KILLED;
        resp.exited_at = Some(timestamp(std::time::SystemTime::now())).into();
        Ok(resp)
    }

    fn wait(&mut self) {
        self.exit.wait();
        self.seals.wait();
    }

    fn create_task_service(&self, publisher: RemotePublisher) -> TaskService {
        reaper::start();
        let events = EventSender::spawn(publisher, self.namespace.clone());
        let records = Containerd::new(&self.address, &self.namespace);
        TaskService(Sandboxes::new(
            &self.namespace,
            &self.address,
            Arc::new(RunscRuntimes),
            Arc::new(records),
            Arc::new(events),
            self.exit.clone(),
            self.seals.clone(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_pod_containers_by_sandbox_id() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(grouping(dir.path(), "c1"), "c1");
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"annotations":{"io.kubernetes.cri.sandbox-id":"pod1"}}"#,
        )
        .unwrap();
        assert_eq!(grouping(dir.path(), "c1"), "pod1");
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"annotations":{"io.kubernetes.cri.sandbox-id":"../x"}}"#,
        )
        .unwrap();
        assert_eq!(
            grouping(dir.path(), "c1"),
            "c1",
            "a bad id never names a socket"
        );
    }
}
