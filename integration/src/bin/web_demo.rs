//! `scripts/web-demo`: a private containerd with chalk-shim registered, the busybox image
//! imported, and chalk-web serving the two demo pages on it until Ctrl-C.
//!   chalk-web-demo [--listen ADDR] [chalk-web flags...]

use std::process::ExitCode;

use chalk_integration::{web::Web, Containerd};

fn main() -> ExitCode {
    // SIGINT, SIGTERM and SIGHUP all end it as Ctrl-C would, with nothing left running.
    chalk_integration::stop::install();
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut listen = "127.0.0.1:8080".to_string();
    if let Some(i) = args.iter().position(|a| a == "--listen") {
        if i + 1 >= args.len() {
            eprintln!("--listen needs an address");
            return ExitCode::from(2);
        }
        listen = args.remove(i + 1);
        args.remove(i);
    }
    match run(&listen, &args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("web demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(listen: &str, extra: &[String]) -> Result<(), String> {
    println!("starting a private containerd with chalk-shim registered ...");
    let c = Containerd::start().map_err(|e| format!("start containerd: {e}"))?;
    c.import_busybox()
        .map_err(|e| format!("import the image: {e}"))?;
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let mut web = Web::start(&c, listen, &extra).map_err(|e| e.to_string())?;
    println!("\nThe demo pages are at {}", web.url);
    println!("  {}split    split a live terminal into forks", web.url);
    println!("  {}suspend  suspend and resume a sandbox", web.url);
    println!(
        "(containerd under {}, the server's log in {})",
        c.dir().display(),
        web.log_path().display()
    );
    println!("Press Ctrl-C to stop: the sandboxes are removed and containerd stopped.");
    // A signal (Ctrl-C, SIGTERM, SIGHUP) ends chalk-web first, which removes its sandboxes,
    // then containerd (chalk_integration::stop); chalk-web ending by itself ends it too.
    let status = web.wait().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("chalk-web ended with {status}: {}", web.log()));
    }
    Ok(())
}
