//! The host processes of a sandbox, counted from /proc: the page shows that a suspended
//! sandbox has none left.

/// runsc processes (the sandbox, its gofer, its monitors) whose arguments name sandbox `id`.
pub fn runsc_processes(id: &str) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|cmdline| names(cmdline, id))
        .count()
}

/// Whether a NUL-separated command line is runsc's and has `id` as one of its arguments.
fn names(cmdline: &[u8], id: &str) -> bool {
    let mut args = cmdline.split(|&b| b == 0).filter(|a| !a.is_empty());
    let Some(first) = args.next() else {
        return false;
    };
    String::from_utf8_lossy(first).contains("runsc") && args.any(|a| a == id.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_runsc_naming_the_sandbox() {
        assert!(names(b"/usr/bin/runsc\0--root=/r\0boot\0web-1\0", "web-1"));
        assert!(!names(b"/usr/bin/runsc\0boot\0web-12\0", "web-1"));
        assert!(!names(b"/bin/sh\0web-1\0", "web-1"));
        assert!(!names(b"", "web-1"));
    }
}
