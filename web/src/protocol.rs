//! The terminal's websocket: binary frames carry terminal bytes both ways; text frames carry
//! JSON control messages (the page's window size; the server's hello before a repaint and
//! the sandbox's state).

use serde::Deserialize;

/// What a page sends besides keystrokes.
#[derive(Debug, PartialEq, Eq, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Control {
    Resize { cols: u32, rows: u32 },
}

/// Reads a control message; sizes outside what a screen can be are refused.
pub fn parse_control(text: &str) -> Result<Control, String> {
    let c: Control =
        serde_json::from_str(text).map_err(|e| format!("not a control message: {e}"))?;
    let Control::Resize { cols, rows } = &c;
    check_size(*cols, *rows)?;
    Ok(c)
}

pub fn check_size(cols: u32, rows: u32) -> Result<(), String> {
    if !(2..=1000).contains(&cols) || !(2..=1000).contains(&rows) {
        return Err(format!(
            "window size {cols}x{rows}: columns and rows must be 2 to 1000"
        ));
    }
    Ok(())
}

/// Sent before the replay: the page clears its screen, then the replay repaints it.
pub fn hello() -> String {
    serde_json::json!({"type": "hello"}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resize_is_read_and_checked() {
        assert_eq!(
            parse_control(r#"{"type":"resize","cols":120,"rows":40}"#).unwrap(),
            Control::Resize {
                cols: 120,
                rows: 40
            }
        );
        assert!(parse_control(r#"{"type":"resize","cols":0,"rows":40}"#).is_err());
        assert!(parse_control(r#"{"type":"explode"}"#).is_err());
        assert!(parse_control("not json").is_err());
    }
}
