//! A process's stdio without a terminal: stdin's ends, and the output fifos' hand-over to
//! containerd's client around the process's exit.

use std::{
    fs::{File, OpenOptions},
    io::{Read, Write},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    sync::mpsc::Receiver,
    time::{Duration, Instant},
};

use super::*;

fn fifo(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits(0o600).unwrap()).unwrap();
    p
}

/// containerd's client on output fifo `path`: a blocking open (which returns only once the
/// fifo has a writer), then everything up to end-of-file.
fn client(path: &Path) -> Receiver<std::io::Result<Vec<u8>>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        let mut got = Vec::new();
        let read = File::open(&path).and_then(|mut f| f.read_to_end(&mut got));
        let _ = tx.send(read.map(|_| got));
    });
    rx
}

/// How many of this process's fds are on `path`.
fn fds_on(path: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target == path)
        .count()
}

fn outputs(o: &Path, e: Option<&Path>) -> StdioPaths {
    StdioPaths {
        stdout: o.display().to_string(),
        stderr: e.map(|e| e.display().to_string()).unwrap_or_default(),
        ..Default::default()
    }
}

#[test]
fn close_io_does_not_wait_for_a_process_that_never_reads() {
    let dir = tempfile::tempdir().unwrap();
    let i = dir.path().join("in");
    nix::unistd::mkfifo(&i, nix::sys::stat::Mode::from_bits(0o600).unwrap()).unwrap();
    let paths = StdioPaths {
        stdin: i.display().to_string(),
        ..Default::default()
    };
    let (stdio, mut pio) = open_plain(&paths, &LogContext::default(), None).unwrap();
    let writer_path = i.clone();
    std::thread::spawn(move || {
        let mut w = OpenOptions::new().write(true).open(writer_path).unwrap();
        let _ = w.write_all(&vec![b'x'; 1 << 20]); // far more than pipe buffers hold
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        pio.close_stdin();
        done_tx.send(()).unwrap();
    });
    assert!(
        done_rx
            .recv_timeout(std::time::Duration::from_secs(2))
            .is_ok(),
        "CloseIO blocked behind a stdin write"
    );
    drop(stdio);
}

#[test]
fn a_restored_process_takes_over_stdin_and_output_fifos_keep_a_reader() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let (i, o) = (dir.path().join("in"), dir.path().join("out"));
    for f in [&i, &o] {
        nix::unistd::mkfifo(f, nix::sys::stat::Mode::from_bits(0o600).unwrap()).unwrap();
    }
    let paths = StdioPaths {
        stdin: i.display().to_string(),
        stdout: o.display().to_string(),
        ..Default::default()
    };
    let (first, old) = open_plain(&paths, &LogContext::default(), None).unwrap();
    // Nobody reads the output fifo, yet writing to it does not fail (EPIPE): the shim
    // holds a read end.
    let mut out = first.stdout.as_ref().unwrap();
    out.write_all(b"x").unwrap();
    let (second, new) = open_plain(&paths, &LogContext::default(), Some(&old)).unwrap();
    drop(first);
    let mut w = OpenOptions::new().write(true).open(&i).unwrap();
    w.write_all(b"hello").unwrap();
    drop(w);
    let mut got = Vec::new();
    second.stdin.unwrap().read_to_end(&mut got).unwrap();
    assert_eq!(
        got, b"hello",
        "containerd's stdin reaches the restored process"
    );
    // A closed stdin stays closed for a later restore.
    let mut closed = new;
    closed.close_stdin();
    let (third, _) = open_plain(&paths, &LogContext::default(), Some(&closed)).unwrap();
    assert!(third.stdin.is_none());
}

#[test]
fn stdin_ends_with_containerds_writer_or_close_io_and_output_opens_without_reader() {
    let dir = tempfile::tempdir().unwrap();
    let (i, o) = (dir.path().join("in"), dir.path().join("out"));
    for p in [&i, &o] {
        nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits(0o600).unwrap()).unwrap();
    }
    let paths = StdioPaths {
        stdin: i.display().to_string(),
        stdout: o.display().to_string(),
        ..Default::default()
    };
    // Opening must not block although nobody reads `out` or writes `in` yet.
    let (stdio, _pio) = open_plain(&paths, &LogContext::default(), None).unwrap();
    let mut containerd_reader = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&o)
        .unwrap();
    stdio.stdout.unwrap().write_all(b"hi").unwrap();
    let mut got = [0u8; 2];
    containerd_reader.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"hi");

    let mut process_stdin = stdio.stdin.unwrap();
    let mut containerd_writer = OpenOptions::new().write(true).open(&i).unwrap();
    containerd_writer.write_all(b"x").unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(process_stdin.read(&mut buf).unwrap(), 1);
    drop(containerd_writer);
    assert_eq!(
        process_stdin.read(&mut buf).unwrap(),
        0,
        "EOF once containerd closes"
    );

    // CloseIO ends stdin even while containerd keeps its end open.
    let (stdio, mut pio) = open_plain(&paths, &LogContext::default(), None).unwrap();
    let _writer = OpenOptions::new().write(true).open(&i).unwrap();
    pio.close_stdin();
    let mut process_stdin = stdio.stdin.unwrap();
    assert_eq!(
        process_stdin.read(&mut buf).unwrap(),
        0,
        "EOF after CloseIO"
    );
}

#[test]
fn a_client_that_opens_its_fifos_after_the_exit_reads_all_the_output_then_end_of_file() {
    let dir = tempfile::tempdir().unwrap();
    let (o, e) = (fifo(dir.path(), "out"), fifo(dir.path(), "err"));
    let (stdio, mut pio) =
        open_plain(&outputs(&o, Some(&e)), &LogContext::default(), None).unwrap();
    let long: Vec<u8> = (0..40_000u32).map(|n| n as u8).collect(); // most of a pipe buffer
    stdio.stdout.as_ref().unwrap().write_all(&long).unwrap();
    stdio.stderr.as_ref().unwrap().write_all(b"oops").unwrap();
    drop(stdio); // the process exits: its writers are gone
    pio.release_outputs();
    drop(pio); // Delete may well come before the client
    std::thread::sleep(Duration::from_millis(300));
    let (out, err) = (client(&o), client(&e));
    let wait = Duration::from_secs(10);
    let out = out.recv_timeout(wait).expect("stdout's client hung");
    let err = err.recv_timeout(wait).expect("stderr's client hung");
    assert_eq!(out.unwrap(), long);
    assert_eq!(err.unwrap(), b"oops");
}

#[test]
fn a_client_reading_already_gets_end_of_file_as_soon_as_the_exit_releases_the_fifo() {
    let dir = tempfile::tempdir().unwrap();
    let o = fifo(dir.path(), "out");
    let (stdio, mut pio) = open_plain(&outputs(&o, None), &LogContext::default(), None).unwrap();
    let got = client(&o);
    stdio.stdout.as_ref().unwrap().write_all(b"done").unwrap();
    drop(stdio);
    assert!(
        got.recv_timeout(Duration::from_millis(300)).is_err(),
        "the shim holds a writer until the exit is recorded"
    );
    let released = Instant::now();
    pio.release_outputs();
    let got = got.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!(got, b"done");
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "end-of-file only after {:?}",
        released.elapsed()
    );
}

#[test]
fn with_no_client_a_release_ends_at_the_delete_and_leaves_no_end_open() {
    let dir = tempfile::tempdir().unwrap();
    let (o, e) = (fifo(dir.path(), "out"), fifo(dir.path(), "err"));
    let (stdio, mut pio) =
        open_plain(&outputs(&o, Some(&e)), &LogContext::default(), None).unwrap();
    stdio.stdout.as_ref().unwrap().write_all(b"lost").unwrap();
    drop(stdio);
    assert_eq!(
        (fds_on(&o), fds_on(&e)),
        (2, 2),
        "a reader and a writer each"
    );
    let started = Instant::now();
    let (deleted, watch) = std::sync::mpsc::channel::<()>();
    let thread = std::mem::take(&mut pio.outputs)
        .release(Duration::from_millis(300), watch)
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(100),
        "never blocks"
    );
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(
        fds_on(&o),
        1,
        "past the timeout, a writer waits for a late client"
    );
    drop(deleted); // the process is deleted
    thread.join().unwrap();
    let took = started.elapsed();
    assert!(
        (Duration::from_millis(800)..Duration::from_secs(3)).contains(&took),
        "{took:?}"
    );
    assert_eq!((fds_on(&o), fds_on(&e)), (0, 0));
    // No reader left (a writer cannot open without blocking) and no writer: the output went.
    let probe = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&o);
    assert_eq!(probe.unwrap_err().raw_os_error(), Some(libc::ENXIO));
    let mut late = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&o)
        .unwrap();
    assert_eq!(late.read(&mut [0u8; 8]).unwrap(), 0);
    let (_deleted, watch) = std::sync::mpsc::channel::<()>();
    assert!(pio.outputs.release(Duration::from_secs(5), watch).is_none());
}

#[test]
fn a_client_that_opens_after_the_timeout_still_reads_everything() {
    let dir = tempfile::tempdir().unwrap();
    let o = fifo(dir.path(), "out");
    let (stdio, mut pio) = open_plain(&outputs(&o, None), &LogContext::default(), None).unwrap();
    stdio
        .stdout
        .as_ref()
        .unwrap()
        .write_all(b"all of it")
        .unwrap();
    drop(stdio);
    let (_deleted, watch) = std::sync::mpsc::channel::<()>();
    let thread = std::mem::take(&mut pio.outputs)
        .release(Duration::from_millis(100), watch)
        .unwrap();
    std::thread::sleep(Duration::from_millis(400));
    // containerd's fifo package: a blocking open, which a writer must be there for.
    let mut late = File::open(&o).unwrap();
    let mut got = String::new();
    late.read_to_string(&mut got).unwrap();
    assert_eq!(got, "all of it");
    thread.join().unwrap();
}

#[test]
fn a_fifo_removed_by_its_client_is_let_go_of_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let o = fifo(dir.path(), "out");
    let (stdio, pio) = open_plain(&outputs(&o, None), &LogContext::default(), None).unwrap();
    drop(stdio);
    std::fs::remove_file(&o).unwrap(); // nobody can open it any more
    let started = Instant::now();
    let (_deleted, watch) = std::sync::mpsc::channel::<()>();
    pio.outputs
        .release(Duration::from_secs(5), watch)
        .unwrap()
        .join()
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[test]
fn a_replaced_process_hands_its_fifos_over_with_no_end_of_file() {
    let dir = tempfile::tempdir().unwrap();
    let o = fifo(dir.path(), "out");
    let paths = outputs(&o, None);
    let (first, old) = open_plain(&paths, &LogContext::default(), None).unwrap();
    let mut reader = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&o)
        .unwrap();
    // The restore opens the new sandbox's stdio while the old one's is open; the old one's
    // ends go at once, unreleased.
    let (second, mut new) = open_plain(&paths, &LogContext::default(), Some(&old)).unwrap();
    drop((first, old));
    second.stdout.as_ref().unwrap().write_all(b"on").unwrap();
    drop(second);
    let mut buf = [0u8; 8];
    assert_eq!(reader.read(&mut buf).unwrap(), 2);
    assert_eq!(
        reader.read(&mut buf).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "held by the new process's writer"
    );
    new.release_outputs();
    let deadline = Instant::now() + Duration::from_secs(3);
    while reader.read(&mut buf).is_err() {
        assert!(
            Instant::now() < deadline,
            "no end-of-file after the release"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// containerd's client as `ctr run` (containerd 2.x) has it: its reader opened without
/// blocking (`cio`), a copy that lags (a loaded host, a slow reader of ctr's stdout), and,
/// once Wait has returned, `task.Delete`: `io.Cancel()` closes its read end, the copy stops
/// at its next read, whatever the fifo still held is lost.
pub(super) struct LaggingClient {
    cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
    got: std::thread::JoinHandle<Vec<u8>>,
}

impl LaggingClient {
    pub(super) fn open(path: &Path) -> Self {
        let mut f = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .unwrap();
        let cancel = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let c = cancel.clone();
        let got = std::thread::spawn(move || {
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            std::thread::sleep(Duration::from_millis(50)); // behind already
            while !c.load(std::sync::atomic::Ordering::SeqCst) {
                match f.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => panic!("{e}"),
                }
                std::thread::sleep(Duration::from_millis(2)); // writing it out, slowly
            }
            got
        });
        LaggingClient { cancel, got }
    }

    /// Wait returned: task.Delete -> io.Cancel(), io.Wait().
    pub(super) fn cancel_and_wait(self) -> Vec<u8> {
        self.cancel.store(true, std::sync::atomic::Ordering::SeqCst);
        self.got.join().unwrap()
    }
}

#[test]
fn an_exit_is_reported_only_once_a_lagging_client_has_read_what_is_left_in_the_fifo() {
    let dir = tempfile::tempdir().unwrap();
    let o = fifo(dir.path(), "out");
    let client = LaggingClient::open(&o);
    let (stdio, mut pio) = open_plain(&outputs(&o, None), &LogContext::default(), None).unwrap();
    let long: Vec<u8> = (0..60_000u32).map(|n| n as u8).collect(); // fits a pipe's buffer
    stdio.stdout.as_ref().unwrap().write_all(&long).unwrap();
    drop(stdio); // the process exits
    let drain = pio
        .start_drain()
        .expect("a client reads, and output is left");
    let started = Instant::now();
    ProcessIo::wait_drained(drain);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    pio.release_outputs(); // the exit is reported: ctr's Wait returns, it deletes
    assert_eq!(client.cancel_and_wait().len(), long.len(), "output lost");
}

#[test]
fn without_a_drain_a_lagging_client_loses_the_end_of_the_output() {
    // What the e2e case output_is_never_lost saw (98790 of 100000 lines): the exit reported
    // as the sandbox ended, with output still in the fifo.
    let dir = tempfile::tempdir().unwrap();
    let o = fifo(dir.path(), "out");
    let client = LaggingClient::open(&o);
    let (stdio, mut pio) = open_plain(&outputs(&o, None), &LogContext::default(), None).unwrap();
    stdio
        .stdout
        .as_ref()
        .unwrap()
        .write_all(&[7u8; 60_000])
        .unwrap();
    drop(stdio);
    pio.release_outputs();
    assert!(client.cancel_and_wait().len() < 60_000);
}

#[test]
fn nothing_to_drain_without_a_client_or_without_output_left() {
    let dir = tempfile::tempdir().unwrap();
    let o = fifo(dir.path(), "out");
    // ctr run -d: no client reads.
    let (stdio, mut pio) = open_plain(&outputs(&o, None), &LogContext::default(), None).unwrap();
    stdio.stdout.as_ref().unwrap().write_all(b"unread").unwrap();
    drop(stdio);
    assert!(pio.start_drain().is_none());
    drop(pio);
    // A client that has read everything already.
    let p = fifo(dir.path(), "out2");
    let mut reader = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&p)
        .unwrap();
    let (stdio, mut pio) = open_plain(&outputs(&p, None), &LogContext::default(), None).unwrap();
    stdio.stdout.as_ref().unwrap().write_all(b"read").unwrap();
    drop(stdio);
    assert_eq!(reader.read(&mut [0u8; 16]).unwrap(), 4);
    assert!(pio.start_drain().is_none());
}

#[test]
fn a_client_that_reads_nothing_delays_the_exit_only_by_the_stall_bound() {
    let dir = tempfile::tempdir().unwrap();
    let o = fifo(dir.path(), "out");
    let _stuck = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&o)
        .unwrap();
    let (stdio, mut pio) = open_plain(&outputs(&o, None), &LogContext::default(), None).unwrap();
    stdio
        .stdout
        .as_ref()
        .unwrap()
        .write_all(b"never read")
        .unwrap();
    drop(stdio);
    let started = Instant::now();
    pio.start_drain()
        .unwrap()
        .wait(Duration::from_millis(200), Duration::from_secs(5));
    let took = started.elapsed();
    assert!(
        (Duration::from_millis(200)..Duration::from_secs(2)).contains(&took),
        "{took:?}"
    );
}
