//! What the fuzz targets share: reading the knobs (limits, read sizes) off the front of an
//! input, so the fuzzer varies them together with the data.

/// The front of a fuzz input, read as knobs; [`Knobs::rest`] is the data.
pub struct Knobs<'a> {
    bytes: &'a [u8],
}

impl<'a> Knobs<'a> {
    /// Reads knobs off the front of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Knobs { bytes }
    }

    /// The next byte, or 0 once the input is used up.
    pub fn byte(&mut self) -> u8 {
        match self.bytes.split_first() {
            Some((&b, rest)) => {
                self.bytes = rest;
                b
            }
            None => 0,
        }
    }

    /// A limit: small ones (1..=64, where the edge cases are) most of the time, sometimes the
    /// production-like `large` (at least 1).
    pub fn limit(&mut self, large: usize) -> usize {
        match self.byte() {
            b @ 0..=191 => usize::from(b % 64) + 1,
            b => large.max(1) + usize::from(b - 192),
        }
    }

    /// Up to 3 read sizes of 1..=32 bytes, cycled by the caller (none: one read of
    /// everything).
    pub fn reads(&mut self) -> Vec<usize> {
        let n = self.byte() % 4;
        (0..n).map(|_| usize::from(self.byte() % 32) + 1).collect()
    }

    /// The rest of the input: the data.
    pub fn rest(self) -> &'a [u8] {
        self.bytes
    }
}

/// `data` cut into pieces of the given sizes (cycled; none: one piece).
pub fn chunks<'a>(data: &'a [u8], sizes: &[usize]) -> Vec<&'a [u8]> {
    if sizes.is_empty() {
        return vec![data];
    }
    let mut out = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < data.len() {
        let n = sizes[i % sizes.len()].max(1).min(data.len() - at);
        out.push(&data[at..at + n]);
        at += n;
        i += 1;
    }
    out
}
