//! memfill (`integration/memfill/memfill.c`): a static program that holds a number of
//! megabytes of process memory with a known pattern, checks it page by page on SIGUSR1 and
//! rewrites it on SIGUSR2. The shared-memory tests and the bench run it in an image of its own.

use std::{
    io,
    path::{Path, PathBuf},
    process::Command,
};

use crate::Containerd;

/// The image holding busybox and `/bin/memfill`.
pub const MEMFILL_IMAGE: &str = "docker.io/chalk/memfill:test";

/// Compiles memfill (static, with the host's C compiler) into the target directory, once per
/// change of its source: the binary's path.
pub fn build() -> io::Result<PathBuf> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("memfill/memfill.c");
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/memfill");
    let newer = |a: &Path, b: &Path| -> bool {
        let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        matches!((modified(a), modified(b)), (Some(a), Some(b)) if a >= b)
    };
    if !newer(&out, &source) {
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let status = Command::new(&cc)
            .args(["-static", "-O2", "-Wall", "-o"])
            .arg(&out)
            .arg(&source)
            .status()?;
        if !status.success() {
            return Err(io::Error::other(format!(
                "{cc} could not build {} ({status}): a static C toolchain (Debian's gcc and \
                 libc6-dev) is needed",
                source.display()
            )));
        }
    }
    Ok(out)
}

/// Builds memfill and imports [`MEMFILL_IMAGE`] into `c`.
pub fn import(c: &Containerd) -> io::Result<()> {
    let binary = std::fs::read(build()?)?;
    c.import_with(MEMFILL_IMAGE, "memfill", &[("bin/memfill", 0o755, &binary)])
}

/// chalkctl's arguments that run memfill with `args` as sandbox `id` (no network).
pub fn run_args<'a>(id: &'a str, args: &[&'a str]) -> Vec<&'a str> {
    let mut run = vec![
        "run",
        "--net",
        "none",
        MEMFILL_IMAGE,
        id,
        "--",
        "/bin/memfill",
    ];
    run.extend_from_slice(args);
    run
}

/// The command that fills `mb` megabytes and waits.
pub fn command(mb: u64) -> Vec<String> {
    vec!["/bin/memfill".into(), mb.to_string()]
}

/// memfill holding `mb` MB, of which SIGUSR2 rewrites the first `change_mb`.
pub fn command_changing(mb: u64, change_mb: u64) -> Vec<String> {
    vec!["/bin/memfill".into(), mb.to_string(), change_mb.to_string()]
}

/// What `path` in a memfill sandbox holds once written, within `within`: `read` runs a shell
/// script in the sandbox and gives its output.
pub fn wait_written(
    read: impl Fn(&str) -> Result<String, String>,
    path: &str,
    within: std::time::Duration,
) -> Result<String, String> {
    let deadline = std::time::Instant::now() + within;
    loop {
        let got = read(&format!("cat {path} 2>/dev/null || true"))?;
        if !got.is_empty() {
            return Ok(got);
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("no {path} after {within:?}"));
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Sends memfill `signal` (USR1: check, USR2: rewrite) and waits for its answer at `path`.
pub fn ask(
    read: impl Fn(&str) -> Result<String, String>,
    signal: &str,
    path: &str,
    within: std::time::Duration,
) -> Result<String, String> {
    read(&format!("rm -f {path}; kill -{signal} 1"))?;
    wait_written(read, path, within)
}
