//! A sandbox's terminal as the server holds it: two fifos in a root-only directory of their
//! own (the task's stdin and stdout; with a TTY stdout carries both streams), each opened
//! read-write so that neither end ever reads as closed while the shim reopens them (a
//! restore does), and the pump that reads what the sandbox prints.

use std::{
    io,
    os::unix::fs::{DirBuilderExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::Arc,
};

use chalk_client::containerd::Stdio;
use tokio::net::unix::pipe;

/// The fifos of one task; removed with their directory when dropped.
pub struct Fifos {
    dir: PathBuf,
}

fn mkfifo(path: &Path) -> io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: mkfifo on a valid C string.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Fifos {
    /// Makes `root/name/{in,out}` (`root` made 0700 if need be).
    pub fn make(root: &Path, name: &str) -> io::Result<Self> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(root)?;
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700))?;
        let dir = root.join(name);
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let fifos = Fifos { dir };
        mkfifo(&fifos.stdin())?;
        mkfifo(&fifos.stdout())?;
        Ok(fifos)
    }

    fn stdin(&self) -> PathBuf {
        self.dir.join("in")
    }

    fn stdout(&self) -> PathBuf {
        self.dir.join("out")
    }

    /// What the task is created with.
    pub fn stdio(&self) -> Stdio {
        Stdio {
            stdin: self.stdin().display().to_string(),
            stdout: self.stdout().display().to_string(),
            stderr: String::new(),
            terminal: true,
        }
    }
}

impl Drop for Fifos {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The server's ends of a task's fifos, open before the task is created.
pub struct Ends {
    pub fifos: Fifos,
    pub input: Arc<pipe::Sender>,
    pub output: pipe::Receiver,
}

impl Ends {
    /// Opens both fifos read-write (in a tokio context: they are registered with its reactor).
    pub fn open(fifos: Fifos) -> io::Result<Self> {
        let output = pipe::OpenOptions::new()
            .read_write(true)
            .open_receiver(fifos.stdout())?;
        let input = pipe::OpenOptions::new()
            .read_write(true)
            .open_sender(fifos.stdin())?;
        Ok(Ends {
            fifos,
            input: Arc::new(input),
            output,
        })
    }
}

/// Writes all of `data` to the sandbox's input.
pub async fn write_all(input: &pipe::Sender, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        input.writable().await?;
        match input.try_write(data) {
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads the sandbox's output until the fifo fails, handing each chunk to `sink`.
pub async fn pump(output: pipe::Receiver, mut sink: impl FnMut(&[u8])) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if output.readable().await.is_err() {
            return;
        }
        match output.try_read(&mut buf) {
            Ok(0) => return,
            Ok(n) => sink(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bytes_written_to_the_input_fifo_come_out_of_it() {
        let root = tempfile::tempdir().unwrap();
        let fifos = Fifos::make(&root.path().join("t"), "a").unwrap();
        let dir = root.path().join("t/a");
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let ends = Ends::open(fifos).unwrap();
        // Stand in for the sandbox: read what the server writes to its input.
        let reader = pipe::OpenOptions::new()
            .read_write(true)
            .open_receiver(dir.join("in"))
            .unwrap();
        write_all(&ends.input, b"echo hi\n").await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(pump(reader, move |b| {
            let _ = tx.send(b.to_vec());
        }));
        assert_eq!(rx.recv().await.unwrap(), b"echo hi\n");
        task.abort();
        drop(ends);
        assert!(!dir.exists(), "the fifos' directory is removed with them");
    }
}
