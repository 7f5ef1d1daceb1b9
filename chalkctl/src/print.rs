//! Records printed for people: `key value` lines.

use serde_json::Value;

/// One record as `key value` lines: nested objects as `key.sub`, and snapshots one per line
/// (id or record name, status, created).
pub fn print_record(record: &Value) {
    for (key, value) in record_lines("", record) {
        println!("{key:<18} {value}");
    }
}

fn record_lines(prefix: &str, v: &Value) -> Vec<(String, String)> {
    let mut lines = Vec::new();
    for (k, v) in v.as_object().into_iter().flatten() {
        let key = format!("{prefix}{k}");
        match v {
            Value::Object(o) if o.is_empty() => lines.push((key, "-".into())),
            Value::Object(_) if k == "labels" => {
                let pairs: Vec<String> = v
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| format!("{k}={}", plain(v)))
                    .collect();
                lines.push((key, pairs.join(", ")));
            }
            Value::Object(_) => lines.extend(record_lines(&format!("{key}."), v)),
            Value::Array(items) if items.iter().all(Value::is_object) => {
                if items.is_empty() {
                    lines.push((key.clone(), "-".into()));
                }
                for item in items {
                    let id = match &item["id"] {
                        Value::Null => plain(&item["name"]),
                        id => plain(id),
                    };
                    let line = format!(
                        "{id} {} {}",
                        plain(&item["status"]),
                        plain(&item["created"])
                    );
                    lines.push((key.clone(), line));
                }
            }
            _ => lines.push((key, plain(v))),
        }
    }
    lines
}

/// A JSON value as a table cell.
pub fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::record_lines;
    use serde_json::json;

    #[test]
    fn records_read_as_flat_lines() {
        let v = json!({
            "id": "web",
            "labels": {"a": "1", "b": "2"},
            "manifest": {"kind": "snapshot", "image": {"digest": "sha256:ab"}},
            "snapshots": [{"id": null, "name": "n", "status": "pending", "created": "t"}],
            "error": null,
        });
        let lines: Vec<String> = record_lines("", &v)
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(
            lines,
            [
                "error=-",
                "id=web",
                "labels=a=1, b=2",
                "manifest.image.digest=sha256:ab",
                "manifest.kind=snapshot",
                "snapshots=n pending t",
            ]
        );
    }
}
