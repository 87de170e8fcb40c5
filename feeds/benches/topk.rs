//! Per-event cost of the top-k statistic, exact [`TopK`] against the bounded
//! [`HeavyHitters`], as the number of distinct keys grows:
//! `cargo bench -p feeds --bench topk -- --quick`.
//!
//! The stream is the flat-out case: 50,000 events/s, one key per event drawn
//! uniformly from `n` distinct values (10^2 … 10^7), the default window (60 s)
//! and k (10). Uniform is the worst case for both structures: the window
//! holds min(n, ~3·10^6) distinct keys for `TopK`, and every key is new to a
//! full Space-Saving summary. Each structure is first filled with a whole
//! window (61 s of events) so the measurement is the steady state.
//!
//! - `record/<structure>/<n>`: one event as a feed applies it, `record` then
//!   `expire` at the event's time (the clock advances 20 µs per event);
//! - `top/<structure>/<n>`: one `top()` on the filled window;
//! - `keygen/<n>`: making the key alone, to subtract from `record`;
//! - `record/HeavyHitters-scripts/<n>`, `keygen/scripts-<n>`: the same with keys
//!   spelled as hashtags are on a real stream, in every script (`#Тег42`,
//!   `#ΟΔΟΣ7`, `#标签9`, `#İstanbul3`, emoji, most of them not lowercase ASCII),
//!   which the summary case-folds before counting.
//!
//! After filling, the size of each structure's JSON checkpoint is printed.
//!
//! Kept cheap to compile (criterion without rayon, plots or HTML reports), as
//! `clippy --all-targets` builds it.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, SamplingMode, criterion_group, criterion_main};
use feeds::stats::TopK;
use feeds::stats::heavy_hitters::{DEFAULT_CAPACITY, HeavyHitters};

/// Events per second of the flat-out case.
const RATE: i64 = 50_000;
/// Microseconds between two events at [`RATE`].
const STEP_US: i64 = 1_000_000 / RATE;
/// The default top-k window.
const WINDOW_SECS: u64 = 60;
/// The default number of keys reported.
const K: usize = 10;
/// Distinct values the keys are drawn from.
const CARDINALITIES: [u64; 4] = [100, 10_000, 1_000_000, 10_000_000];

/// The stem of every key of the plain stream.
const PLAIN: &[&str] = &["tag"];
/// Stems of the stream spelled in many scripts: cased and caseless, folded
/// to themselves or not (a final sigma, a dotted capital I, a sharp s).
const SCRIPTS: &[&str] = &[
    "tag",
    "Tag",
    "Тег",
    "тег",
    "ΟΔΟΣ",
    "οδος",
    "标签",
    "タグ",
    "وسم",
    "टैग",
    "🦀",
    "👩🏽‍💻",
    "Straße",
    "İstanbul",
    "한국어",
    "ТЕГ",
];

/// A seeded stream of keys `<stem><i>`, `i` uniform in `0..n` and the stem
/// chosen by `i`, written into one reused buffer so the benchmark measures
/// the structures, not allocation.
struct Keys {
    state: u64,
    n: u64,
    stems: &'static [&'static str],
    buf: String,
}

impl Keys {
    fn new(n: u64, stems: &'static [&'static str]) -> Self {
        Self {
            state: 0x5EED ^ n,
            n,
            stems,
            buf: String::with_capacity(32),
        }
    }

    fn next_key(&mut self) -> &str {
        // splitmix64, then a multiply-shift into 0..n (no modulo bias to speak of).
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let mut i = ((u128::from(z) * u128::from(self.n)) >> 64) as u64;
        self.buf.clear();
        self.buf
            .push_str(self.stems[(i % self.stems.len() as u64) as usize]);
        let mut digits = [0u8; 20];
        let mut len = 0;
        loop {
            digits[len] = b'0' + (i % 10) as u8;
            len += 1;
            i /= 10;
            if i == 0 {
                break;
            }
        }
        for &d in digits[..len].iter().rev() {
            self.buf.push(char::from(d));
        }
        &self.buf
    }
}

/// The two structures behind one interface, so each is driven identically.
trait Window {
    const NAME: &'static str;
    fn fresh() -> Self;
    fn event(&mut self, t_us: i64, key: &str);
    fn top(&self) -> Vec<(String, u64)>;
    fn checkpoint_bytes(&self) -> usize;
}

impl Window for TopK {
    const NAME: &'static str = "TopK";
    fn fresh() -> Self {
        TopK::new(K, WINDOW_SECS)
    }
    fn event(&mut self, t_us: i64, key: &str) {
        self.record(t_us, [key]);
        self.expire(t_us);
    }
    fn top(&self) -> Vec<(String, u64)> {
        TopK::top(self)
    }
    fn checkpoint_bytes(&self) -> usize {
        serde_json::to_vec(self).map_or(0, |v| v.len())
    }
}

impl Window for HeavyHitters {
    const NAME: &'static str = "HeavyHitters";
    fn fresh() -> Self {
        HeavyHitters::new(K, WINDOW_SECS, DEFAULT_CAPACITY)
    }
    fn event(&mut self, t_us: i64, key: &str) {
        self.record(t_us, [key]);
        self.expire(t_us);
    }
    fn top(&self) -> Vec<(String, u64)> {
        HeavyHitters::top(self)
    }
    fn checkpoint_bytes(&self) -> usize {
        serde_json::to_vec(self).map_or(0, |v| v.len())
    }
}

/// A structure filled with a whole window, with the stream that filled it.
struct Filled<W> {
    w: W,
    keys: Keys,
    t_us: i64,
}

impl<W: Window> Filled<W> {
    fn new(n: u64, stems: &'static [&'static str]) -> Self {
        let mut f = Self {
            w: W::fresh(),
            keys: Keys::new(n, stems),
            t_us: 1_700_000_000_000_000,
        };
        for _ in 0..(WINDOW_SECS as i64 + 1) * RATE {
            f.event();
        }
        eprintln!(
            "{} n={n}: checkpoint {} bytes after a full window",
            W::NAME,
            f.w.checkpoint_bytes()
        );
        f
    }

    fn event(&mut self) {
        self.t_us += STEP_US;
        self.w.event(self.t_us, black_box(self.keys.next_key()));
    }
}

/// Measures `record` and `top` on a filled structure. The filling (seconds
/// for `TopK` at high cardinality) happens inside the first benchmark that
/// runs, so a filtered run (`-- top/HeavyHitters`) skips the others'.
fn bench_one<W: Window>(c: &mut Criterion, n: u64) {
    let mut filled: Option<Filled<W>> = None;
    let mut record = c.benchmark_group("record");
    record
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    record.bench_function(BenchmarkId::new(W::NAME, n), |b| {
        let f = filled.get_or_insert_with(|| Filled::new(n, PLAIN));
        b.iter(|| f.event())
    });
    record.finish();
    let mut top = c.benchmark_group("top");
    // The exact top() sorts millions of keys at high cardinality: a few flat
    // samples instead of criterion's linear ramp of iterations.
    top.sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    top.bench_function(BenchmarkId::new(W::NAME, n), |b| {
        let f = filled.get_or_insert_with(|| Filled::new(n, PLAIN));
        b.iter(|| black_box(f.w.top()))
    });
    top.finish();
}

fn topk(c: &mut Criterion) {
    let mut keygen = c.benchmark_group("keygen");
    for n in CARDINALITIES {
        let mut keys = Keys::new(n, PLAIN);
        keygen.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| black_box(keys.next_key().len()))
        });
        let mut keys = Keys::new(n, SCRIPTS);
        keygen.bench_function(BenchmarkId::from_parameter(format!("scripts-{n}")), |b| {
            b.iter(|| black_box(keys.next_key().len()))
        });
    }
    keygen.finish();
    for n in CARDINALITIES {
        bench_one::<TopK>(c, n);
        bench_one::<HeavyHitters>(c, n);
    }
    // The bounded summary only: the exact structure is the reference, and its
    // cost does not depend on how keys are spelled beyond their length.
    let mut record = c.benchmark_group("record");
    record
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for n in CARDINALITIES {
        let mut filled: Option<Filled<HeavyHitters>> = None;
        let id = BenchmarkId::new(format!("{}-scripts", HeavyHitters::NAME), n);
        record.bench_function(id, |b| {
            let f = filled.get_or_insert_with(|| Filled::new(n, SCRIPTS));
            b.iter(|| f.event())
        });
    }
    record.finish();
}

criterion_group!(benches, topk);
criterion_main!(benches);
