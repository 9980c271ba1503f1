//! Comparing one output of the tested backend with the reference's: normalized mean squared
//! error for floats, exact equality for indices, and a hunt for NaN/Inf (the poison).

use std::fmt;

/// One output of an op, read back to the host.
#[derive(Debug, Clone)]
pub enum Data {
    F32(Vec<f32>),
    U32(Vec<u32>),
}

#[derive(Debug, Clone)]
pub struct Output {
    pub name: &'static str,
    pub data: Data,
}

impl Output {
    pub fn f32(name: &'static str, v: Vec<f32>) -> Self {
        Output { name, data: Data::F32(v) }
    }
    pub fn u32(name: &'static str, v: Vec<u32>) -> Self {
        Output { name, data: Data::U32(v) }
    }
}

/// What a comparison found.
#[derive(Debug, Clone, PartialEq)]
pub enum Mismatch {
    /// NMSE above the limit; the element with the largest absolute error is named.
    Error {
        nmse: f64,
        worst: usize,
        got: f32,
        want: f32,
    },
    /// The tested backend left NaN/Inf (an unwritten, poisoned element, or an overflow).
    NonFinite {
        count: usize,
        first: usize,
        got: f32,
    },
    /// The reference itself is not finite: the case is broken, not the backend.
    ReferenceNonFinite {
        first: usize,
    },
    Length {
        got: usize,
        want: usize,
    },
    /// Index outputs (argmax) differ.
    Index {
        first: usize,
        got: u32,
        want: u32,
        count: usize,
    },
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::Error { nmse, worst, got, want } => {
                write!(f, "nmse {nmse:.3e}; worst at [{worst}]: got {got}, want {want}")
            }
            Mismatch::NonFinite { count, first, got } => {
                write!(f, "{count} non-finite values, first at [{first}] = {got} (unwritten or overflow)")
            }
            Mismatch::ReferenceNonFinite { first } => {
                write!(f, "reference output is not finite at [{first}] (case bug)")
            }
            Mismatch::Length { got, want } => write!(f, "length {got}, want {want}"),
            Mismatch::Index { first, got, want, count } => {
                write!(f, "{count} indices differ, first at [{first}]: got {got}, want {want}")
            }
        }
    }
}

/// `Σ(a-b)² / Σb²`, in f64. Zero when both are zero; infinite when only the reference is.
pub fn nmse(got: &[f32], want: &[f32]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&a, &b) in got.iter().zip(want) {
        let d = a as f64 - b as f64;
        num += d * d;
        den += b as f64 * b as f64;
    }
    if den == 0.0 {
        if num == 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    } else {
        num / den
    }
}

/// Compares one output; returns the NMSE (0 for exact index outputs) or what went wrong.
pub fn compare(got: &Output, want: &Output, limit: f64) -> Result<f64, Mismatch> {
    match (&got.data, &want.data) {
        (Data::F32(g), Data::F32(w)) => compare_f32(g, w, limit),
        (Data::U32(g), Data::U32(w)) => {
            if g.len() != w.len() {
                return Err(Mismatch::Length { got: g.len(), want: w.len() });
            }
            let bad: Vec<usize> = (0..g.len()).filter(|&i| g[i] != w[i]).collect();
            match bad.first() {
                None => Ok(0.0),
                Some(&i) => Err(Mismatch::Index { first: i, got: g[i], want: w[i], count: bad.len() }),
            }
        }
        // Both sides run the same exec code, so kinds cannot differ; a length error says so.
        _ => Err(Mismatch::Length { got: 0, want: 0 }),
    }
}

fn compare_f32(g: &[f32], w: &[f32], limit: f64) -> Result<f64, Mismatch> {
    if g.len() != w.len() {
        return Err(Mismatch::Length { got: g.len(), want: w.len() });
    }
    if let Some(i) = w.iter().position(|x| !x.is_finite()) {
        return Err(Mismatch::ReferenceNonFinite { first: i });
    }
    let bad = g.iter().filter(|x| !x.is_finite()).count();
    if bad > 0 {
        let first = g.iter().position(|x| !x.is_finite()).unwrap_or(0);
        return Err(Mismatch::NonFinite { count: bad, first, got: g[first] });
    }
    let e = nmse(g, w);
    // A NaN NMSE must never pass.
    if e.is_nan() || e > limit {
        let worst = (0..g.len()).max_by(|&a, &b| (g[a] - w[a]).abs().total_cmp(&(g[b] - w[b]).abs())).unwrap_or(0);
        return Err(Mismatch::Error { nmse: e, worst, got: g[worst], want: w[worst] });
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nmse_is_relative() {
        let want = [1.0f32, -2.0, 3.0];
        assert_eq!(nmse(&want, &want), 0.0);
        let got = [1.0f32, -2.0, 3.5];
        assert_eq!(nmse(&got, &want), 0.25 / 14.0);
        // Scaling both sides (by a power of two, exactly) leaves it unchanged.
        assert_eq!(nmse(&got.map(|x| x * 8.0), &want.map(|x| x * 8.0)), 0.25 / 14.0);
        assert_eq!(nmse(&[0.0], &[0.0]), 0.0);
        assert_eq!(nmse(&[1.0], &[0.0]), f64::INFINITY);
    }

    #[test]
    fn nan_in_tested_output_fails_even_with_loose_limit() {
        let want = Output::f32("out", vec![1.0, 2.0, 3.0]);
        let got = Output::f32("out", vec![1.0, f32::NAN, f32::INFINITY]);
        match compare(&got, &want, 1e30) {
            Err(Mismatch::NonFinite { count, first, got }) => assert!(count == 2 && first == 1 && got.is_nan()),
            other => panic!("expected a non-finite mismatch, got {other:?}"),
        }
    }

    #[test]
    fn error_above_limit_names_worst_element() {
        let want = Output::f32("out", vec![1.0, 2.0, 3.0, 4.0]);
        let got = Output::f32("out", vec![1.0, 2.0, 3.5, 4.0]);
        match compare(&got, &want, 1e-7) {
            Err(Mismatch::Error { worst, got, want, .. }) => assert_eq!((worst, got, want), (2, 3.5, 3.0)),
            other => panic!("expected an error mismatch, got {other:?}"),
        }
        assert!(compare(&got, &want, 1.0).is_ok());
    }

    #[test]
    fn indices_compare_exactly() {
        let want = Output::u32("ids", vec![3, 4, 5]);
        assert_eq!(compare(&want, &want, 0.0), Ok(0.0));
        let got = Output::u32("ids", vec![3, 9, 5]);
        assert_eq!(compare(&got, &want, 1.0), Err(Mismatch::Index { first: 1, got: 9, want: 4, count: 1 }));
    }
}
