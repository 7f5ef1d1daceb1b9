//! A local image registry (distribution's `registry`, built by `scripts/peers`) serving
//! busybox-based stand-ins where the public registries cannot be reached.

use std::{
    fmt::Write as _,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// The registry's config: its store under `dir`, listening on `addr`, with the TLS key pair
/// `dir/srv.crt` and `dir/srv.key` when `tls`.
pub fn config(dir: &Path, addr: &str, tls: bool) -> String {
    let mut c = format!(
        "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
        dir.join("registry").display()
    );
    if tls {
        let _ = write!(
            c,
            "  tls:\n    certificate: {}\n    key: {}\n",
            dir.join("srv.crt").display(),
            dir.join("srv.key").display()
        );
    }
    c
}

/// A background process killed on drop.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Serves a plain-HTTP registry from `binary` on `addr`, its store under `dir`; returns once
/// it listens (an error if it does not within 10 s). It stops when the guard is dropped.
pub fn serve_plain(binary: &Path, dir: &Path, addr: &str) -> Result<Guard, String> {
    let file = dir.join("plain.yml");
    std::fs::write(&file, config(dir, addr, false)).map_err(|e| e.to_string())?;
    let guard = Guard(
        Command::new(binary)
            .arg("serve")
            .arg(&file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("start registry {}: {e}", binary.display()))?,
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(addr).is_err() {
        if Instant::now() > deadline {
            return Err(format!("registry did not listen on {addr}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(guard)
}
