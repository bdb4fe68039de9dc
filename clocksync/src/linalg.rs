//! A small dense Cholesky factorisation for the network solve.
//!
//! The normal matrix of the network least squares is the weighted graph
//! Laplacian with the reference host's row and column removed: symmetric
//! positive definite when the graph is connected. Hosts number at most a few
//! hundred, so a dense O(n³) factorisation (and the inverse factor, whose
//! rows give the host variances and edge leverages) costs milliseconds.

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

    /// The covariance factor `W = (L⁻¹)ᵀ`, row-major: `A⁻¹ = W·Wᵀ`, so
    /// `(A⁻¹)_ij` is the dot product of rows `i` and `j` of `W`. Row `j` of
    /// `W` is column `j` of `L⁻¹`, found by forward substitution on `e_j`
    /// (n³/6 flops, contiguous access).
    pub fn cov_factor(&self) -> CovFactor {
        let n = self.n;
        let mut w = vec![0.0; n * n];
        let mut x = vec![0.0; n];
        for j in 0..n {
            x.iter_mut().for_each(|v| *v = 0.0);
            x[j] = 1.0 / self.l[j * n + j];
            for i in j + 1..n {
                let row = &self.l[i * n..i * n + i];
                let s: f64 = row[j..].iter().zip(&x[j..i]).map(|(l, x)| l * x).sum();
                x[i] = -s / self.l[i * n + i];
            }
            w[j * n..(j + 1) * n].copy_from_slice(&x);
        }
        CovFactor { n, w }
    }
}

/// `W` with `A⁻¹ = W·Wᵀ` (see [`Cholesky::cov_factor`]).
#[derive(Debug, Clone)]
pub(crate) struct CovFactor {
    n: usize,
    w: Vec<f64>,
}

impl CovFactor {
    fn row(&self, i: usize) -> &[f64] {
        &self.w[i * self.n..(i + 1) * self.n]
    }

    /// `(A⁻¹)_ii`.
    pub fn var(&self, i: usize) -> f64 {
        self.row(i).iter().map(|v| v * v).sum()
    }

    /// `Var(x_b - x_a)` where `None` stands for a fixed (zero) unknown.
    pub fn diff_var(&self, a: Option<usize>, b: Option<usize>) -> f64 {
        match (a, b) {
            (None, None) => 0.0,
            (Some(i), None) | (None, Some(i)) => self.var(i),
            (Some(a), Some(b)) => self
                .row(a)
                .iter()
                .zip(self.row(b))
                .map(|(p, q)| (p - q) * (p - q))
                .sum(),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::linalg::*;

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
        let w = c.cov_factor();
        // A·A⁻¹ = I with (A⁻¹)_kj = (e_k - 0)·… built from variances:
        // (A⁻¹)_kj = (var_k + var_j - diff_var(k, j)) / 2.
        let inv = |k: usize, j: usize| (w.var(k) + w.var(j) - w.diff_var(Some(k), Some(j))) / 2.0;
        for i in 0..3 {
            for j in 0..3 {
                let r: f64 = (0..3).map(|k| a[i * 3 + k] * inv(k, j)).sum();
                assert!((r - if i == j { 1.0 } else { 0.0 }).abs() < 1e-12);
            }
        }
        assert_eq!(w.diff_var(Some(1), None), w.var(1));
        assert_eq!(w.diff_var(None, None), 0.0);
    }

    #[test]
    fn rejects_singular() {
        assert!(Cholesky::factor(vec![1.0, 1.0, 1.0, 1.0], 2).is_none());
        assert!(Cholesky::factor(vec![f64::NAN], 1).is_none());
    }
}
