//! containerd's Task service over ttrpc: each request decoded into a call on [`Sandboxes`],
//! each result into its reply. The only place that speaks ttrpc; errors become status codes
//! in `errors.rs`.

use std::path::PathBuf;

use chalk_runtime::state::Status;
use containerd_shim::{
    api::{
        CheckpointTaskRequest, CloseIORequest, ConnectRequest, ConnectResponse, CreateTaskRequest,
        CreateTaskResponse, DeleteRequest, DeleteResponse, Empty, ExecProcessRequest, KillRequest,
        PauseRequest, PidsRequest, PidsResponse, ResizePtyRequest, ResumeRequest, ShutdownRequest,
        StartRequest, StartResponse, StateRequest, StateResponse, StatsRequest, StatsResponse,
        UpdateTaskRequest, WaitRequest, WaitResponse,
    },
    protos::{
        protobuf::{well_known_types::any::Any, Message, MessageField},
        shim::oci::ProcessDetails,
        ttrpc::{self, TtrpcContext},
        types::task::{ProcessInfo, Status as ApiStatus},
    },
    Task,
};

use crate::{
    errors::{Result, ShimError},
    events::timestamp,
    io::StdioPaths,
    metrics,
    rootfs::RootfsMount,
    runtime_options,
    sandbox::{CreateRequest, ExecRequest, Sandboxes},
};

#[derive(Clone)]
pub struct TaskService(pub Sandboxes);

fn api_status(s: Status) -> ApiStatus {
    match s {
        Status::Created => ApiStatus::CREATED,
        Status::Running => ApiStatus::RUNNING,
        Status::Paused => ApiStatus::PAUSED,
        Status::Stopped => ApiStatus::STOPPED,
    }
}

fn rpc<T>(r: Result<T>) -> ttrpc::Result<T> {
    r.map_err(|e| {
        log::warn!("{e}");
        e.into()
    })
}

fn stdio(stdin: &str, stdout: &str, stderr: &str, terminal: bool) -> StdioPaths {
    StdioPaths {
        stdin: stdin.to_string(),
        stdout: stdout.to_string(),
        stderr: stderr.to_string(),
        terminal,
    }
}

fn create_request(req: &CreateTaskRequest) -> CreateRequest {
    CreateRequest {
        id: req.id.clone(),
        bundle: PathBuf::from(&req.bundle),
        rootfs: req
            .rootfs
            .iter()
            .map(|m| RootfsMount {
                kind: m.type_.clone(),
                source: m.source.clone(),
                target: m.target.clone(),
                options: m.options.clone(),
            })
            .collect(),
        stdio: stdio(&req.stdin, &req.stdout, &req.stderr, req.terminal),
        checkpoint: req.checkpoint.clone(),
        options: runtime_options::resolve(req.options.as_ref()),
    }
}

/// The pids of a container's processes, the exec'd ones with their exec id.
fn process_infos(pids: Vec<(u32, Option<String>)>) -> Result<Vec<ProcessInfo>> {
    pids.into_iter()
        .map(|(pid, exec_id)| {
            let mut info = ProcessInfo::new();
            info.pid = pid;
            if let Some(exec_id) = exec_id {
                let mut details = ProcessDetails::new();
                details.exec_id = exec_id;
                let mut any = Any::new();
                any.type_url = "containerd.runc.v1.ProcessDetails".into();
                any.value = details
                    .write_to_bytes()
                    .map_err(|e| ShimError::failed("encode process details", e))?;
                info.info = MessageField::some(any);
            }
            Ok(info)
        })
        .collect()
}

impl Task for TaskService {
    fn create(
        &self,
        _: &TtrpcContext,
        req: CreateTaskRequest,
    ) -> ttrpc::Result<CreateTaskResponse> {
        log::info!("create {}", req.id);
        rpc(self.0.create(create_request(&req)).map(|pid| {
            let mut resp = CreateTaskResponse::new();
            resp.pid = pid;
            resp
        }))
    }

    fn start(&self, _: &TtrpcContext, req: StartRequest) -> ttrpc::Result<StartResponse> {
        rpc(self.0.start(&req.id, &req.exec_id).map(|pid| {
            let mut resp = StartResponse::new();
            resp.pid = pid;
            resp
        }))
    }

    fn exec(&self, _: &TtrpcContext, req: ExecProcessRequest) -> ttrpc::Result<Empty> {
        let exec = ExecRequest {
            id: req.id.clone(),
            exec_id: req.exec_id.clone(),
            stdio: stdio(&req.stdin, &req.stdout, &req.stderr, req.terminal),
            spec: req
                .spec
                .as_ref()
                .map(|a| a.value.clone())
                .unwrap_or_default(),
        };
        rpc(self.0.exec(exec).map(|()| Empty::new()))
    }

    fn kill(&self, _: &TtrpcContext, req: KillRequest) -> ttrpc::Result<Empty> {
        rpc(self
            .0
            .kill(&req.id, &req.exec_id, req.signal, req.all)
            .map(|()| Empty::new()))
    }

    fn wait(&self, _: &TtrpcContext, req: WaitRequest) -> ttrpc::Result<WaitResponse> {
        rpc(self.0.wait(&req.id, &req.exec_id).map(|exit| {
            let mut resp = WaitResponse::new();
            resp.exit_status = exit.status;
            resp.exited_at = Some(timestamp(exit.at)).into();
            resp
        }))
    }

    fn state(&self, _: &TtrpcContext, req: StateRequest) -> ttrpc::Result<StateResponse> {
        rpc(self.0.state(&req.id, &req.exec_id).map(|p| {
            let mut resp = StateResponse::new();
            resp.id = if req.exec_id.is_empty() {
                req.id.clone()
            } else {
                req.exec_id.clone()
            };
            resp.exec_id = req.exec_id.clone();
            resp.bundle = p.bundle;
            resp.pid = p.pid;
            resp.status = api_status(p.status).into();
            resp.stdin = p.stdio.stdin;
            resp.stdout = p.stdio.stdout;
            resp.stderr = p.stdio.stderr;
            resp.terminal = p.stdio.terminal;
            if let Some(exit) = p.exit {
                resp.exit_status = exit.status;
                resp.exited_at = Some(timestamp(exit.at)).into();
            }
            resp
        }))
    }

    fn delete(&self, _: &TtrpcContext, req: DeleteRequest) -> ttrpc::Result<DeleteResponse> {
        rpc(self.0.delete(&req.id, &req.exec_id).map(|(pid, exit)| {
            let mut resp = DeleteResponse::new();
            resp.pid = pid;
            resp.exit_status = exit.status;
            resp.exited_at = Some(timestamp(exit.at)).into();
            resp
        }))
    }

    fn pids(&self, _: &TtrpcContext, req: PidsRequest) -> ttrpc::Result<PidsResponse> {
        rpc(self
            .0
            .pids(&req.id)
            .and_then(process_infos)
            .map(|processes| {
                let mut resp = PidsResponse::new();
                resp.processes = processes;
                resp
            }))
    }

    fn pause(&self, _: &TtrpcContext, req: PauseRequest) -> ttrpc::Result<Empty> {
        rpc(self.0.pause(&req.id).map(|()| Empty::new()))
    }

    fn resume(&self, _: &TtrpcContext, req: ResumeRequest) -> ttrpc::Result<Empty> {
        rpc(self.0.resume(&req.id).map(|()| Empty::new()))
    }

    fn stats(&self, _: &TtrpcContext, req: StatsRequest) -> ttrpc::Result<StatsResponse> {
        rpc(self.0.stats(&req.id).and_then(|stats| {
            let any =
                metrics::to_any(&stats).map_err(|e| ShimError::failed("encode metrics", e))?;
            let mut resp = StatsResponse::new();
            resp.stats = Some(any).into();
            Ok(resp)
        }))
    }

    fn update(&self, _: &TtrpcContext, req: UpdateTaskRequest) -> ttrpc::Result<Empty> {
        let resources = req
            .resources
            .as_ref()
            .map(|r| r.value.as_slice())
            .unwrap_or_default();
        rpc(self
            .0
            .update_task(&req.id, resources, &req.annotations)
            .map(|()| Empty::new()))
    }

    fn close_io(&self, _: &TtrpcContext, req: CloseIORequest) -> ttrpc::Result<Empty> {
        rpc(self
            .0
            .close_io(&req.id, &req.exec_id)
            .map(|()| Empty::new()))
    }

    fn resize_pty(&self, _: &TtrpcContext, req: ResizePtyRequest) -> ttrpc::Result<Empty> {
        rpc(self
            .0
            .resize_pty(&req.id, &req.exec_id, req.width, req.height)
            .map(|()| Empty::new()))
    }

    fn connect(&self, _: &TtrpcContext, req: ConnectRequest) -> ttrpc::Result<ConnectResponse> {
        let mut resp = ConnectResponse::new();
        resp.shim_pid = std::process::id();
        resp.version = env!("CARGO_PKG_VERSION").to_string();
        resp.task_pid = self.0.task_pid(&req.id).unwrap_or_default();
        Ok(resp)
    }

    fn shutdown(&self, _: &TtrpcContext, _: ShutdownRequest) -> ttrpc::Result<Empty> {
        self.0.shutdown();
        Ok(Empty::new())
    }

    fn checkpoint(&self, _: &TtrpcContext, req: CheckpointTaskRequest) -> ttrpc::Result<Empty> {
        rpc(runtime_options::checkpoint_options(req.options.as_ref())
            .and_then(|want| self.0.checkpoint(&req.id, &req.path, want))
            .map(|()| Empty::new()))
    }
}
