//! How a program of the harness ends on SIGINT, SIGTERM or SIGHUP: the same way for all three,
//! with nothing it started left running. Ctrl-C reaches a terminal's whole process group, but
//! SIGTERM (a service manager, `timeout`, `kill`) and SIGHUP (a closed terminal) reach the
//! program alone, and a default death runs no destructor: its containerd, chalk-web and every
//! sandbox would stay.
//!
//! On the first signal a watcher thread asks the program's own children (its process group:
//! chalk-web, a kubelet, a ctr in flight) to stop with SIGTERM and waits for them, then runs
//! what each harness part registered ([`on_stop`]: a containerd's teardown, a node's links),
//! newest first, and ends the program by the same signal (a shell sees 128+signal). Further
//! signals are ignored meanwhile. A containerd runs in a process group of its own, so that a
//! Ctrl-C does not stop it before its sandboxes are removed through it.

use std::{
    fs,
    sync::{
        atomic::{AtomicI32, AtomicU64, Ordering},
        Mutex, Once,
    },
    time::{Duration, Instant},
};

type Cleanup = Box<dyn FnOnce() + Send>;

static INSTALL: Once = Once::new();
/// The write end of the pipe the handler reports a signal on (-1 until installed).
static PIPE: AtomicI32 = AtomicI32::new(-1);
/// The first signal received (0: none).
static RECEIVED: AtomicI32 = AtomicI32::new(0);
static NEXT: AtomicU64 = AtomicU64::new(0);
static CLEANUPS: Mutex<Vec<(u64, &'static str, Cleanup)>> = Mutex::new(Vec::new());

/// How long the program's own children get to exit after SIGTERM (chalk-web removes its
/// sandboxes first) before SIGKILL.
const CHILDREN_GRACE: Duration = Duration::from_secs(60);

/// Installs the handlers for SIGINT, SIGTERM and SIGHUP and starts the watcher; once per
/// process (later calls do nothing). The harness's parts call it when they start something.
pub fn install() {
    INSTALL.call_once(|| {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills the two descriptors of a valid array.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            eprintln!(
                "stop handler: pipe: {}: signals end the program at once",
                std::io::Error::last_os_error()
            );
            return;
        }
        PIPE.store(fds[1], Ordering::SeqCst);
        std::thread::Builder::new()
            .name("stop-watcher".into())
            .spawn(move || watch(fds[0]))
            .expect("spawn the stop watcher");
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: a zeroed sigaction with a handler that only calls write(2), which is
            // async-signal-safe. SA_RESTART keeps the program's own calls uninterrupted.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
                action.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(sig, &action, std::ptr::null_mut());
            }
        }
    });
}

extern "C" fn on_signal(sig: libc::c_int) {
    let byte = sig as u8;
    // SAFETY: write(2) of one byte from the stack to a descriptor this module owns.
    unsafe { libc::write(PIPE.load(Ordering::Relaxed), (&byte as *const u8).cast(), 1) };
}

/// The signal a stop is under way for, if any.
pub fn requested() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        sig => Some(sig),
    }
}

/// Registers `cleanup` to run if a signal stops the program. Dropping the registration (its
/// owner cleaned up itself) removes it; while a stop is under way the drop waits for the
/// program to end instead, so that the watcher alone cleans up.
pub fn on_stop(what: &'static str, cleanup: impl FnOnce() + Send + 'static) -> Registration {
    install();
    let id = NEXT.fetch_add(1, Ordering::SeqCst);
    lock().push((id, what, Box::new(cleanup)));
    Registration(id)
}

#[must_use = "dropping the registration removes it"]
pub struct Registration(u64);

impl Drop for Registration {
    fn drop(&mut self) {
        if requested().is_some() {
            // The watcher runs the cleanup (or has) and then ends the process.
            loop {
                std::thread::park();
            }
        }
        lock().retain(|(id, _, _)| *id != self.0);
    }
}

fn lock() -> std::sync::MutexGuard<'static, Vec<(u64, &'static str, Cleanup)>> {
    CLEANUPS.lock().unwrap_or_else(|e| e.into_inner())
}

fn watch(read_end: i32) {
    let mut byte = 0u8;
    loop {
        // SAFETY: read(2) of one byte into a stack variable.
        let n = unsafe { libc::read(read_end, (&mut byte as *mut u8).cast(), 1) };
        if n == 1 {
            break;
        }
    }
    let sig = i32::from(byte);
    RECEIVED.store(sig, Ordering::SeqCst);
    eprintln!(
        "{}: {}: stopping what it started",
        program_name(),
        signal_name(sig)
    );
    stop_children();
    loop {
        let Some((_, what, cleanup)) = lock().pop() else {
            break;
        };
        eprintln!("stopping {what}");
        cleanup();
    }
    // What the program's other threads started meanwhile (a ctr against the containerd
    // that has just gone; the harness starts none once a stop is requested, but one may have
    // been on its way): swept until a sweep finds none, and gone before this process is.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let left = own_children();
        if left.is_empty() || Instant::now() > deadline {
            break;
        }
        for pid in left {
            // SAFETY: kill(2) on a child of this process.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: restoring the default action and raising the signal ends this process as the
    // signal would have; exit is the fallback.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
    std::process::exit(128 + sig);
}

/// SIGTERM to this process's children in its own process group, then SIGKILL to those still
/// running after [`CHILDREN_GRACE`]. A containerd (a group of its own) is left to its
/// registered teardown.
fn stop_children() {
    let children = own_children();
    for &pid in &children {
        // SAFETY: kill(2) on a child of this process.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let deadline = Instant::now() + CHILDREN_GRACE;
    while children.iter().any(|&p| running(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    for &pid in children.iter().filter(|&&p| running(p)) {
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

fn own_children() -> Vec<i32> {
    // SAFETY: plain getters.
    let (me, group) = unsafe { (libc::getpid(), libc::getpgrp()) };
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            stat(pid).is_some_and(|s| s.parent == me && s.group == group && s.state != 'Z')
        })
        .collect()
}

/// A child that has exited stays a zombie until its owner reaps it: that counts as ended.
fn running(pid: i32) -> bool {
    stat(pid).is_some_and(|s| s.state != 'Z')
}

struct Stat {
    state: char,
    parent: i32,
    group: i32,
}

fn stat(pid: i32) -> Option<Stat> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// `/proc/<pid>/stat`: the command (in parentheses, which it may itself hold) comes before the
/// state, the parent and the process group.
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let parent = fields.next()?.parse().ok()?;
    let group = fields.next()?.parse().ok()?;
    Some(Stat {
        state,
        parent,
        group,
    })
}

fn program_name() -> String {
    std::env::args()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "program".into())
}

fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        other => format!("signal {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_the_state_parent_and_group_even_with_parentheses_in_the_name() {
        let s = parse_stat("4242 (a (b) c) S 17 4242 4242 0 -1").unwrap();
        assert_eq!((s.state, s.parent, s.group), ('S', 17, 4242));
        let z = parse_stat("7 (ctr) Z 1 7 7").unwrap();
        assert_eq!(z.state, 'Z');
        assert!(parse_stat("garbage").is_none());
    }

    #[test]
    fn this_process_is_running_and_its_own_stat_names_its_group() {
        // SAFETY: plain getters.
        let (me, group) = unsafe { (libc::getpid(), libc::getpgrp()) };
        assert!(running(me));
        assert_eq!(stat(me).unwrap().group, group);
    }

    #[test]
    fn a_dropped_registration_is_removed_and_never_runs() {
        let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ran.clone();
        let reg = on_stop("a test part", move || flag.store(true, Ordering::SeqCst));
        let id = reg.0;
        assert!(lock().iter().any(|(i, _, _)| *i == id));
        drop(reg);
        assert!(!lock().iter().any(|(i, _, _)| *i == id));
        assert!(!ran.load(Ordering::SeqCst));
    }
}
