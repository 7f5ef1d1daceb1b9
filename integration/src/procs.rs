//! The processes on this host, from /proc.

/// Every process's pid and arguments.
pub fn processes() -> Vec<(u32, Vec<String>)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let args = cmdline
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            Some((pid, args))
        })
        .collect()
}

/// The first line `bin args` prints, trimmed; what went wrong when it cannot run.
pub fn first_line(bin: &std::path::Path, args: &[&str]) -> String {
    std::process::Command::new(bin)
        .args(args)
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        })
        .unwrap_or_else(|e| format!("{}: {e}", bin.display()))
}
