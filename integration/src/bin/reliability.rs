//! `scripts/reliability`'s tool: the load cases and the soak against a private containerd
//! (this cell's: CHALK_CONTAINERD, CHALK_RUNSC), each a result line appended to a file, and
//! RELIABILITY.md rendered from every result line of a run.
//!
//!   chalk-reliability load --out FILE
//!   chalk-reliability soak --out FILE [--cycles N] [--every K]
//!   chalk-reliability meta --cell NAME --out FILE
//!   chalk-reliability libtest --cell NAME --out FILE   < libtest's output
//!   chalk-reliability report DIR                        > RELIABILITY.md

use std::{
    io::{Read, Write},
    path::{Path, PathBuf},
    process::ExitCode,
};

use chalk_integration::{
    bench::machine,
    containerd::program,
    procs::first_line,
    reliability::{load, report, soak, Node},
    Containerd,
};
use serde_json::{json, Value};

fn append(out: &Path, lines: &[Value]) -> Result<(), String> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out)
        .map_err(|e| format!("{}: {e}", out.display()))?;
    for l in lines {
        writeln!(f, "{l}").map_err(|e| format!("{}: {e}", out.display()))?;
    }
    Ok(())
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.windows(2).find(|w| w[0] == name).map(|w| w[1].clone())
}

fn number(args: &[String], name: &str, default: usize) -> Result<usize, String> {
    flag(args, name).map_or(Ok(default), |v| {
        v.parse()
            .map_err(|_| format!("{name} takes a whole number, not {v:?}"))
    })
}

fn containerd() -> Result<Containerd, String> {
    let c = Containerd::start().map_err(|e| format!("cannot start containerd: {e}"))?;
    c.import_busybox()
        .map_err(|e| format!("cannot import the busybox image: {e}"))?;
    Ok(c)
}

fn passed(lines: &[Value]) -> bool {
    lines.iter().all(|l| l["passed"].as_bool() == Some(true))
}

fn run(args: &[String]) -> Result<bool, String> {
    let usage = "usage: chalk-reliability load|soak|meta|libtest --out FILE, or report DIR";
    let out = || -> Result<PathBuf, String> {
        flag(args, "--out")
            .map(PathBuf::from)
            .ok_or(format!("--out FILE is needed: {usage}"))
    };
    match args.first().map(String::as_str) {
        Some("load") => {
            let out = out()?;
            let c = containerd()?;
            let n = Node { c: &c };
            let mut lines = Vec::new();
            for case in [
                load::fifty_sandboxes as fn(&Node) -> Value,
                load::sixteen_concurrent_forks,
                load::eight_concurrent_snapshots,
            ] {
                let line = case(&n);
                eprintln!("{line}");
                append(&out, std::slice::from_ref(&line))?;
                lines.push(line);
            }
            Ok(passed(&lines))
        }
        Some("soak") => {
            let out = out()?;
            let cycles = number(args, "--cycles", 500)?;
            let every = number(args, "--every", 25)?;
            let c = containerd()?;
            let line = soak::run(&Node { c: &c }, cycles, every);
            append(&out, std::slice::from_ref(&line))?;
            eprintln!("{}", line["notes"]);
            Ok(passed(&[line]))
        }
        Some("meta") => {
            let cell = flag(args, "--cell").ok_or("--cell NAME is needed")?;
            let runsc = program("CHALK_RUNSC", "runsc");
            let line = json!({
                "cell": cell,
                "containerd": first_line(&program("CHALK_CONTAINERD", "containerd"), &["--version"]),
                "runsc": format!("{} ({})", first_line(&runsc, &["--version"]), runsc.display()),
                "machine": machine(),
            });
            append(&out()?, &[line])?;
            Ok(true)
        }
        Some("libtest") => {
            let cell = flag(args, "--cell").ok_or("--cell NAME is needed")?;
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| format!("stdin: {e}"))?;
            let lines = report::from_libtest(&text, &cell);
            if lines.is_empty() {
                return Err("no `test … ok|FAILED` lines on stdin".into());
            }
            append(&out()?, &lines)?;
            Ok(passed(&lines))
        }
        Some("report") => {
            let dir = PathBuf::from(args.get(1).ok_or(usage)?);
            let (mut results, mut meta) = (Vec::new(), Vec::new());
            let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
                .map_err(|e| format!("{}: {e}", dir.display()))?
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
                .collect();
            files.sort();
            for f in files {
                let text =
                    std::fs::read_to_string(&f).map_err(|e| format!("{}: {e}", f.display()))?;
                let is_meta = f
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("meta"));
                for l in text.lines().filter(|l| !l.trim().is_empty()) {
                    let v: Value = serde_json::from_str(l)
                        .map_err(|e| format!("{}: a line is not JSON: {e}", f.display()))?;
                    if is_meta {
                        meta.push(v)
                    } else {
                        results.push(v)
                    }
                }
            }
            let when = std::fs::read_to_string(dir.join("date"))
                .map(|d| d.trim().to_string())
                .unwrap_or_else(|_| "an unrecorded date".into());
            // How the results were gathered, when not by one scripts/reliability run.
            let when = match std::fs::read_to_string(dir.join("how")) {
                Ok(how) => format!("{when} ({})", how.trim()),
                Err(_) => when,
            };
            let machine = meta
                .first()
                .and_then(|m| m["machine"].as_str())
                .map(|m| format!("{when}, on {m}"))
                .unwrap_or(when);
            print!("{}", report::render(&results, &meta, &machine));
            Ok(true)
        }
        _ => Err(usage.into()),
    }
}

fn main() -> ExitCode {
    // SIGINT, SIGTERM and SIGHUP all end it as Ctrl-C would, with nothing left running.
    chalk_integration::stop::install();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("chalk-reliability: {e}");
            ExitCode::from(2)
        }
    }
}
