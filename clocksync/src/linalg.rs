//! A small dense Cholesky factorisation for the network solve.
//!
//! The normal matrix of the network least squares is the weighted graph
//! Laplacian with the reference host's row and column removed: symmetric
//! positive definite when the graph is connected. Hosts number at most a few
//! hundred, so a dense O(n³) factorisation (and the explicit inverse, whose
//! entries give the host variances and edge leverages) costs milliseconds.

// Index loops read best in dense linear algebra.
#![allow(clippy::needless_range_loop)]

/// Lower-triangular Cholesky factor `L` of an SPD matrix `A = L·Lᵀ`,
/// row-major `n×n`.
#[derive(Debug, Clone)]
pub(crate) struct Cholesky {
    n: usize,
    l: Vec<f64>,
}

impl Cholesky {
    /// Factor the row-major `n×n` matrix `a` (only its lower triangle is
    /// read). `None` if it is not numerically positive definite.
    pub fn factor(mut a: Vec<f64>, n: usize) -> Option<Self> {
        assert_eq!(a.len(), n * n);
        for j in 0..n {
            let mut d = a[j * n + j];
            for k in 0..j {
                d -= a[j * n + k] * a[j * n + k];
            }
            if d.is_nan() || d <= 0.0 || !d.is_finite() {
                return None;
            }
            let d = d.sqrt();
            a[j * n + j] = d;
            for i in j + 1..n {
                let mut s = a[i * n + j];
                for k in 0..j {
                    s -= a[i * n + k] * a[j * n + k];
                }
                a[i * n + j] = s / d;
            }
            for k in j + 1..n {
                a[j * n + k] = 0.0;
            }
        }
        Some(Self { n, l: a })
    }

    /// Solve `A·x = b` in place.
    pub fn solve(&self, b: &mut [f64]) {
        let n = self.n;
        assert_eq!(b.len(), n);
        for i in 0..n {
            let mut s = b[i];
            for k in 0..i {
                s -= self.l[i * n + k] * b[k];
            }
            b[i] = s / self.l[i * n + i];
        }
        for i in (0..n).rev() {
            let mut s = b[i];
            for k in i + 1..n {
                s -= self.l[k * n + i] * b[k];
            }
            b[i] = s / self.l[i * n + i];
        }
    }

    /// The inverse `A⁻¹`, row-major (symmetric).
    pub fn inverse(&self) -> Vec<f64> {
        let n = self.n;
        // M = L⁻¹ (lower triangular), then A⁻¹ = Mᵀ·M.
        let mut m = vec![0.0; n * n];
        for j in 0..n {
            m[j * n + j] = 1.0 / self.l[j * n + j];
            for i in j + 1..n {
                let mut s = 0.0;
                for k in j..i {
                    s -= self.l[i * n + k] * m[k * n + j];
                }
                m[i * n + j] = s / self.l[i * n + i];
            }
        }
        let mut inv = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..=i {
                let mut s = 0.0;
                for k in i..n {
                    s += m[k * n + i] * m[k * n + j];
                }
                inv[i * n + j] = s;
                inv[j * n + i] = s;
            }
        }
        inv
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn solves_and_inverts_spd() {
        let a = vec![4.0, 2.0, 0.4, 2.0, 5.0, 1.0, 0.4, 1.0, 3.0];
        let c = Cholesky::factor(a.clone(), 3).unwrap();
        let mut x = vec![1.0, 2.0, 3.0];
        c.solve(&mut x);
        for i in 0..3 {
            let r: f64 = (0..3).map(|k| a[i * 3 + k] * x[k]).sum();
            assert!((r - (i as f64 + 1.0)).abs() < 1e-12);
        }
        let inv = c.inverse();
        for i in 0..3 {
            for j in 0..3 {
                let r: f64 = (0..3).map(|k| a[i * 3 + k] * inv[k * 3 + j]).sum();
                assert!((r - if i == j { 1.0 } else { 0.0 }).abs() < 1e-12);
            }
        }
    }

    #[test]
    fn rejects_singular() {
        assert!(Cholesky::factor(vec![1.0, 1.0, 1.0, 1.0], 2).is_none());
        assert!(Cholesky::factor(vec![f64::NAN], 1).is_none());
    }
}
