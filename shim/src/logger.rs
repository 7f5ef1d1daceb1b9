//! `binary://` stdio: containerd's logging-binary protocol (what nerdctl uses for
//! `run -d`). The shim starts the binary with the process's stdout and stderr on pipes at
//! fds 3 and 4 and a readiness pipe at fd 5, with CONTAINER_ID and CONTAINER_NAMESPACE set,
//! and waits until the binary closes (or writes to) fd 5. The sandbox then writes into the
//! pipes itself; the binary sees EOF when the process is gone.

use std::{
    fs::File,
    io::{self, Read},
    os::{fd::AsRawFd, unix::process::CommandExt},
    path::PathBuf,
    process::{Command, Stdio},
};

use chalk_runtime::runsc::Spawner;
use nix::fcntl::OFlag;

use crate::reaper::ReaperSpawner;

/// A parsed `binary:///path?key=value&flag` URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggerSpec {
    pub path: PathBuf,
    pub args: Vec<String>,
}

/// Parses a `binary://` URI: the path, then each query key followed by its value if any
/// (the order containerd's runc shim passes them in).
pub fn parse(uri: &str) -> io::Result<LoggerSpec> {
    let bad = |why: String| io::Error::new(io::ErrorKind::InvalidInput, why);
    let url = url::Url::parse(uri).map_err(|e| bad(format!("stdio uri {uri:?}: {e}")))?;
    let path = url
        .to_file_path()
        .map_err(|()| bad(format!("stdio uri {uri:?} names no absolute binary path")))?;
    let mut args = Vec::new();
    for (key, value) in url.query_pairs() {
        args.push(key.into_owned());
        if !value.is_empty() {
            args.push(value.into_owned());
        }
    }
    Ok(LoggerSpec { path, args })
}

/// Who the logged process is, as the logging binary is told.
#[derive(Debug, Clone, Default)]
pub struct LogContext {
    pub container_id: String,
    pub namespace: String,
}

/// Starts the logging binary; returns the write ends for the process's stdout and stderr.
pub fn start(spec: &LoggerSpec, ctx: &LogContext) -> io::Result<(File, File)> {
    let pipe = || -> io::Result<(File, File)> {
        let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        Ok((File::from(r), File::from(w)))
    };
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let (mut ready_r, ready_w) = pipe()?;
    let sources = [out_r.as_raw_fd(), err_r.as_raw_fd(), ready_w.as_raw_fd()];

    let mut cmd = Command::new(&spec.path);
    cmd.args(&spec.args)
        .env("CONTAINER_ID", &ctx.container_id)
        .env("CONTAINER_NAMESPACE", &ctx.namespace)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: only fcntl and dup2 (async-signal-safe) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            // Move the sources above 5 first, so placing one cannot clobber another.
            let mut high = [0; 3];
            for (i, fd) in sources.iter().enumerate() {
                high[i] = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 10);
                if high[i] < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            for (i, fd) in high.iter().enumerate() {
                if libc::dup2(*fd, 3 + i as i32) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = ReaperSpawner.spawn(&mut cmd).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("start logging binary {}: {e}", spec.path.display()),
        )
    })?;
    drop((out_r, err_r, ready_w));
    // Ready when it writes a byte or closes fd 5 (also when it dies: its exit is logged).
    let mut byte = [0u8; 1];
    let _ = ready_r.read(&mut byte);
    let path = spec.path.clone();
    std::thread::spawn(move || match child.wait() {
        Ok(0) => {}
        Ok(status) => log::warn!("logging binary {} exited with {status}", path.display()),
        Err(e) => log::warn!("logging binary {}: {e}", path.display()),
    });
    Ok((out_w, err_w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nerdctl_style_uris() {
        let spec = parse("binary:///usr/local/bin/nerdctl?_NERDCTL_INTERNAL_LOGGING=%2Fvar%2Flib%2Fnerdctl%2F1935db59").unwrap();
        assert_eq!(spec.path, PathBuf::from("/usr/local/bin/nerdctl"));
        assert_eq!(
            spec.args,
            vec!["_NERDCTL_INTERNAL_LOGGING", "/var/lib/nerdctl/1935db59"]
        );
        let spec = parse("binary:///opt/log%20driver?flag&k=v").unwrap();
        assert_eq!(spec.path, PathBuf::from("/opt/log driver"));
        assert_eq!(spec.args, vec!["flag", "k", "v"]);
        assert!(parse("binary://relative").is_err());
    }
}
