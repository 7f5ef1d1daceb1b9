//! A terminal client of containerd's task API, as a program attaching a person's terminal
//! would be: the init of a container gets a TTY on stdio fifos this client owns (read as
//! containerd's own `cio` reads them, so an output cut shows as end-of-file), with input
//! written, window sizes sent, and everything the sandbox printed kept for the test to read.

use std::{
    fs::{File, OpenOptions},
    io::{Read, Write},
    os::unix::fs::OpenOptionsExt,
    path::Path,
    sync::{Arc, Condvar, Mutex},
    time::{Duration, Instant},
};

use containerd_client::{
    services::v1::{
        tasks_client::TasksClient, CreateTaskRequest, DeleteTaskRequest, KillRequest,
        ResizePtyRequest, StartRequest,
    },
    tonic::{transport::Channel, Request},
    types::Descriptor,
    with_namespace,
};

/// What the terminal printed, and whether its output ended (end-of-file on the fifo).
#[derive(Default)]
struct Screen {
    bytes: Vec<u8>,
    ended: bool,
}

/// One task's terminal, attached through fifos in a directory of its own.
pub struct TtyTask {
    rt: tokio::runtime::Runtime,
    channel: Channel,
    namespace: String,
    pub id: String,
    _dir: tempfile::TempDir,
    stdin: File,
    screen: Arc<(Mutex<Screen>, Condvar)>,
    pub pid: u32,
}

fn fifo(path: &Path) -> Result<(), String> {
    let c =
        std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: mkfifo with a valid C string.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        return Err(format!(
            "mkfifo {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

impl TtyTask {
    /// Creates and starts the task of existing container `id` (made with a terminal in its
    /// spec), from `checkpoint` when given (a fork or resume); with `size` (`cols`, `rows`)
    /// sent by ResizePty before Start, as a terminal client does once the task exists.
    pub fn start(
        socket: &Path,
        namespace: &str,
        id: &str,
        checkpoint: Option<&Descriptor>,
        size: Option<(u32, u32)>,
    ) -> Result<Self, String> {
        let (rt, channel) = crate::api::grpc_channel(socket)?;
        let dir = tempfile::Builder::new()
            .prefix("chalk-tty-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let (stdin_path, stdout_path) = (dir.path().join("in"), dir.path().join("out"));
        fifo(&stdin_path)?;
        fifo(&stdout_path)?;
        // As containerd's cio: the output fifo opened for reading without waiting for a
        // writer, the input fifo held open for writing (by a reader opened first).
        let stdout = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&stdout_path)
            .map_err(|e| e.to_string())?;
        let _stdin_reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&stdin_path)
            .map_err(|e| e.to_string())?;
        let stdin = OpenOptions::new()
            .write(true)
            .open(&stdin_path)
            .map_err(|e| e.to_string())?;
        let screen = Arc::new((Mutex::new(Screen::default()), Condvar::new()));
        spawn_reader(stdout, screen.clone())?;

        let rootfs = crate::api::rootfs_mounts(&rt, &channel, namespace, id)?;
        let req = CreateTaskRequest {
            container_id: id.to_string(),
            rootfs,
            stdin: stdin_path.display().to_string(),
            stdout: stdout_path.display().to_string(),
            terminal: true,
            checkpoint: checkpoint.cloned(),
            ..Default::default()
        };
        let tasks = TasksClient::new(channel.clone());
        rt.block_on(tasks.clone().create(with_namespace!(req, namespace)))
            .map_err(|e| format!("create the task of {id}: {}", e.message()))?;
        let mut task = TtyTask {
            rt,
            channel,
            namespace: namespace.to_string(),
            id: id.to_string(),
            _dir: dir,
            stdin,
            screen,
            pid: 0,
        };
        if let Some((cols, rows)) = size {
            task.resize(cols, rows)?;
        }
        let req = StartRequest {
            container_id: id.to_string(),
            exec_id: String::new(),
        };
        task.pid = task
            .rt
            .block_on(tasks.clone().start(with_namespace!(req, task.namespace)))
            .map_err(|e| format!("start {id}: {}", e.message()))?
            .into_inner()
            .pid;
        Ok(task)
    }

    fn tasks(&self) -> TasksClient<Channel> {
        TasksClient::new(self.channel.clone())
    }

    /// Types `bytes` into the terminal.
    pub fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.stdin.write_all(bytes).map_err(|e| e.to_string())
    }

    /// Tasks.ResizePty of the init.
    pub fn resize(&self, cols: u32, rows: u32) -> Result<(), String> {
        let req = ResizePtyRequest {
            container_id: self.id.clone(),
            exec_id: String::new(),
            width: cols,
            height: rows,
        };
        self.rt
            .block_on(
                self.tasks()
                    .resize_pty(with_namespace!(req, self.namespace)),
            )
            .map(drop)
            .map_err(|e| e.message().to_string())
    }

    /// Everything the terminal printed so far, as text.
    pub fn output(&self) -> String {
        String::from_utf8_lossy(&self.screen.0.lock().unwrap().bytes).into_owned()
    }

    /// Whether the output fifo reached end-of-file (nothing more can arrive).
    pub fn output_ended(&self) -> bool {
        self.screen.0.lock().unwrap().ended
    }

    /// Waits until the output since byte `from` contains `text`; the time it took.
    pub fn wait_for(&self, from: usize, text: &str, timeout: Duration) -> Result<Duration, String> {
        let started = Instant::now();
        let (lock, cond) = &*self.screen;
        let mut screen = lock.lock().unwrap();
        loop {
            let seen = String::from_utf8_lossy(screen.bytes.get(from..).unwrap_or_default());
            if seen.contains(text) {
                return Ok(started.elapsed());
            }
            let left = timeout.saturating_sub(started.elapsed());
            if left.is_zero() || screen.ended {
                return Err(format!(
                    "{:?} did not appear on the terminal of {} within {timeout:?}{}; it shows {seen:?}",
                    text,
                    self.id,
                    if screen.ended { " (its output ended)" } else { "" }
                ));
            }
            screen = cond.wait_timeout(screen, left).unwrap().0;
        }
    }

    /// The length of the output so far: a mark for [`TtyTask::wait_for`].
    pub fn mark(&self) -> usize {
        self.screen.0.lock().unwrap().bytes.len()
    }

    /// SIGKILLs the task and deletes it (best effort); the container stays.
    pub fn kill_and_delete(&self) {
        let req = KillRequest {
            container_id: self.id.clone(),
            signal: libc::SIGKILL as u32,
            all: true,
            ..Default::default()
        };
        let _ = self
            .rt
            .block_on(self.tasks().kill(with_namespace!(req, self.namespace)));
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let req = DeleteTaskRequest {
                container_id: self.id.clone(),
            };
            let deleted = self
                .rt
                .block_on(self.tasks().delete(with_namespace!(req, self.namespace)));
            match deleted {
                Ok(_) => return,
                Err(e) if e.code() == containerd_client::tonic::Code::NotFound => return,
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
}

/// Copies the output fifo into `screen` until end-of-file.
fn spawn_reader(stdout: File, screen: Arc<(Mutex<Screen>, Condvar)>) -> Result<(), String> {
    // Blocking reads from here on: a read of 0 bytes is then a real end-of-file.
    // SAFETY: fcntl on an fd this File owns.
    unsafe {
        use std::os::fd::AsRawFd;
        let fd = stdout.as_raw_fd();
        let flags = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
    }
    std::thread::Builder::new()
        .name("tty-reader".into())
        .spawn(move || {
            let mut stdout = stdout;
            let mut buf = [0u8; 8192];
            // Before containerd opens its end, a read returns 0 at once: wait for a writer.
            let mut seen_writer = false;
            loop {
                match stdout.read(&mut buf) {
                    Ok(0) if !seen_writer => std::thread::sleep(Duration::from_millis(20)),
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        seen_writer = true;
                        let (lock, cond) = &*screen;
                        lock.lock().unwrap().bytes.extend_from_slice(&buf[..n]);
                        cond.notify_all();
                    }
                }
            }
            let (lock, cond) = &*screen;
            lock.lock().unwrap().ended = true;
            cond.notify_all();
        })
        .map(drop)
        .map_err(|e| e.to_string())
}
