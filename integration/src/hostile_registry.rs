//! A hostile registry for the tests: a real Distribution registry (plain HTTP, on loopback)
//! behind a proxy of the test's own that tells the lies a stranger's registry could. Every
//! request it does not lie about reaches the real registry and its answer comes back as it
//! was sent (each on a connection of its own, `Connection: close`).

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

/// What the proxy lies about.
#[derive(Debug, Clone)]
pub enum Lie {
    /// A GET of one of these blobs gets its headers (a length of a gigabyte), then a byte
    /// every two seconds, never the end.
    TrickleBlobs(Vec<String>),
    /// A GET of any manifest gets an answer of this many bytes, with no length said, that
    /// goes on past any sane size.
    HugeManifest(usize),
}

/// The proxy: its address, and the lie it tells. Stops when dropped.
pub struct HostileRegistry {
    pub addr: String,
    stop: Arc<AtomicBool>,
}

impl HostileRegistry {
    /// Listens on a free loopback port, in front of the registry at `backend` (`host:port`).
    pub fn start(backend: &str, lie: Lie) -> std::io::Result<HostileRegistry> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?.to_string();
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (stopped, backend) = (stop.clone(), backend.to_string());
        std::thread::spawn(move || {
            while !stopped.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let (lie, backend, stopped) =
                            (lie.clone(), backend.clone(), stopped.clone());
                        std::thread::spawn(move || {
                            let _ = serve(client, &backend, &lie, &stopped);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Ok(HostileRegistry { addr, stop })
    }
}

impl Drop for HostileRegistry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Reads an HTTP head (up to the blank line) from `s`: the head, and what came after it.
fn read_head(s: &mut TcpStream) -> std::io::Result<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok((String::from_utf8_lossy(&buf).into_owned(), rest));
        }
        if buf.len() > 64 << 10 {
            return Err(std::io::Error::other("head too long"));
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::Error::other("closed before a head"));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The head with its `Connection` header replaced by `Connection: close`.
fn closing(head: &str) -> String {
    let mut out: Vec<&str> = head
        .trim_end()
        .lines()
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
        .collect();
    out.push("Connection: close");
    format!("{}\r\n\r\n", out.join("\r\n"))
}

fn content_length(head: &str) -> usize {
    head.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0)
}

fn serve(
    mut client: TcpStream,
    backend: &str,
    lie: &Lie,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    client.set_nonblocking(false)?;
    let (head, mut body) = read_head(&mut client)?;
    let line = head.lines().next().unwrap_or_default().to_string();
    let mut words = line.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    match lie {
        Lie::TrickleBlobs(digests)
            if method == "GET"
                && path.contains("/blobs/")
                && digests.iter().any(|d| path.ends_with(d.as_str())) =>
        {
            client.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\
                  Content-Length: 1073741824\r\n\r\n",
            )?;
            while !stop.load(Ordering::SeqCst) {
                client.write_all(b"\0")?;
                std::thread::sleep(Duration::from_secs(2));
            }
            return Ok(());
        }
        Lie::HugeManifest(size) if method == "GET" && path.contains("/manifests/") => {
            client.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\n\
                  Connection: close\r\n\r\n{\"schemaVersion\":2,\"annotations\":{\"pad\":\"",
            )?;
            let pad = vec![b'a'; 64 << 10];
            let mut sent = 0;
            while sent < *size && !stop.load(Ordering::SeqCst) {
                client.write_all(&pad)?;
                sent += pad.len();
            }
            return Ok(());
        }
        _ => {}
    }
    // The truth: the request to the real registry, its answer back.
    let mut upstream = TcpStream::connect(backend)?;
    upstream.write_all(closing(&head).as_bytes())?;
    let want = content_length(&head);
    while body.len() < want {
        let mut chunk = vec![0u8; (want - body.len()).min(1 << 20)];
        let n = client.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    upstream.write_all(&body)?;
    let (answer, rest) = read_head(&mut upstream)?;
    client.write_all(closing(&answer).as_bytes())?;
    client.write_all(&rest)?;
    std::io::copy(&mut upstream, &mut client)?;
    Ok(())
}
