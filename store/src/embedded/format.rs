//! The journal's record: what one commit writes.
//!
//! A record is a header that says what the commit holds (which capped collections got which
//! positions, which change sequence numbers, how many checkpoints) and the entries themselves,
//! cut into blocks of about [`BLOCK_RAW`] bytes, each LZ4-compressed where that makes it
//! smaller. The header is never compressed, so a reader can tell from it alone whether a
//! record holds what it looks for, and read only the blocks it needs.
//!
//! ```text
//! fixed header (64 bytes, little-endian)
//!   0 magic u32 | 4 total_len u32 | 8 crc u32 (CRC-32 of bytes 12..total_len) | 12 header_len u32
//!  16 lsn u64 | 24 commit time µs i64 | 32 first change u64 | 40 changes u32 | 44 checkpoints u32
//!  48 sections u16 | 50 blocks u16 | 52 prev u32 (the previous record's crc; 0 for a
//!  segment's first record, and in records written before it was kept) | 56 reserved
//! sections: name_len u8, name, first position u64, count u32, oldest position after the commit u64
//! blocks:   first entry u32, stored length u32, raw length u32, codec u8
//! block data, one block after the other
//! ```
//!
//! Entries, in this order: each section's documents (`len u32`, JSON), the changes (`op u8`,
//! collection, key, before and after images as `len u32` + JSON or [`NONE`]), the checkpoints
//! (feed, JSON). The record is padded with zeros to [`ALIGN`] bytes on disk.

use std::borrow::Cow;

use serde_json::Value;

use crate::{ChangeOp, Document, Result, StoreError};

/// `TRJ1`.
pub(crate) const MAGIC: u32 = u32::from_le_bytes(*b"TRJ1");
/// Records start and end on this boundary: the logical block of the disks `O_DIRECT` writes to.
pub(crate) const ALIGN: usize = 512;
/// The fixed part of the header.
pub(crate) const FIXED: usize = 64;
/// A block holds entries up to about this many bytes before compression: a reader of one
/// document decompresses at most this much (plus the one entry that crossed the mark).
pub(crate) const BLOCK_RAW: usize = 32 * 1024;
/// The length written for an absent image.
pub(crate) const NONE: u32 = u32::MAX;
/// Block codecs.
const RAW: u8 = 0;
const LZ4: u8 = 1;

/// A stored document (a journal entry, an image, a keyed value) read back.
///
/// Every stored document was written by `serde_json` from a document that passed the
/// ingester's or the store's checks, and its bytes are checksummed, so this parser never sees
/// the world's input: it is sonic-rs rather than `serde_json`, because a tail catching up
/// spends most of its time here and sonic-rs decodes the same documents in less CPU
/// (docs/ARCHITECTURE.md, "Dependencies, and why"). sonic-rs rounds floats exactly, as
/// `serde_json`'s `float_roundtrip` does, but reads `-0.0` as `0.0`: a document that may hold
/// a negative number starting `-0` goes to `serde_json` instead, so every document reads back
/// as the one written (`stored_documents_read_back_as_written`).
pub(crate) fn parse_doc(json: &[u8]) -> Result<Document> {
    if may_hold_negative_zero(json) {
        return Ok(serde_json::from_slice(json)?);
    }
    sonic_rs::from_slice(json).map_err(unparsable)
}

/// Only the field `paths` of a stored document (split, none covering another:
/// [`crate::query::only_paths`]), in a document of their own (`user.screen_name` gives
/// `{"user": {"screen_name": ...}}`): the rest is skipped without being decoded, which is most
/// of the cost of a query over tweet-like events that groups by one or two fields. A path
/// that meets an array or a scalar before its end takes that value whole, so that a query
/// reaching through arrays finds what it would in the whole document. Values read as
/// [`parse_doc`] reads them.
///
/// The reading stops once every path's first field was met: a stored document is written
/// from a map, so no field appears twice.
pub(crate) fn parse_paths(json: &[u8], paths: &[Vec<String>]) -> Result<Document> {
    let mut doc = Document::new();
    // One path through objects (a time range's received time): found in one pass, without
    // skipping over and reading again the objects on the way. Anything else (the path
    // missing, or meeting an array or a scalar) is left to the walk below.
    if let [path] = paths
        && path.len() > 1
        && let Ok(v) = sonic_rs::get(json, path)
    {
        put(&mut doc, path, parse_value(v.as_raw_str())?);
        return Ok(doc);
    }
    let first = |i: usize| paths[i].first();
    // The distinct first fields (a few paths: no set needed).
    let mut left = (0..paths.len())
        .filter(|&i| first(i).is_some() && (0..i).all(|j| first(j) != first(i)))
        .count();
    for kv in sonic_rs::to_object_iter(json) {
        if left == 0 {
            break;
        }
        let (k, v) = kv.map_err(unparsable)?;
        let mut wanted = paths
            .iter()
            .filter(|p| p.first().map(String::as_str) == Some(&*k));
        let Some(first) = wanted.next() else {
            continue;
        };
        left -= 1;
        let raw = v.as_raw_str();
        for path in std::iter::once(first).chain(wanted) {
            take_path(raw, &path[1..], path, &mut doc)?;
        }
    }
    Ok(doc)
}

/// Puts the value at `rest` below `raw` (the JSON of `path`'s first part) into `doc`.
fn take_path(raw: &str, rest: &[String], path: &[String], doc: &mut Document) -> Result<()> {
    // The whole rest at once when it runs through objects (the common case).
    if !rest.is_empty()
        && raw.starts_with('{')
        && let Ok(v) = sonic_rs::get(raw, rest)
    {
        put(doc, path, parse_value(v.as_raw_str())?);
        return Ok(());
    }
    let (mut raw, mut depth) = (Cow::Borrowed(raw), 0);
    while depth < rest.len() && raw.starts_with('{') {
        match sonic_rs::get(&*raw, [rest[depth].as_str()]) {
            // Only the value found is copied: a few bytes at the end of a path.
            Ok(v) => raw = Cow::Owned(v.as_raw_str().to_owned()),
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(unparsable(e)),
        }
        depth += 1;
    }
    let value = parse_value(&raw)?;
    // Where the path stops (its end, or an array or scalar on the way).
    put(doc, &path[..depth + 1], value);
    Ok(())
}

/// Puts `value` at `at` in `doc`, making the objects on the way.
fn put(doc: &mut Document, at: &[String], value: Value) {
    let Some((last, parents)) = at.split_last() else {
        return;
    };
    let mut node = doc;
    for part in parents {
        let slot = node
            .entry(part.clone())
            .or_insert_with(|| Value::Object(Document::new()));
        match slot {
            Value::Object(m) => node = m,
            // Taken whole already by a shorter path of the same prefix.
            _ => return,
        }
    }
    node.insert(last.clone(), value);
}

/// One stored value as [`parse_doc`] reads it.
fn parse_value(raw: &str) -> Result<Value> {
    // A value that is itself a number has no separator before it to look for.
    if raw.starts_with("-0") || may_hold_negative_zero(raw.as_bytes()) {
        Ok(serde_json::from_str(raw)?)
    } else {
        sonic_rs::from_str(raw).map_err(unparsable)
    }
}

fn unparsable(e: sonic_rs::Error) -> StoreError {
    StoreError::Engine {
        engine: "embedded",
        message: format!("a stored document does not parse: {e}"),
    }
}

/// Appends `doc` to `out` as compact JSON: every stored document (an event, an image, a keyed
/// value) is written here.
///
/// The bytes are the ones `serde_json` writes: `stored_documents_are_written_as_serde_json_writes`
/// and `stored_documents_read_back_as_written` compare them byte for byte over every script,
/// escape, float and integer edge, so the stored format does not depend on the writer.
/// sonic-rs writes them in less CPU (its string escaping and number formatting), and every
/// event is written once per commit on the ingester's thread, every keyed value on the writer's.
pub(crate) fn write_doc(doc: &Document, out: &mut Vec<u8>) -> Result<()> {
    sonic_rs::to_writer(out, doc).map_err(unencodable)
}

/// [`write_doc`] as shared text (a keyed value, kept by the writer's cache and its images).
///
/// Encoded into a buffer kept per thread, then copied once into the `Arc`: encoding straight
/// into a new string grows it a few times on the way to a document's size, an allocation and
/// a copy each, for every keyed value written.
pub(crate) fn doc_json(doc: &Document) -> Result<std::sync::Arc<str>> {
    /// A buffer that grew past this for a large document is let go after it: the writer's
    /// thread keeps its buffer for as long as it runs.
    const KEEP: usize = 64 * 1024;
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    SCRATCH.with(|scratch| {
        let mut buf = scratch.borrow_mut();
        buf.clear();
        let encoded = write_doc(doc, &mut buf).and_then(|()| {
            std::str::from_utf8(&buf)
                .map(std::sync::Arc::from)
                .map_err(|e| StoreError::Engine {
                    engine: "embedded",
                    message: format!("a document encoded to invalid UTF-8: {e}"),
                })
        });
        if buf.capacity() > KEEP {
            *buf = Vec::new();
        }
        encoded
    })
}

fn unencodable(e: sonic_rs::Error) -> StoreError {
    StoreError::Engine {
        engine: "embedded",
        message: format!("a document does not encode: {e}"),
    }
}

/// Whether `json` holds a number token starting `-0` (`-0`, `-0.0`, `-0.25`, `-0e5`): a
/// number starts after `:`, `,`, `[` or white space, never after the digit or letter inside a
/// string such as a date (`2026-04-01`). Text that only looks like one (`"a:-0"`) merely
/// takes the slower parser. A search for `-` rather than for `-0`: it needs no searcher built
/// per document, and documents hold few dashes.
fn may_hold_negative_zero(json: &[u8]) -> bool {
    memchr::memchr_iter(b'-', json).any(|i| {
        i > 0
            && json.get(i + 1) == Some(&b'0')
            && matches!(
                json[i - 1],
                b':' | b',' | b'[' | b' ' | b'\t' | b'\n' | b'\r'
            )
    })
}

fn corrupt(what: impl Into<String>) -> StoreError {
    StoreError::Engine {
        engine: "embedded",
        message: format!("journal record: {}", what.into()),
    }
}

/// `n` rounded up to [`ALIGN`].
pub(crate) fn padded(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// One capped collection's documents in a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Section {
    pub coll: String,
    /// The position of the first document; the others follow without a gap.
    pub first: u64,
    pub count: u32,
    /// The collection's oldest retained position once this commit evicted what it had to.
    pub oldest_after: u64,
}

/// Where a block lies in its record, and how it is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Block {
    pub entry_first: u32,
    /// Offset of its data from the record's start.
    pub offset: u32,
    pub stored: u32,
    pub raw: u32,
    pub codec: u8,
}

/// A record's header.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Header {
    pub lsn: u64,
    pub ts: i64,
    pub total_len: u32,
    pub sections: Vec<Section>,
    pub change_first: u64,
    pub change_count: u32,
    pub checkpoints: u32,
    pub blocks: Vec<Block>,
    /// The checksum of the record before it in its segment (0: the first, or a record written
    /// before records were chained). A record that names another predecessor than the one
    /// before it is not part of the journal: a stale record left past a torn tail.
    pub prev: u32,
}

impl Header {
    /// Documents in all sections.
    pub fn docs(&self) -> u32 {
        self.sections.iter().map(|s| s.count).sum()
    }

    /// The index of the first entry of section `i`.
    pub fn section_entry(&self, i: usize) -> u32 {
        self.sections[..i].iter().map(|s| s.count).sum()
    }

    /// The blocks that hold entries `range` (entry indexes).
    pub fn blocks_for(&self, first: u32, end: u32) -> impl Iterator<Item = (usize, &Block)> {
        let n = self.blocks.len();
        self.blocks.iter().enumerate().filter(move |(i, b)| {
            let block_end = if i + 1 < n {
                self.blocks[i + 1].entry_first
            } else {
                u32::MAX
            };
            b.entry_first < end && block_end > first
        })
    }

    /// Reads a header from the start of `bytes` (which may be only its first part: the
    /// error then says how many bytes are needed, see [`Header::needed`]).
    pub fn parse(bytes: &[u8]) -> Result<Header> {
        if bytes.len() < FIXED {
            return Err(corrupt("short header"));
        }
        if u32_at(bytes, 0) != MAGIC {
            return Err(corrupt("bad magic"));
        }
        let header_len = u32_at(bytes, 12) as usize;
        let total_len = u32_at(bytes, 4);
        if header_len < FIXED || header_len > total_len as usize || bytes.len() < header_len {
            return Err(corrupt("bad header length"));
        }
        let n_sections = u16::from_le_bytes([bytes[48], bytes[49]]) as usize;
        let n_blocks = u16::from_le_bytes([bytes[50], bytes[51]]) as usize;
        let mut r = Reader {
            b: &bytes[..header_len],
            at: FIXED,
        };
        let mut sections = Vec::with_capacity(n_sections);
        for _ in 0..n_sections {
            let len = r.u8()? as usize;
            let coll = std::str::from_utf8(r.take(len)?)
                .map_err(|_| corrupt("collection name"))?
                .to_owned();
            sections.push(Section {
                coll,
                first: r.u64()?,
                count: r.u32()?,
                oldest_after: r.u64()?,
            });
        }
        let mut blocks = Vec::with_capacity(n_blocks);
        let mut offset = header_len as u32;
        for _ in 0..n_blocks {
            let b = Block {
                entry_first: r.u32()?,
                offset,
                stored: r.u32()?,
                raw: r.u32()?,
                codec: r.u8()?,
            };
            offset = offset
                .checked_add(b.stored)
                .ok_or_else(|| corrupt("block sizes"))?;
            blocks.push(b);
        }
        if offset != total_len {
            return Err(corrupt("blocks do not fill the record"));
        }
        Ok(Header {
            lsn: u64_at(bytes, 16),
            ts: u64_at(bytes, 24) as i64,
            total_len,
            sections,
            change_first: u64_at(bytes, 32),
            change_count: u32_at(bytes, 40),
            checkpoints: u32_at(bytes, 44),
            blocks,
            prev: u32_at(bytes, 52),
        })
    }

    /// From a record's first [`FIXED`] bytes: `Some((header_len, total_len))` when they start a
    /// record, `None` when they do not (zeros past the journal's end, or garbage).
    pub fn peek(bytes: &[u8]) -> Option<(usize, usize)> {
        if bytes.len() < FIXED || u32_at(bytes, 0) != MAGIC {
            return None;
        }
        let (header, total) = (u32_at(bytes, 12) as usize, u32_at(bytes, 4) as usize);
        (header >= FIXED && total >= header).then_some((header, total))
    }

    /// The stored bytes of block `i` of the record `record` (the whole record, or a buffer
    /// holding it from its start), decompressed.
    pub fn block<'a>(&self, record: &'a [u8], i: usize) -> Result<Cow<'a, [u8]>> {
        let b = self.blocks.get(i).ok_or_else(|| corrupt("no such block"))?;
        self.block_data(b, Self::slice(record, b)?)
    }

    fn slice<'a>(record: &'a [u8], b: &Block) -> Result<&'a [u8]> {
        record
            .get(b.offset as usize..(b.offset + b.stored) as usize)
            .ok_or_else(|| corrupt("block beyond the record"))
    }

    /// [`Header::block`], decompressed into `out` (reused from block to block: it is never
    /// shrunk, so it is zeroed only where it grows) or, stored raw, where it lies.
    pub fn block_into<'a>(
        &self,
        record: &'a [u8],
        i: usize,
        out: &'a mut Vec<u8>,
    ) -> Result<&'a [u8]> {
        let b = self.blocks.get(i).ok_or_else(|| corrupt("no such block"))?;
        decode_into(b, Self::slice(record, b)?, out)
    }

    /// A block's data as stored (`data`), decompressed.
    pub fn block_data<'a>(&self, b: &Block, data: &'a [u8]) -> Result<Cow<'a, [u8]>> {
        if b.codec == RAW {
            return Ok(Cow::Borrowed(data));
        }
        let mut out = Vec::new();
        let n = decode_into(b, data, &mut out)?.len();
        out.truncate(n);
        Ok(Cow::Owned(out))
    }
}

/// Block `b`'s stored bytes `data` as written: where they lie when stored raw, else
/// decompressed into `out` (grown to the block's size where it is shorter, never shrunk).
fn decode_into<'a>(b: &Block, data: &'a [u8], out: &'a mut Vec<u8>) -> Result<&'a [u8]> {
    match b.codec {
        RAW => Ok(data),
        LZ4 => {
            let raw = b.raw as usize;
            if out.len() < raw {
                out.resize(raw, 0);
            }
            let n = lz4_flex::block::decompress_into(data, &mut out[..raw])
                .map_err(|e| corrupt(format!("block does not decompress: {e}")))?;
            Ok(&out[..n])
        }
        c => Err(corrupt(format!("unknown codec {c}"))),
    }
}

/// Checks a whole record's checksum.
pub(crate) fn check(record: &[u8]) -> bool {
    record.len() >= FIXED
        && u32_at(record, 4) as usize == record.len()
        && crc32fast::hash(&record[12..]) == u32_at(record, 8)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// A cursor over bytes that fails, instead of panicking, past their end.
pub(crate) struct Reader<'a> {
    pub b: &'a [u8],
    pub at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(b: &'a [u8]) -> Self {
        Reader { b, at: 0 }
    }

    pub fn done(&self) -> bool {
        self.at >= self.b.len()
    }

    pub fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.b.len())
            .ok_or_else(|| corrupt("entry beyond its block"))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    pub fn u16(&mut self) -> Result<u16> {
        let s = self.take(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }

    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32_at(self.take(4)?, 0))
    }

    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64_at(self.take(8)?, 0))
    }

    /// A `len u32` + bytes field; `None` for [`NONE`].
    pub fn opt_bytes(&mut self) -> Result<Option<&'a [u8]>> {
        match self.u32()? {
            NONE => Ok(None),
            n => self.take(n as usize).map(Some),
        }
    }

    pub fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    pub fn str8(&mut self) -> Result<&'a str> {
        let n = self.u8()? as usize;
        std::str::from_utf8(self.take(n)?).map_err(|_| corrupt("name is not UTF-8"))
    }

    pub fn str16(&mut self) -> Result<&'a str> {
        let n = self.u16()? as usize;
        std::str::from_utf8(self.take(n)?).map_err(|_| corrupt("name is not UTF-8"))
    }

    pub fn str32(&mut self) -> Result<&'a str> {
        std::str::from_utf8(self.bytes()?).map_err(|_| corrupt("key is not UTF-8"))
    }
}

/// An entry as read back.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Entry<'a> {
    Doc(&'a [u8]),
    Change(ChangeEntry<'a>),
    Checkpoint { feed: &'a str, body: &'a [u8] },
}

/// A change entry as read back; its images are still JSON text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ChangeEntry<'a> {
    pub op: ChangeOp,
    pub coll: &'a str,
    pub key: &'a str,
    pub before: Option<&'a [u8]>,
    pub after: Option<&'a [u8]>,
}

pub(crate) fn op_code(op: ChangeOp) -> u8 {
    match op {
        ChangeOp::Insert => 1,
        ChangeOp::Update => 2,
        ChangeOp::Replace => 3,
        ChangeOp::Delete => 4,
    }
}

fn op_of(code: u8) -> Result<ChangeOp> {
    Ok(match code {
        1 => ChangeOp::Insert,
        2 => ChangeOp::Update,
        3 => ChangeOp::Replace,
        4 => ChangeOp::Delete,
        c => return Err(corrupt(format!("unknown change op {c}"))),
    })
}

/// The kind of entry `index` of a record with this header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Doc,
    Change,
    Checkpoint,
}

impl Header {
    pub fn kind(&self, index: u32) -> Kind {
        let docs = self.docs();
        if index < docs {
            Kind::Doc
        } else if index < docs + self.change_count {
            Kind::Change
        } else {
            Kind::Checkpoint
        }
    }

    /// Entries of one decompressed block, with their indexes.
    pub fn entries<'a>(
        &'a self,
        block: usize,
        data: &'a [u8],
    ) -> impl Iterator<Item = Result<(u32, Entry<'a>)>> + 'a {
        let mut r = Reader::new(data);
        let mut index = self.blocks.get(block).map_or(0, |b| b.entry_first);
        std::iter::from_fn(move || {
            if r.done() {
                return None;
            }
            let i = index;
            index += 1;
            Some(read_entry(&mut r, self.kind(i)).map(|e| (i, e)))
        })
    }
}

fn read_entry<'a>(r: &mut Reader<'a>, kind: Kind) -> Result<Entry<'a>> {
    Ok(match kind {
        Kind::Doc => Entry::Doc(r.bytes()?),
        Kind::Change => Entry::Change(ChangeEntry {
            op: op_of(r.u8()?)?,
            coll: r.str8()?,
            key: r.str32()?,
            before: r.opt_bytes()?,
            after: r.opt_bytes()?,
        }),
        Kind::Checkpoint => Entry::Checkpoint {
            feed: r.str16()?,
            body: r.bytes()?,
        },
    })
}

/// Builds one record. Entries must be added in order: documents (section by section), then
/// changes, then checkpoints.
///
/// The writer keeps one builder and [`clear`](Builder::clear)s it between records, so the
/// entries' buffer and the compressor's table are allocated once, not grown from nothing and
/// handed back to the system at every commit.
#[derive(Default)]
pub(crate) struct Builder {
    sections: Vec<Section>,
    change_first: u64,
    change_count: u32,
    checkpoints: u32,
    /// Raw entries, and where each block starts in it (byte offset, first entry).
    raw: Vec<u8>,
    cuts: Vec<(usize, u32)>,
    entries: u32,
    table: lz4_flex::block::CompressTable,
}

/// A block's entry in the header: first entry u32, stored length u32, raw length u32, codec u8.
const BLOCK_ENTRY: usize = 13;

/// The most of its entries' buffer a builder keeps between records: a batch of large
/// documents does not leave its size allocated for good.
const KEEP_RAW: usize = 4 << 20;

impl Builder {
    pub fn new() -> Self {
        Builder::default()
    }

    /// Empties the builder for the next record, keeping what it allocated.
    pub fn clear(&mut self) {
        self.sections.clear();
        self.change_first = 0;
        self.change_count = 0;
        self.checkpoints = 0;
        if self.raw.capacity() > KEEP_RAW {
            self.raw = Vec::new();
        }
        self.raw.clear();
        self.cuts.clear();
        self.entries = 0;
    }

    fn entry_start(&mut self) {
        let block_start = self.cuts.last().map_or(0, |c| c.0);
        if self.cuts.is_empty() || self.raw.len() - block_start >= BLOCK_RAW {
            self.cuts.push((self.raw.len(), self.entries));
        }
        self.entries += 1;
    }

    /// Starts a section of `coll`'s documents from position `first`.
    pub fn section(&mut self, coll: &str, first: u64, oldest_after: u64) {
        debug_assert!(self.change_count == 0 && self.checkpoints == 0);
        self.sections.push(Section {
            coll: coll.to_owned(),
            first,
            count: 0,
            oldest_after,
        });
    }

    /// Sets the oldest position of the last section (known once the documents are counted).
    #[cfg(test)]
    pub fn set_oldest_after(&mut self, oldest_after: u64) {
        if let Some(s) = self.sections.last_mut() {
            s.oldest_after = oldest_after;
        }
    }

    pub fn doc(&mut self, json: &[u8]) {
        self.entry_start();
        self.put_bytes(json);
        if let Some(s) = self.sections.last_mut() {
            s.count += 1;
        }
    }

    pub fn change(
        &mut self,
        seq: u64,
        op: ChangeOp,
        coll: &str,
        key: &str,
        before: Option<&[u8]>,
        after: Option<&[u8]>,
    ) {
        debug_assert!(self.checkpoints == 0);
        if self.change_count == 0 {
            self.change_first = seq;
        }
        self.entry_start();
        self.raw.push(op_code(op));
        self.raw.push(coll.len() as u8);
        self.raw.extend_from_slice(coll.as_bytes());
        self.put_bytes(key.as_bytes());
        for image in [before, after] {
            match image {
                Some(b) => self.put_bytes(b),
                None => self.raw.extend_from_slice(&NONE.to_le_bytes()),
            }
        }
        self.change_count += 1;
    }

    pub fn checkpoint(&mut self, feed: &str, body: &[u8]) {
        self.entry_start();
        self.raw
            .extend_from_slice(&(feed.len().min(u16::MAX as usize) as u16).to_le_bytes());
        self.raw
            .extend_from_slice(&feed.as_bytes()[..feed.len().min(u16::MAX as usize)]);
        self.put_bytes(body);
        self.checkpoints += 1;
    }

    fn put_bytes(&mut self, b: &[u8]) {
        self.raw.extend_from_slice(&(b.len() as u32).to_le_bytes());
        self.raw.extend_from_slice(b);
    }

    /// The record, into `out` (cleared first), with room for its padding.
    pub fn finish(&mut self, lsn: u64, ts: i64, prev: u32, out: &mut Vec<u8>) {
        out.clear();
        out.resize(FIXED, 0);
        for s in &self.sections {
            out.push(s.coll.len() as u8);
            out.extend_from_slice(s.coll.as_bytes());
            out.extend_from_slice(&s.first.to_le_bytes());
            out.extend_from_slice(&s.count.to_le_bytes());
            out.extend_from_slice(&s.oldest_after.to_le_bytes());
        }
        // The block table's size is known before any block is compressed: each block is
        // compressed straight into its place after the table, and its entry filled in then.
        let table_at = out.len();
        out.resize(table_at + self.cuts.len() * BLOCK_ENTRY, 0);
        let header_len = out.len();
        for (i, &(start, entry_first)) in self.cuts.iter().enumerate() {
            let end = self.cuts.get(i + 1).map_or(self.raw.len(), |c| c.0);
            let raw = &self.raw[start..end];
            let at = out.len();
            out.resize(at + lz4_flex::block::get_maximum_output_size(raw.len()), 0);
            let packed =
                lz4_flex::block::compress_into_with_table(raw, &mut out[at..], &mut self.table);
            let (stored, codec) = match packed {
                Ok(n) if n < raw.len() => {
                    out.truncate(at + n);
                    (n, LZ4)
                }
                // Incompressible (or, with room for the worst case, never: an error), kept as is.
                _ => {
                    out.truncate(at);
                    out.extend_from_slice(raw);
                    (raw.len(), RAW)
                }
            };
            let e = table_at + i * BLOCK_ENTRY;
            out[e..e + 4].copy_from_slice(&entry_first.to_le_bytes());
            out[e + 4..e + 8].copy_from_slice(&(stored as u32).to_le_bytes());
            out[e + 8..e + 12].copy_from_slice(&(raw.len() as u32).to_le_bytes());
            out[e + 12] = codec;
        }
        let total = out.len();
        out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        out[4..8].copy_from_slice(&(total as u32).to_le_bytes());
        out[12..16].copy_from_slice(&(header_len as u32).to_le_bytes());
        out[16..24].copy_from_slice(&lsn.to_le_bytes());
        out[24..32].copy_from_slice(&ts.to_le_bytes());
        out[32..40].copy_from_slice(&self.change_first.to_le_bytes());
        out[40..44].copy_from_slice(&self.change_count.to_le_bytes());
        out[44..48].copy_from_slice(&self.checkpoints.to_le_bytes());
        out[48..50].copy_from_slice(&(self.sections.len() as u16).to_le_bytes());
        out[50..52].copy_from_slice(&(self.cuts.len() as u16).to_le_bytes());
        out[52..56].copy_from_slice(&prev.to_le_bytes());
        let crc = crc32fast::hash(&out[12..]);
        out[8..12].copy_from_slice(&crc.to_le_bytes());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
