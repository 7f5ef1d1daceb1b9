//! Tasks and their processes: create, start, exec, signal, wait, checkpoint, delete.

use super::*;

impl Client {
    /// Tasks.Checkpoint with runc's `CheckpointOptions` (`exit` for suspend): the
    /// descriptors containerd stored (the checkpoint tar and the spec).
    /// Checkpoints task `id` (stopping it after, with `exit`) into `image_path`, a directory
    /// of the shim's choosing (containerd 2 then stores nothing; containerd 1.6 passes the
    /// option on but still stores what its own temporary directory holds: nothing), or else
    /// into containerd's content store.
    pub fn checkpoint(
        &self,
        id: &str,
        exit: bool,
        image_path: Option<&std::path::Path>,
    ) -> Result<Vec<Descriptor>> {
        // containerd.runc.v1.CheckpointOptions: bool exit = 1, string image_path = 8.
        let mut value = Vec::new();
        if exit {
            prost::encoding::bool::encode(1, &exit, &mut value);
        }
        if let Some(path) = image_path {
            prost::encoding::string::encode(8, &path.display().to_string(), &mut value);
        }
        let req = self.req(CheckpointTaskRequest {
            container_id: id.to_string(),
            parent_checkpoint: String::new(),
            options: Some(prost_types::Any {
                type_url: "containerd.runc.v1.CheckpointOptions".into(),
                value,
            }),
        });
        Ok(self
            .rt
            .block_on(TasksClient::new(self.channel.clone()).checkpoint(req))
            .map_err(|e| describe(&format!("checkpoint of {id}"), e))?
            .into_inner()
            .descriptors)
    }

    /// Creates the task of container `c` (from `checkpoint`, if given) and starts it: its pid.
    pub fn start_task(&self, c: &Container, checkpoint: Option<&Descriptor>) -> Result<u32> {
        // A sandbox whose init has a terminal keeps one (with no client attached, the shim
        // drains it): its processes were made on a terminal and go on expecting one.
        let terminal = spec_of(c)["process"]["terminal"].as_bool().unwrap_or(false);
        let io = Stdio {
            terminal,
            ..Default::default()
        };
        self.start_task_with(c, checkpoint, &io, None)
    }

    /// As [`Client::start_task`], with the task's stdio attached to `io`, and its terminal
    /// given `size` (columns, rows) between Create and Start: a restored shell's first
    /// prompt is then drawn for the window it is in.
    pub fn start_task_with(
        &self,
        c: &Container,
        checkpoint: Option<&Descriptor>,
        io: &Stdio,
        size: Option<(u32, u32)>,
    ) -> Result<u32> {
        let req = self.req(MountsRequest {
            snapshotter: c.snapshotter.clone(),
            key: c.snapshot_key.clone(),
        });
        let mounts = self
            .rt
            .block_on(SnapshotsClient::new(self.channel.clone()).mounts(req))
            .map_err(|e| describe(&format!("root filesystem of {}", c.id), e))?
            .into_inner()
            .mounts;
        let req = self.req(CreateTaskRequest {
            container_id: c.id.clone(),
            rootfs: mounts,
            checkpoint: checkpoint.cloned(),
            terminal: io.terminal,
            stdin: io.stdin.clone(),
            stdout: io.stdout.clone(),
            stderr: io.stderr.clone(),
            ..Default::default()
        });
        self.rt
            .block_on(TasksClient::new(self.channel.clone()).create(req))
            .map_err(|e| describe(&format!("create the task of {}", c.id), e))?;
        if let Some((cols, rows)) = size {
            self.resize_pty(&c.id, cols, rows)?;
        }
        let req = self.req(StartRequest {
            container_id: c.id.clone(),
            exec_id: String::new(),
        });
        self.rt
            .block_on(TasksClient::new(self.channel.clone()).start(req))
            .map(|r| r.into_inner().pid)
            .map_err(|e| describe(&format!("start {}", c.id), e))
    }

    /// Sets the window size of the terminal of sandbox `id`'s init.
    pub fn resize_pty(&self, id: &str, cols: u32, rows: u32) -> Result<()> {
        self.resize_process(id, "", cols, rows)
    }

    /// Sets the window size of the terminal of process `exec_id` of sandbox `id` (its init
    /// when empty).
    pub fn resize_process(&self, id: &str, exec_id: &str, cols: u32, rows: u32) -> Result<()> {
        let req = self.req(ResizePtyRequest {
            container_id: id.to_string(),
            exec_id: exec_id.to_string(),
            width: cols,
            height: rows,
        });
        self.rt
            .block_on(TasksClient::new(self.channel.clone()).resize_pty(req))
            .map(drop)
            .map_err(|e| describe(&format!("resize the terminal of {id}"), e))
    }

    /// Adds process `exec_id` to sandbox `id`, `process` its OCI process spec, on `io`.
    pub fn exec(
        &self,
        id: &str,
        exec_id: &str,
        process: &serde_json::Value,
        io: &Stdio,
    ) -> Result<()> {
        let req = self.req(ExecProcessRequest {
            container_id: id.to_string(),
            exec_id: exec_id.to_string(),
            stdin: io.stdin.clone(),
            stdout: io.stdout.clone(),
            stderr: io.stderr.clone(),
            terminal: io.terminal,
            spec: Some(prost_types::Any {
                type_url: "types.containerd.io/opencontainers/runtime-spec/1/Process".into(),
                value: serde_json::to_vec(process).map_err(|e| Error::from(e.to_string()))?,
            }),
        });
        self.rt
            .block_on(TasksClient::new(self.channel.clone()).exec(req))
            .map(drop)
            .map_err(|e| describe(&format!("exec in {id}"), e))
    }

    /// Starts process `exec_id` of sandbox `id`: its pid.
    pub fn start_process(&self, id: &str, exec_id: &str) -> Result<u32> {
        let req = self.req(StartRequest {
            container_id: id.to_string(),
            exec_id: exec_id.to_string(),
        });
        self.rt
            .block_on(TasksClient::new(self.channel.clone()).start(req))
            .map(|r| r.into_inner().pid)
            .map_err(|e| describe(&format!("start {exec_id} in {id}"), e))
    }

    /// Waits for process `exec_id` of sandbox `id` to exit: its exit status.
    pub fn wait_process(&self, id: &str, exec_id: &str) -> Result<u32> {
        let req = self.req(WaitRequest {
            container_id: id.to_string(),
            exec_id: exec_id.to_string(),
        });
        self.rt
            .block_on(TasksClient::new(self.channel.clone()).wait(req))
            .map(|r| r.into_inner().exit_status)
            .map_err(|e| describe(&format!("wait for {exec_id} in {id}"), e))
    }

    /// Sends `signal` to process `exec_id` of sandbox `id` (its init when empty; every
    /// process of the sandbox with `all`).
    pub fn kill(&self, id: &str, exec_id: &str, signal: i32, all: bool) -> Result<()> {
        let req = self.req(KillRequest {
            container_id: id.to_string(),
            exec_id: exec_id.to_string(),
            signal: signal as u32,
            all,
        });
        self.rt
            .block_on(TasksClient::new(self.channel.clone()).kill(req))
            .map(drop)
            .map_err(|e| describe(&format!("signal {signal} to {id}"), e))
    }

    /// Tells chalk-shim, through a task Update's annotation, to arm, release or kill the held
    /// stop signals of pod sandbox `id` (`chalk.io/hold-stop`: `arm`, `release`, `kill`).
    pub fn hold_stop(&self, id: &str, verdict: &str) -> Result<()> {
        let req = self.req(UpdateTaskRequest {
            container_id: id.to_string(),
            resources: None,
            annotations: HashMap::from([(chalk_labels::HOLD_STOP.to_string(), verdict.into())]),
        });
        self.rt
            .block_on(TasksClient::new(self.channel.clone()).update(req))
            .map(drop)
            .map_err(|e| describe(&format!("{} {verdict} of {id}", chalk_labels::HOLD_STOP), e))
    }

    /// Closes the stdin of process `exec_id` of sandbox `id`.
    pub fn close_stdin(&self, id: &str, exec_id: &str) -> Result<()> {
        let req = self.req(CloseIoRequest {
            container_id: id.to_string(),
            exec_id: exec_id.to_string(),
            stdin: true,
        });
        self.rt
            .block_on(TasksClient::new(self.channel.clone()).close_io(req))
            .map(drop)
            .map_err(|e| describe(&format!("close the stdin of {exec_id} in {id}"), e))
    }

    /// Removes exited process `exec_id` of sandbox `id`.
    pub fn delete_process(&self, id: &str, exec_id: &str) -> Result<()> {
        let req = self.req(DeleteProcessRequest {
            container_id: id.to_string(),
            exec_id: exec_id.to_string(),
        });
        self.rt
            .block_on(TasksClient::new(self.channel.clone()).delete_process(req))
            .map(drop)
            .map_err(|e| describe(&format!("remove {exec_id} of {id}"), e))
    }

    /// Waits for the init of sandbox `id` to exit: its exit status (None when it has no task).
    pub fn wait(&self, id: &str) -> Result<Option<u32>> {
        let req = self.req(WaitRequest {
            container_id: id.to_string(),
            exec_id: String::new(),
        });
        match self
            .rt
            .block_on(TasksClient::new(self.channel.clone()).wait(req))
        {
            Ok(r) => Ok(Some(r.into_inner().exit_status)),
            Err(e) if e.code() == Code::NotFound => Ok(None),
            Err(e) => Err(describe(&format!("wait for {id}"), e)),
        }
    }

    /// The task's status (`running`, `paused`, `created`, `stopped`) and pid; None without
    /// a task.
    pub fn task_status(&self, id: &str) -> Result<Option<(String, u32)>> {
        let req = self.req(GetTaskRequest {
            container_id: id.to_string(),
            exec_id: String::new(),
        });
        match self
            .rt
            .block_on(TasksClient::new(self.channel.clone()).get(req))
        {
            Ok(resp) => Ok(resp.into_inner().process.map(|p| {
                let status = containerd_client::types::v1::Status::try_from(p.status)
                    .map_or("unknown".to_string(), |s| s.as_str_name().to_lowercase());
                (status, p.pid)
            })),
            Err(e) if e.code() == Code::NotFound => Ok(None),
            Err(e) => Err(describe(&format!("task of {id}"), e)),
        }
    }

    pub fn delete_task(&self, id: &str) {
        let _ = self.try_delete_task(id);
    }

    /// Ends a task that may be running (SIGKILL to all its processes), then deletes it:
    /// undoing a fork that got part of the way. Tried for up to 30 s (containerd may be
    /// restarting, or the task still starting): whether the task is gone. A container whose
    /// task could not be removed must be kept (containerd would delete its record and leave
    /// the task running with no container).
    pub fn kill_and_delete_task(&self, id: &str) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            if self.try_delete_task(id).is_ok() || matches!(self.task_status(id), Ok(None)) {
                return true;
            }
            let req = self.req(KillRequest {
                container_id: id.to_string(),
                signal: libc::SIGKILL as u32,
                all: true,
                ..Default::default()
            });
            let _ = self
                .rt
                .block_on(TasksClient::new(self.channel.clone()).kill(req));
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    fn try_delete_task(&self, id: &str) -> std::result::Result<(), Status> {
        let req = self.req(DeleteTaskRequest {
            container_id: id.to_string(),
        });
        self.rt
            .block_on(TasksClient::new(self.channel.clone()).delete(req))
            .map(drop)
    }

    /// Deletes the task of a sandbox that has just stopped, waiting (up to 10 s) for
    /// containerd to have taken in its exit: until then it refuses to delete a running task.
    pub fn delete_stopped_task(&self, id: &str) -> Result<()> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match self.try_delete_task(id) {
                Ok(()) => return Ok(()),
                Err(e) if e.code() == Code::NotFound => return Ok(()),
                Err(e) if std::time::Instant::now() >= deadline => {
                    return Err(describe(&format!("delete the stopped task of {id}"), e))
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(100)),
            }
        }
    }
}
