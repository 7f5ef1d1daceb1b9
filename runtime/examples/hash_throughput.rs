//! Manifest hashing throughput on this machine: `cargo run --release -p chalk-runtime
//! --example hash_throughput -- FILE [THREADS]` hashes FILE as a snapshot file would be.

use std::{path::PathBuf, time::Instant};

use chalk_runtime::snapshot::hash::hash_files;

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(file) = args.next().map(PathBuf::from) else {
        eprintln!("usage: hash_throughput FILE [THREADS]");
        std::process::exit(2);
    };
    let threads = args.next().and_then(|t| t.parse().ok()).unwrap_or(0);
    let started = Instant::now();
    let digests = match hash_files(std::slice::from_ref(&file), threads) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let secs = started.elapsed().as_secs_f64();
    let size = digests[0].size as f64;
    println!(
        "{} bytes in {secs:.3} s: {:.0} MB/s ({} threads)",
        digests[0].size,
        size / secs / 1e6,
        if threads == 0 {
            "all".to_string()
        } else {
            threads.to_string()
        }
    );
}
