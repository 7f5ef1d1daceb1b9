//! chalk-web (the demo pages' server) against a private containerd: started on its own
//! fifo directory, its URL read from the line it prints once it listens.

use std::{
    io::{self, BufRead, BufReader, Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use crate::{
    containerd::{built_binary, IMAGE},
    Containerd,
};

/// Where chalk-web was built: `CHALK_WEB`, else next to this executable.
pub fn web_binary() -> io::Result<PathBuf> {
    built_binary("CHALK_WEB", "chalk-web")
}

pub struct Web {
    child: Child,
    pub url: String,
    /// Its state directory (where its fifos are; its labels name it); None once crashed.
    state: Option<tempfile::TempDir>,
    log: PathBuf,
    /// A stop on a signal ends chalk-web (a child in this process's group) first, then removes
    /// its state directory (crate::stop).
    _on_stop: crate::stop::Registration,
}

impl Web {
    /// Starts chalk-web on `listen` (port 0: any free one) for `c`'s namespace and image,
    /// with `extra` flags; waits (up to 30 s) until it serves.
    pub fn start(c: &Containerd, listen: &str, extra: &[&str]) -> io::Result<Self> {
        let state = tempfile::Builder::new()
            .prefix("chalk-web-")
            .tempdir_in("/run")
            .or_else(|_| tempfile::Builder::new().prefix("chalk-web-").tempdir())?;
        Self::start_in(c, listen, extra, state)
    }

    /// As [`Web::start`], on the state directory of an earlier server (see [`Web::crash`]).
    pub fn start_in(
        c: &Containerd,
        listen: &str,
        extra: &[&str],
        state: tempfile::TempDir,
    ) -> io::Result<Self> {
        let name = state
            .path()
            .file_name()
            .unwrap_or_default()
            .to_string_lossy();
        let log = c.dir().join(format!("{name}.log"));
        let mut child = Command::new(web_binary()?)
            .arg("--listen")
            .arg(listen)
            .arg("--address")
            .arg(c.socket())
            .arg("--namespace")
            .arg(&c.namespace)
            .arg("--config")
            .arg(c.options_path())
            .arg("--image")
            .arg(IMAGE)
            .arg("--state-dir")
            .arg(state.path().join("fifos"))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("chalk-web: serving ") {
                    let _ = tx.send(url.trim().to_string());
                }
            }
        });
        let url = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(io::Error::other(format!(
                    "chalk-web did not serve within 30 s: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                )));
            }
        };
        let state_dir = state.path().to_path_buf();
        let on_stop = crate::stop::on_stop("chalk-web's state directory", move || {
            let _ = std::fs::remove_dir_all(state_dir);
        });
        Ok(Web {
            child,
            url,
            state: Some(state),
            log,
            _on_stop: on_stop,
        })
    }

    /// The directory its terminals' fifos are made in.
    pub fn fifo_dir(&self) -> PathBuf {
        self.state
            .as_ref()
            .map_or_else(PathBuf::new, |s| s.path().join("fifos"))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Stops it as a service manager would (SIGTERM) and waits up to a minute for it to have
    /// removed its sandboxes and exited.
    pub fn stop(&mut self) -> io::Result<ExitStatus> {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                return Err(io::Error::other(
                    "chalk-web did not exit within 60 s of SIGTERM",
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills it as a crash would (SIGKILL): its sandboxes are left for the next server on
    /// the state directory returned.
    pub fn crash(mut self) -> tempfile::TempDir {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.state.take().expect("a state directory")
    }

    /// Blocks until it exits by itself (a Ctrl-C in the terminal reaches it too).
    pub fn wait(&mut self) -> io::Result<ExitStatus> {
        self.child.wait()
    }
}

impl Drop for Web {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.stop();
        }
    }
}

/// A client of the server's API as a page is: its cookie, same-origin requests.
pub struct Page {
    addr: String,
    pub cookie: String,
}

impl Page {
    /// A client holding `cookie`.
    pub fn at(url: &str, cookie: &str) -> Self {
        let addr = url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        Page {
            addr,
            cookie: cookie.to_string(),
        }
    }

    pub fn open(url: &str) -> Result<Self, String> {
        Self::open_path(url, "/split")
    }

    /// Opens the page at `path`, keeping the cookies it sets.
    pub fn open_path(url: &str, path: &str) -> Result<Self, String> {
        let mut page = Self::at(url, "");
        let (status, head, _) = page.request("GET", path, "")?;
        if status != 200 {
            return Err(format!("GET {path}: {status}"));
        }
        page.cookie = head
            .lines()
            .filter_map(|l| l.strip_prefix("set-cookie: "))
            .filter_map(|c| c.split(';').next())
            .collect::<Vec<_>>()
            .join("; ");
        Ok(page)
    }

    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        body: &str,
    ) -> Result<(u16, String, String), String> {
        let mut s = TcpStream::connect(&self.addr).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(120)))
            .map_err(|e| e.to_string())?;
        let req = format!(
            "{method} {path} HTTP/1.1\r\nhost: {}\r\ncookie: {}\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            self.addr,
            self.cookie,
            body.len()
        );
        s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
        let mut resp = String::new();
        s.read_to_string(&mut resp).map_err(|e| e.to_string())?;
        let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        Ok((status, head.to_ascii_lowercase(), body.to_string()))
    }

    pub fn post(&mut self, path: &str, want: u16) -> Result<serde_json::Value, String> {
        let (status, _, body) = self.request("POST", path, r#"{"cols":80,"rows":24}"#)?;
        if status != want {
            return Err(format!("POST {path}: {status} {body}"));
        }
        // A chunked body: the JSON object is between its first `{` and last `}`.
        let json = body
            .find('{')
            .zip(body.rfind('}'))
            .map_or("", |(a, b)| &body[a..=b]);
        serde_json::from_str(json).map_err(|e| format!("POST {path}: {e}: {body}"))
    }

    pub fn launch(&mut self) -> Result<String, String> {
        let made = self.post("/api/sandboxes", 201)?;
        made["id"]
            .as_str()
            .map(String::from)
            .ok_or_else(|| format!("launch answered {made}"))
    }
}
