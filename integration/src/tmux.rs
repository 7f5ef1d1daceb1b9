//! A real terminal for tests of interactive commands: a tmux server of the test's own (its
//! own socket, no config), one window running a command line, keys sent to it and its screen
//! read back. tmux is a Debian package `.ci/run` installs.

use std::{
    process::Command,
    time::{Duration, Instant},
};

pub struct Tmux {
    socket: String,
}

impl Tmux {
    /// Starts `argv` (quoted for tmux's shell) in a window of `cols` x `rows`, followed by a
    /// line `rc=<status>` when it ends and a shell to keep the window.
    pub fn start(name: &str, argv: &[String], cols: u32, rows: u32) -> Result<Tmux, String> {
        let t = Tmux {
            socket: format!("chalk-{}-{name}", std::process::id()),
        };
        let line = format!("{}; echo rc=$?; exec sh", quote_all(argv));
        t.run(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-x",
            &cols.to_string(),
            "-y",
            &rows.to_string(),
            &line,
        ])?;
        Ok(t)
    }

    fn run(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .map_err(|e| format!("tmux: {e} (is tmux installed?)"))?;
        if !out.status.success() {
            return Err(format!(
                "tmux {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Types `text` literally.
    pub fn type_text(&self, text: &str) -> Result<(), String> {
        self.run(&["send-keys", "-l", text]).map(drop)
    }

    /// Presses keys by tmux's names (`Enter`, `C-c`, `C-p`).
    pub fn keys(&self, keys: &[&str]) -> Result<(), String> {
        let mut args = vec!["send-keys"];
        args.extend_from_slice(keys);
        self.run(&args).map(drop)
    }

    /// Types `line` and Enter.
    pub fn line(&self, line: &str) -> Result<(), String> {
        self.type_text(line)?;
        self.keys(&["Enter"])
    }

    /// The window's text, its scrollback included.
    pub fn screen(&self) -> Result<String, String> {
        self.run(&["capture-pane", "-p", "-J", "-S", "-1000"])
    }

    /// Waits for `text` to be on the screen `times` times or more.
    pub fn wait_for_n(&self, text: &str, times: usize, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            let screen = self.screen()?;
            if screen.matches(text).count() >= times {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{text:?} not on the screen in {timeout:?}:\n{screen}"
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn wait_for(&self, text: &str, timeout: Duration) -> Result<(), String> {
        self.wait_for_n(text, 1, timeout)
    }

    /// Resizes the window (the program in it gets SIGWINCH).
    pub fn resize(&self, cols: u32, rows: u32) -> Result<(), String> {
        self.run(&[
            "resize-window",
            "-x",
            &cols.to_string(),
            "-y",
            &rows.to_string(),
        ])
        .map(drop)
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// One shell word.
fn quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:@%+,".contains(c))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn quote_all(argv: &[String]) -> String {
    argv.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::quote;

    #[test]
    fn words_are_quoted_for_the_shell() {
        assert_eq!(quote("abc-1"), "abc-1");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote(""), "''");
    }
}
