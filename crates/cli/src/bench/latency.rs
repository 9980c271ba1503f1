//! Latency summaries as serving benchmarks print them: mean, median, p90, p99 (in ms).

use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub mean: f64,
    pub median: f64,
    pub p90: f64,
    pub p99: f64,
}

/// Percentile `q` in [0, 100] of sorted values, interpolated linearly between neighbours
/// (numpy's default), so small samples give the numbers people check them against.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = q / 100.0 * (sorted.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}

/// Summary of values in seconds, reported in milliseconds; None when there are none.
pub fn summarize_ms(values_s: &[f64]) -> Option<Summary> {
    let mut v: Vec<f64> = values_s.iter().copied().filter(|x| x.is_finite()).map(|x| x * 1e3).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    Some(Summary {
        n: v.len(),
        mean: v.iter().sum::<f64>() / v.len() as f64,
        median: percentile(&v, 50.0),
        p90: percentile(&v, 90.0),
        p99: percentile(&v, 99.0),
    })
}

pub fn to_json(s: Option<Summary>) -> Value {
    match s {
        Some(s) => json!({"n": s.n, "mean": s.mean, "median": s.median, "p90": s.p90, "p99": s.p99}),
        None => Value::Null,
    }
}

/// `12.3` or `-` for a table cell.
pub fn cell(s: Option<Summary>, pick: impl Fn(&Summary) -> f64) -> String {
    s.map_or_else(|| "-".into(), |s| format!("{:.1}", pick(&s)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 50.0), 2.5);
        assert!((percentile(&v, 90.0) - 3.7).abs() < 1e-12);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&v, 100.0), 4.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
    }

    #[test]
    fn summary_is_in_ms_and_skips_non_finite() {
        let s = summarize_ms(&[0.001, 0.003, f64::NAN, 0.002]).unwrap();
        assert_eq!(s.n, 3);
        assert!((s.mean - 2.0).abs() < 1e-9);
        assert!((s.median - 2.0).abs() < 1e-9);
        assert!(summarize_ms(&[]).is_none());
    }
}
