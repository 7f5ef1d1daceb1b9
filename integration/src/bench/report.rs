//! `bench/RESULTS.md`: one table per group, the three setups side by side with ratios, and
//! the gnuplot script of the memory plot.

use std::fmt::Write;

use super::stats::{cell, ratio, summarize, Unit};

/// The setups, in the report's column order.
pub const SETUPS: [&str; 3] = ["chalk shim", "runc shim + runsc", "runsc alone"];
pub const CHALK: usize = 0;
pub const RUNC_SHIM: usize = 1;
pub const RUNSC: usize = 2;

/// One operation, measured in each setup that can do it.
#[derive(Debug, Clone)]
pub struct Row {
    pub name: String,
    pub unit: Unit,
    pub samples: [Vec<f64>; 3],
}

impl Row {
    pub fn new(name: &str, unit: Unit) -> Self {
        Row {
            name: name.to_string(),
            unit,
            samples: Default::default(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Group {
    pub title: String,
    /// How the rows were measured, in a sentence or two.
    pub about: String,
    pub rows: Vec<Row>,
}

/// Numbers with no setup columns (hashing throughput): one value column.
#[derive(Debug, Clone)]
pub struct Plain {
    pub title: String,
    pub about: String,
    pub rows: Vec<(String, Unit, Vec<f64>)>,
}

/// Where and with what the numbers were taken.
#[derive(Debug, Clone, Default)]
pub struct Meta {
    pub date: String,
    pub machine: String,
    pub containerd: String,
    pub runsc: String,
    pub mode: String,
}

/// The whole results file.
pub fn render(
    meta: &Meta,
    groups: &[Group],
    plain: &[Plain],
    plot: Option<&str>,
    notes: &[String],
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# chalk-shim benchmarks\n");
    let _ = writeln!(
        out,
        "Written by `scripts/bench` ({}). Each cell is the median with (min–max) over the \
         runs; ratios are of medians (below 1× the chalk shim is faster). \
         \"—\": the setup cannot do it.\n",
        meta.mode
    );
    let _ = writeln!(out, "- date: {}", meta.date);
    let _ = writeln!(out, "- machine: {}", meta.machine);
    let _ = writeln!(out, "- containerd: {}", meta.containerd);
    let _ = writeln!(out, "- runsc: {}", meta.runsc);
    for g in groups {
        let _ = writeln!(out, "\n## {}\n\n{}\n", g.title, g.about);
        let _ = writeln!(
            out,
            "| | {} | {} | {} | chalk ÷ runsc alone | chalk ÷ runc shim |",
            SETUPS[CHALK], SETUPS[RUNC_SHIM], SETUPS[RUNSC]
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|");
        for r in &g.rows {
            let s = r.samples.each_ref().map(|v| summarize(v));
            let cells = s
                .each_ref()
                .map(|s| s.map_or_else(|| "—".to_string(), |s| cell(&s, r.unit)));
            let vs = |i: usize| match (&s[CHALK], &s[i]) {
                (Some(a), Some(b)) => ratio(a, b).unwrap_or_else(|| "—".into()),
                _ => "—".into(),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} |",
                r.name,
                cells[0],
                cells[1],
                cells[2],
                vs(RUNSC),
                vs(RUNC_SHIM)
            );
        }
    }
    for p in plain {
        let _ = writeln!(out, "\n## {}\n\n{}\n", p.title, p.about);
        let _ = writeln!(out, "| | median (min–max) |\n|---|---|");
        for (name, unit, values) in &p.rows {
            let v = summarize(values).map_or_else(|| "—".to_string(), |s| cell(&s, *unit));
            let _ = writeln!(out, "| {name} | {v} |");
        }
    }
    if let Some(png) = plot {
        let _ = writeln!(
            out,
            "\n## Plot: time against sandbox memory\n\n![snapshot, fork and resume time against sandbox memory]({png})"
        );
    }
    if !notes.is_empty() {
        let _ = writeln!(out, "\n## Notes\n");
        for n in notes {
            let _ = writeln!(out, "- {n}");
        }
    }
    out
}

/// One point of the memory plot: megabytes written, then the median seconds of chalk's
/// snapshot, fork and resume and runsc alone's.
pub type PlotPoint = (u64, [Option<f64>; 6]);

pub const PLOT_SERIES: [&str; 6] = [
    "chalk snapshot",
    "chalk fork",
    "chalk resume",
    "runsc checkpoint",
    "runsc restore (fork)",
    "runsc restore (resume)",
];

/// The gnuplot data file: one line per point, `NaN` where a value is missing.
pub fn plot_data(points: &[PlotPoint]) -> String {
    let mut out = String::from("# MB");
    for s in PLOT_SERIES {
        let _ = write!(out, "\t{}", s.replace(' ', "_"));
    }
    out.push('\n');
    for (mb, values) in points {
        let _ = write!(out, "{mb}");
        for v in values {
            match v {
                Some(v) => {
                    let _ = write!(out, "\t{v:.4}");
                }
                None => out.push_str("\tNaN"),
            }
        }
        out.push('\n');
    }
    out
}

/// The gnuplot script drawing `data` into `png`.
pub fn plot_script(data: &str, png: &str, title: &str) -> String {
    let mut plots = Vec::new();
    for (i, s) in PLOT_SERIES.iter().enumerate() {
        let dash = if i < 3 { 1 } else { 2 };
        plots.push(format!(
            "'{data}' using 1:{} with linespoints dashtype {dash} linewidth 2 title '{s}'",
            i + 2
        ));
    }
    format!(
        "set terminal png size 900,560 noenhanced\nset output '{png}'\nset title '{title}'\n\
         set xlabel 'memory written by the sandbox (MB)'\nset ylabel 'seconds'\n\
         set key top left\nset grid\n\
         plot {}\n",
        plots.join(", \\\n     ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_put_setups_side_by_side_with_ratios() {
        let mut row = Row::new("exec", Unit::Millis);
        row.samples = [vec![100.0, 120.0, 110.0], vec![], vec![50.0]];
        let g = Group {
            title: "Lifecycle".into(),
            about: "ctr".into(),
            rows: vec![row],
        };
        let p = Plain {
            title: "Hashing".into(),
            about: "1 GiB".into(),
            rows: vec![("sha256sum".into(), Unit::GigabytesPerSecond, vec![0.5])],
        };
        let text = render(
            &Meta::default(),
            &[g],
            &[p],
            Some("memory.png"),
            &["n".into()],
        );
        assert!(text.contains("| sha256sum | 0.50 GB/s |"), "{text}");
        assert!(
            text.contains("| exec | 110 ms (100–120) | — | 50.0 ms | 2.20× | — |"),
            "{text}"
        );
        assert!(text.contains("![snapshot, fork and resume"), "{text}");
        assert!(text.contains("\n- n\n"), "{text}");
    }

    #[test]
    fn plot_data_marks_missing_values() {
        let data = plot_data(&[(64, [Some(0.5), None, None, None, None, Some(1.0)])]);
        assert!(
            data.ends_with("64\t0.5000\tNaN\tNaN\tNaN\tNaN\t1.0000\n"),
            "{data}"
        );
        let script = plot_script("d.dat", "m.png", "t");
        assert!(script.contains("using 1:7") && script.contains("set output 'm.png'"));
    }
}
