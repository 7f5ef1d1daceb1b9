//! Samples and their summary: min, median and max, as the report shows them.

/// What a row's numbers are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Millis,
    Megabytes,
    GigabytesPerSecond,
}

impl Unit {
    pub fn suffix(self) -> &'static str {
        match self {
            Unit::Millis => "ms",
            Unit::Megabytes => "MB",
            Unit::GigabytesPerSecond => "GB/s",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub min: f64,
    pub median: f64,
    pub max: f64,
    pub n: usize,
}

/// The summary of `values`; None when there are none. The median of an even count is the
/// mean of the middle two.
pub fn summarize(values: &[f64]) -> Option<Summary> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    let median = if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    };
    Some(Summary {
        min: v[0],
        median,
        max: v[v.len() - 1],
        n: v.len(),
    })
}

/// A number with a precision that suits its size.
pub fn number(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// `median (min–max)` with the unit; a single sample alone.
pub fn cell(s: &Summary, unit: Unit) -> String {
    if s.n == 1 || s.min == s.max {
        return format!("{} {}", number(s.median), unit.suffix());
    }
    format!(
        "{} {} ({}–{})",
        number(s.median),
        unit.suffix(),
        number(s.min),
        number(s.max)
    )
}

/// `ours / theirs` of the medians, as `1.23×`.
pub fn ratio(ours: &Summary, theirs: &Summary) -> Option<String> {
    (theirs.median > 0.0).then(|| format!("{:.2}×", ours.median / theirs.median))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_of_odd_and_even_counts() {
        let s = summarize(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.min, s.median, s.max, s.n), (1.0, 2.0, 3.0, 3));
        assert_eq!(summarize(&[4.0, 1.0, 2.0, 3.0]).unwrap().median, 2.5);
        assert!(summarize(&[]).is_none());
    }

    #[test]
    fn cells_and_ratios_read_plainly() {
        let s = summarize(&[250.0, 310.5, 290.0]).unwrap();
        assert_eq!(cell(&s, Unit::Millis), "290 ms (250–310)");
        let one = summarize(&[1.234]).unwrap();
        assert_eq!(cell(&one, Unit::GigabytesPerSecond), "1.23 GB/s");
        assert_eq!(ratio(&s, &one).as_deref(), Some("235.01×"));
        let zero = summarize(&[0.0]).unwrap();
        assert_eq!(ratio(&s, &zero), None);
    }
}
