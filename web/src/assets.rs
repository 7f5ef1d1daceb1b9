//! The pages and what they load, built into the binary (no files to install beside it).

pub const INDEX: &str = include_str!("../assets/index.html");
pub const SPLIT: &str = include_str!("../assets/split.html");
pub const SUSPEND: &str = include_str!("../assets/suspend.html");

const FILES: &[(&str, &str, &[u8])] = &[
    (
        "style.css",
        "text/css",
        include_bytes!("../assets/style.css"),
    ),
    (
        "pane.js",
        "text/javascript",
        include_bytes!("../assets/pane.js"),
    ),
    (
        "split.js",
        "text/javascript",
        include_bytes!("../assets/split.js"),
    ),
    (
        "suspend.js",
        "text/javascript",
        include_bytes!("../assets/suspend.js"),
    ),
    (
        "vendor/xterm.js",
        "text/javascript",
        include_bytes!("../assets/vendor/xterm.js"),
    ),
    (
        "vendor/xterm.css",
        "text/css",
        include_bytes!("../assets/vendor/xterm.css"),
    ),
    (
        "vendor/addon-fit.js",
        "text/javascript",
        include_bytes!("../assets/vendor/addon-fit.js"),
    ),
];

/// An asset's content type and bytes.
pub fn get(path: &str) -> Option<(&'static str, &'static [u8])> {
    FILES
        .iter()
        .find(|(p, _, _)| *p == path)
        .map(|(_, mime, body)| (*mime, *body))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_pages_load_what_is_served() {
        for page in [super::SPLIT, super::SUSPEND] {
            for asset in [
                "vendor/xterm.js",
                "vendor/addon-fit.js",
                "pane.js",
                "style.css",
            ] {
                assert!(page.contains(&format!("/assets/{asset}")), "{asset}");
                assert!(super::get(asset).is_some());
            }
        }
        assert!(super::get("../Cargo.toml").is_none());
    }
}
