//! The workload's arithmetic: a deterministic synthetic dataset, a small
//! tanh MLP in f32 with hand-written forward and backward passes, and SGD
//! with momentum.
//!
//! Every function here is a pure function of its inputs, evaluated in a
//! fixed order (no threads, no fast-math reassociation), so two runs of the
//! same binary on the same data produce the same bits. Dot products use
//! `LANES` independent accumulators combined in a fixed order: fast
//! (the compiler vectorises the lanes) and still deterministic.

/// Input features per sample.
pub const INPUT: usize = 64;
/// Outputs per sample (regression targets).
pub const OUTPUT: usize = 16;
/// Independent accumulators of a dot product.
const LANES: usize = 16;

/// splitmix64: a stable, well-mixed 64-bit generator (the data and the
/// initial weights must not change with a dependency's version).
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// A stream keyed by several words (seed, purpose, step, rank, ...).
    pub fn keyed(words: &[u64]) -> Self {
        let mut s = SplitMix(0x5241_494c_4755_4152); // "RAILGUAR"
        for w in words {
            s.0 ^= *w;
            s.next_u64();
        }
        s
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1) from the top 24 bits (exact in f32).
    pub fn next_signed(&mut self) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        2.0 * u - 1.0
    }
}

const PURPOSE_INIT: u64 = 1;
const PURPOSE_DATA: u64 = 2;
const PURPOSE_TEACHER: u64 = 3;

/// The network's shape: `INPUT → hidden → hidden → OUTPUT`, tanh between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub input: usize,
    pub hidden: usize,
    pub output: usize,
}

impl Shape {
    pub fn new(hidden: usize) -> Self {
        Self {
            input: INPUT,
            hidden,
            output: OUTPUT,
        }
    }

    /// (fan_in, fan_out) of each linear layer.
    fn layers(&self) -> [(usize, usize); 3] {
        [
            (self.input, self.hidden),
            (self.hidden, self.hidden),
            (self.hidden, self.output),
        ]
    }

    /// Parameters in the flat vector: per layer the weights (`out × in`,
    /// row-major) then the biases.
    pub fn params(&self) -> usize {
        self.layers().iter().map(|(i, o)| i * o + o).sum()
    }

    /// Offsets of (weights, biases) of each layer in the flat vector.
    fn offsets(&self) -> [(usize, usize); 3] {
        let mut at = 0;
        let mut out = [(0, 0); 3];
        for (k, (i, o)) in self.layers().iter().enumerate() {
            out[k] = (at, at + i * o);
            at += i * o + o;
        }
        out
    }
}

/// Initial parameters: uniform Glorot weights, zero biases.
pub fn init_params(shape: Shape, seed: u64) -> Vec<f32> {
    let mut p = vec![0f32; shape.params()];
    let mut rng = SplitMix::keyed(&[seed, PURPOSE_INIT]);
    for ((fan_in, fan_out), (w, _)) in shape.layers().iter().zip(shape.offsets()) {
        let scale = (6.0 / (fan_in + fan_out) as f32).sqrt();
        for v in &mut p[w..w + fan_in * fan_out] {
            *v = scale * rng.next_signed();
        }
    }
    p
}

/// One batch: inputs (`batch × INPUT`) and targets (`batch × OUTPUT`).
#[derive(Debug, Clone)]
pub struct Batch {
    pub n: usize,
    pub x: Vec<f32>,
    pub t: Vec<f32>,
}

/// The batch of `rank` at `step`: a function of (seed, step, rank) only,
/// so the data cursor of a run is its step. Targets come from a fixed
/// random "teacher": `t = sin(2 · A x)` with `A` from the seed.
pub fn batch(shape: Shape, seed: u64, step: u64, rank: u32, n: usize) -> Batch {
    let mut teacher = SplitMix::keyed(&[seed, PURPOSE_TEACHER]);
    let scale = 1.0 / (shape.input as f32).sqrt();
    let a: Vec<f32> = (0..shape.output * shape.input)
        .map(|_| scale * teacher.next_signed())
        .collect();
    let mut x = vec![0f32; n * shape.input];
    let mut t = vec![0f32; n * shape.output];
    for b in 0..n {
        let mut rng = SplitMix::keyed(&[seed, PURPOSE_DATA, step, u64::from(rank), b as u64]);
        let xb = &mut x[b * shape.input..(b + 1) * shape.input];
        for v in xb.iter_mut() {
            *v = rng.next_signed();
        }
        for o in 0..shape.output {
            let z = dot(&a[o * shape.input..(o + 1) * shape.input], xb);
            t[b * shape.output + o] = (2.0 * z).sin();
        }
    }
    Batch { n, x, t }
}

/// Dot product with `LANES` accumulators, combined in a fixed order.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; LANES];
    let ca = a.chunks_exact(LANES);
    let cb = b.chunks_exact(LANES);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    // Pairwise, fixed.
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            acc[l] += acc[l + width];
        }
    }
    acc[0] + tail
}

/// `y += a · x`.
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

/// `out[b] = W · inp[b] + bias` for each sample (`W` is `o × i`).
fn linear(w: &[f32], bias: &[f32], inp: &[f32], i: usize, o: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n * o];
    for b in 0..n {
        let xb = &inp[b * i..(b + 1) * i];
        for r in 0..o {
            out[b * o + r] = dot(&w[r * i..(r + 1) * i], xb) + bias[r];
        }
    }
    out
}

/// Backward of [`linear`]: accumulates the weight and bias gradients of
/// `dout` into `gw`, `gb`, and returns the gradient of the input (unless
/// `want_dinp` is false).
#[allow(clippy::too_many_arguments)]
fn linear_back(
    w: &[f32],
    inp: &[f32],
    dout: &[f32],
    gw: &mut [f32],
    gb: &mut [f32],
    i: usize,
    o: usize,
    n: usize,
    want_dinp: bool,
) -> Vec<f32> {
    for r in 0..o {
        let row = &mut gw[r * i..(r + 1) * i];
        for b in 0..n {
            let d = dout[b * o + r];
            axpy(row, d, &inp[b * i..(b + 1) * i]);
            gb[r] += d;
        }
    }
    if !want_dinp {
        return Vec::new();
    }
    let mut dinp = vec![0f32; n * i];
    for b in 0..n {
        let db = &mut dinp[b * i..(b + 1) * i];
        for r in 0..o {
            axpy(db, dout[b * o + r], &w[r * i..(r + 1) * i]);
        }
    }
    dinp
}

/// Loss (`½ · mean over samples of Σ (y − t)²`) and its gradient with
/// respect to every parameter, written into `grad` (same layout as the
/// parameters).
pub fn loss_and_grad(shape: Shape, params: &[f32], batch: &Batch, grad: &mut [f32]) -> f32 {
    assert_eq!(params.len(), shape.params(), "parameter count");
    assert_eq!(grad.len(), shape.params(), "gradient length");
    let n = batch.n;
    let [(w1, b1), (w2, b2), (w3, b3)] = shape.offsets();
    let (i0, h, o3) = (shape.input, shape.hidden, shape.output);
    let p = params;
    let mut a1 = linear(&p[w1..b1], &p[b1..b1 + h], &batch.x, i0, h, n);
    a1.iter_mut().for_each(|v| *v = v.tanh());
    let mut a2 = linear(&p[w2..b2], &p[b2..b2 + h], &a1, h, h, n);
    a2.iter_mut().for_each(|v| *v = v.tanh());
    let y = linear(&p[w3..b3], &p[b3..b3 + o3], &a2, h, o3, n);
    let inv_n = 1.0 / n as f32;
    let mut loss = 0f32;
    let mut dy = vec![0f32; n * o3];
    for k in 0..n * o3 {
        let e = y[k] - batch.t[k];
        loss += 0.5 * e * e;
        dy[k] = e * inv_n;
    }
    loss *= inv_n;
    grad.fill(0.0);
    let (g12, g3) = grad.split_at_mut(w3);
    let (g1, g2) = g12.split_at_mut(w2);
    let (g3w, g3b) = g3.split_at_mut(b3 - w3);
    let mut da2 = linear_back(&p[w3..b3], &a2, &dy, g3w, g3b, h, o3, n, true);
    for (d, a) in da2.iter_mut().zip(&a2) {
        *d *= 1.0 - a * a;
    }
    let (g2w, g2b) = g2.split_at_mut(b2 - w2);
    let mut da1 = linear_back(&p[w2..b2], &a1, &da2, g2w, g2b, h, h, n, true);
    for (d, a) in da1.iter_mut().zip(&a1) {
        *d *= 1.0 - a * a;
    }
    let (g1w, g1b) = g1.split_at_mut(b1 - w1);
    linear_back(&p[w1..b1], &batch.x, &da1, g1w, g1b, i0, h, n, false);
    loss
}

/// SGD with momentum: `v ← μ·v + g; w ← w − lr·v`.
pub fn sgd_momentum(params: &mut [f32], velocity: &mut [f32], grad: &[f32], lr: f32, mu: f32) {
    assert!(params.len() == velocity.len() && params.len() == grad.len());
    for ((w, v), g) in params.iter_mut().zip(velocity.iter_mut()).zip(grad) {
        *v = mu * *v + g;
        *w -= lr * *v;
    }
}

/// SHA-256 of the parameters' little-endian bytes, in hex.
pub fn digest(params: &[f32]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for chunk in params.chunks(4096) {
        let bytes: Vec<u8> = chunk.iter().flat_map(|v| v.to_le_bytes()).collect();
        h.update(&bytes);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use crate::ringtrain::model::*;

    fn tiny() -> Shape {
        Shape {
            input: 5,
            hidden: 7,
            output: 3,
        }
    }

    /// Loss in f64 precision terms is not available, so the check uses a
    /// central difference in f32 with a step sized for it and compares
    /// with a relative-plus-absolute tolerance on every parameter.
    #[test]
    fn gradient_matches_finite_differences() {
        let shape = tiny();
        let params = init_params(shape, 42);
        let mut b = batch(shape, 42, 3, 1, 4);
        // Teacher outputs of a 5-input net: scale targets to keep tanh
        // away from saturation.
        b.t.iter_mut().for_each(|t| *t *= 0.5);
        let mut grad = vec![0f32; shape.params()];
        loss_and_grad(shape, &params, &b, &mut grad);
        let mut scratch = vec![0f32; shape.params()];
        let eps = 1e-2f32;
        let mut worst = 0f32;
        for k in 0..shape.params() {
            let mut p = params.clone();
            p[k] = params[k] + eps;
            let up = loss_and_grad(shape, &p, &b, &mut scratch);
            p[k] = params[k] - eps;
            let down = loss_and_grad(shape, &p, &b, &mut scratch);
            let fd = (up - down) / (2.0 * eps);
            let err = (fd - grad[k]).abs() / (1e-3 + fd.abs().max(grad[k].abs()));
            worst = worst.max(err);
            assert!(
                err < 2e-2,
                "param {k}: analytic {} vs finite difference {fd}",
                grad[k]
            );
        }
        assert!(worst.is_finite());
        assert!(grad.iter().any(|g| g.abs() > 1e-4), "gradient is all zero");
    }

    #[test]
    fn data_depends_on_seed_step_and_rank_only() {
        let s = Shape::new(32);
        let a = batch(s, 1, 5, 2, 3);
        let b = batch(s, 1, 5, 2, 3);
        assert_eq!(a.x, b.x);
        assert_eq!(a.t, b.t);
        assert_ne!(batch(s, 1, 6, 2, 3).x, a.x);
        assert_ne!(batch(s, 1, 5, 3, 3).x, a.x);
        assert_ne!(batch(s, 2, 5, 2, 3).x, a.x);
    }

    #[test]
    fn default_shape_gradient_is_over_4_mb() {
        let s = Shape::new(1024);
        assert!(s.params() * 4 >= 4 << 20, "{} params", s.params());
        assert!(s.params() <= 1_500_000);
    }

    #[test]
    fn dot_is_exact_on_integers_and_handles_tails() {
        for len in [0usize, 1, 15, 16, 17, 33, 100] {
            let a: Vec<f32> = (0..len).map(|i| i as f32).collect();
            let b: Vec<f32> = (0..len).map(|i| (i % 3) as f32).collect();
            let want: f32 = (0..len).map(|i| (i * (i % 3)) as f32).sum();
            assert_eq!(dot(&a, &b), want, "len {len}");
        }
    }

    #[test]
    fn training_reduces_the_loss() {
        let s = Shape::new(32);
        let mut p = init_params(s, 9);
        let mut v = vec![0f32; p.len()];
        let mut g = vec![0f32; p.len()];
        let first = loss_and_grad(s, &p, &batch(s, 9, 0, 0, 64), &mut g);
        for step in 0..200 {
            loss_and_grad(s, &p, &batch(s, 9, step, 0, 16), &mut g);
            sgd_momentum(&mut p, &mut v, &g, 0.05, 0.9);
        }
        let last = loss_and_grad(s, &p, &batch(s, 9, 0, 0, 64), &mut g);
        assert!(last < 0.8 * first, "loss {first} -> {last}");
    }
}
