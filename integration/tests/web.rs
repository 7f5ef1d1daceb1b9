//! The demo pages in a real browser: chalk-web on a private containerd and the cell's runsc,
//! driven by Debian's chromium through puppeteer-core (`web/tests`, run with `node --test`);
//! then what a server leaves behind: nothing once the pages closed their sandboxes, nothing
//! after SIGTERM, and nothing after a crash once it starts again (it reclaims what the dead
//! one left, suspend snapshots included).
//!
//! Screenshots of each step and the times the pages showed go to `target/web-artifacts/<cell>`
//! (`CHALK_CELL`), also printed here.

use std::{
    path::{Path, PathBuf},
    process::{Command, ExitCode},
    time::{Duration, Instant},
};

use chalk_integration::{
    web::{Page, Web},
    Containerd,
};

type Result<T = ()> = std::result::Result<T, String>;

const PER_CLIENT: &str = "3";

fn main() -> ExitCode {
    let started = Instant::now();
    match run() {
        Ok(()) => {
            println!("web: all passed in {:.1?}", started.elapsed());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("web: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

fn run() -> Result {
    let tests = workspace().join("web/tests");
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    if !Path::new(&chromium).exists() || !tests.join("node_modules/puppeteer-core").exists() {
        return Err(format!(
            "the browser tests need {chromium} and puppeteer-core in {}: run scripts/setup-web",
            tests.display()
        ));
    }
    let c = Containerd::start().map_err(|e| format!("start containerd: {e}"))?;
    c.import_busybox().map_err(|e| e.to_string())?;
    let cell = std::env::var("CHALK_CELL").unwrap_or_else(|_| "local".into());
    let artifacts = workspace().join("target/web-artifacts").join(&cell);
    let _ = std::fs::remove_dir_all(&artifacts);

    step("the pages in chromium");
    let mut web = Web::start(&c, "127.0.0.1:0", &["--max-per-client", PER_CLIENT])
        .map_err(|e| e.to_string())?;
    let out = Command::new("node")
        .args(["--test", "--test-reporter=spec", "--test-concurrency=1"])
        .current_dir(&tests)
        .env("CHALK_WEB_URL", &web.url)
        .env("CHALK_WEB_ARTIFACTS", &artifacts)
        .env("CHALK_WEB_PER_CLIENT", PER_CLIENT)
        .env("CHALK_STORE_REFS", c.snapshot_store().join("refs"))
        .env("CHROMIUM", &chromium)
        .status()
        .map_err(|e| format!("run node: {e}"))?;
    if !out.success() {
        return Err(format!(
            "the browser tests failed ({out}); screenshots in {}; chalk-web's log:\n{}",
            artifacts.display(),
            web.log()
        ));
    }
    print_timings(&artifacts, &cell)?;
    nothing_left(&c, &web, "after the pages closed their sandboxes")?;

    step("SIGTERM removes the sandboxes a server made");
    let mut page = Page::open(&web.url)?;
    let id = page.launch()?;
    let status = web.stop().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!(
            "chalk-web exited {status} on SIGTERM: {}",
            web.log()
        ));
    }
    nothing_left(&c, &web, &format!("after SIGTERM with {id} running"))?;

    step("a crashed server's sandboxes are reclaimed by the next one");
    let web = Web::start(&c, "127.0.0.1:0", &[]).map_err(|e| e.to_string())?;
    let mut page = Page::open(&web.url)?;
    let running = page.launch()?;
    let suspended = page.launch()?;
    page.post(&format!("/api/sandboxes/{suspended}/suspend"), 200)?;
    let state = web.crash();
    let snapshots = snapshot_records(&c)?;
    if snapshots.is_empty() {
        return Err("the suspended sandbox's snapshot is missing before the restart".into());
    }
    // Another server's sandbox, on another state directory: not this one's to reclaim.
    let other = Web::start(&c, "127.0.0.1:0", &[]).map_err(|e| e.to_string())?;
    let theirs = Page::open(&other.url)?.launch()?;
    let web = Web::start_in(&c, "127.0.0.1:0", &[], state).map_err(|e| e.to_string())?;
    let (status, _, _) = Page::open(&other.url)?.request("GET", "/api/info", "")?;
    let alive = c.ctr(["tasks", "ls"]).stdout;
    if status != 200 || !alive.contains(&theirs) {
        return Err(format!(
            "a restart reclaimed another server's sandbox {theirs}: {alive}"
        ));
    }
    drop(other);
    if !web
        .log()
        .contains("removed 2 sandboxes an earlier run left")
    {
        return Err(format!(
            "{running} and {suspended} not reclaimed: {}",
            web.log()
        ));
    }
    nothing_left(&c, &web, "after a crash and a restart")?;
    drop(web);

    step("sandboxes are reclaimed when their lifetime ends");
    let web = Web::start(&c, "127.0.0.1:0", &["--lifetime", "4s"]).map_err(|e| e.to_string())?;
    let mut page = Page::open(&web.url)?;
    let running = page.launch()?;
    let suspended = page.launch()?;
    page.post(&format!("/api/sandboxes/{suspended}/suspend"), 200)?;
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let (_, _, a) = page.request("GET", &format!("/api/sandboxes/{running}"), "")?;
        let (b, _, _) = page.request("GET", &format!("/api/sandboxes/{suspended}"), "")?;
        if a.contains(r#""state":"exited""#) && b == 404 {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "after their 4 s lifetime: {running} reads {a}, suspended {suspended} answers {b}"
            ));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    nothing_left(&c, &web, "after the lifetime ended")?;
    drop(web);

    step("beyond loopback it needs a token; with one, nothing is served without it");
    let refused = std::process::Command::new(
        chalk_integration::web::web_binary().map_err(|e| e.to_string())?,
    )
    .args(["--listen", "0.0.0.0:0", "--address"])
    .arg(c.socket())
    .output()
    .map_err(|e| e.to_string())?;
    let said = String::from_utf8_lossy(&refused.stderr);
    if refused.status.success() || !said.contains("needs --token") {
        return Err(format!(
            "chalk-web on 0.0.0.0 without a token: {} {said}",
            refused.status
        ));
    }
    let token = "0123456789abcdef0123";
    let web = Web::start(&c, "127.0.0.1:0", &["--token", token]).map_err(|e| e.to_string())?;
    let (status, _, _) = Page::at(&web.url, "").request("GET", "/split", "")?;
    if status != 401 {
        return Err(format!("the page without the token: {status}"));
    }
    let page = Page::open_path(&web.url, &format!("/split?token={token}"))?;
    if !page.cookie.contains("chalk_token=") {
        return Err(format!("no token cookie set: {}", page.cookie));
    }
    let mut with = page;
    let (ok, _, _) = with.request("GET", "/api/info", "")?;
    let bare = with
        .cookie
        .split("; ")
        .filter(|c| !c.starts_with("chalk_token="))
        .collect::<Vec<_>>()
        .join("; ");
    let (no, _, _) = Page::at(&web.url, &bare).request("GET", "/api/info", "")?;
    if ok != 200 || no != 401 {
        return Err(format!("the API with the token: {ok}, without it: {no}"));
    }
    Ok(())
}

fn step(what: &str) {
    println!("== web: {what}");
}

fn print_timings(artifacts: &Path, cell: &str) -> Result {
    let text = std::fs::read_to_string(artifacts.join("timings.json"))
        .map_err(|e| format!("the browser tests wrote no timings: {e}"))?;
    let t: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    println!("web timings ({cell}): {}", t);
    Ok(())
}

fn lines(out: &chalk_integration::CtrOutput) -> Vec<String> {
    out.stdout
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

/// The names of the snapshot records chalkctl lists.
fn snapshot_records(c: &Containerd) -> Result<Vec<String>> {
    let out = c
        .chalkctl_command()
        .map_err(|e| e.to_string())?
        .args(["--output", "json", "snapshot", "list"])
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "chalkctl snapshot list: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("chalkctl snapshot list: {e}"))?;
    let items = v["items"].as_array().cloned().unwrap_or_default();
    Ok(items
        .iter()
        .map(|s| s["name"].as_str().unwrap_or("?").to_string())
        .collect())
}

/// No container, task, snapshot record or chalkctl lease in the namespace, no runsc process,
/// no snapshot in the store and no fifo left (given a few seconds to settle).
fn nothing_left(c: &Containerd, web: &Web, when: &str) -> Result {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut left = Vec::new();
        for (what, args) in [
            ("containers", &["containers", "ls", "-q"][..]),
            ("tasks", &["tasks", "ls", "-q"][..]),
        ] {
            let found = lines(&c.ctr(args));
            if !found.is_empty() {
                left.push(format!("{what}: {found:?}"));
            }
        }
        let leases: Vec<String> = lines(&c.ctr(["leases", "ls", "-q"]))
            .into_iter()
            .filter(|l| l.starts_with("chalkctl"))
            .collect();
        if !leases.is_empty() {
            left.push(format!("leases: {leases:?}"));
        }
        let snaps = snapshot_records(c)?;
        if !snaps.is_empty() {
            left.push(format!("snapshot records: {snaps:?}"));
        }
        let refs: Vec<String> = std::fs::read_dir(c.snapshot_store().join("refs"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        if !refs.is_empty() {
            left.push(format!("store refs: {refs:?}"));
        }
        let fifos: Vec<String> = std::fs::read_dir(web.fifo_dir())
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        if !fifos.is_empty() {
            left.push(format!("fifo directories: {fifos:?}"));
        }
        let runsc = chalk_integration::procs::processes()
            .into_iter()
            .filter(|(_, args)| {
                args.iter().any(|a| a.contains("runsc"))
                    && args.iter().any(|a| a.starts_with("web-"))
            })
            .count();
        if runsc > 0 {
            left.push(format!("{runsc} runsc processes of web- sandboxes"));
        }
        if left.is_empty() {
            println!("web: nothing left {when}");
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("left {when}: {}", left.join("; ")));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}
