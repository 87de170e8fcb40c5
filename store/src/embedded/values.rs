//! A finished segment's distinct values of its capped collections' indexed fields, in the
//! segment's `.val` file beside its index file: for each value, the position of the first
//! document that holds it and how many do.
//!
//! What it is for: a `$group` by an indexed field (a `distinct`, "who posted more than five
//! times") over whole segments, answered without reading their documents
//! ([`crate::Capped::value_groups`]). The index files cannot answer it: they keep a hash and a
//! position per document, not the value.
//!
//! A summary holds what a query's `$group` would find, so that an answer from it is the
//! answer a read of the documents gives: the value as aggregation reads the path (through
//! arrays), kept when it is a string of at most [`MAX_VALUE`] bytes, and null or missing
//! counted apart (one group, as `$group` makes it). A field whose values in the segment are
//! anything else (a number, an array, a longer string), or whose strings come to more than
//! [`MAX_FIELD_BYTES`], has no summary there, and a query reads those documents. No value
//! from an event reaches the file unbounded.
//!
//! The file is a cache, never needed to open or to answer: written once the segment is
//! finished (through a temporary file, synced, renamed), checksummed, and tied to the segment
//! by its number, end and last record number. A file missing, damaged or made for other
//! contents is not used. At every open the last segment's file is removed: after a failed
//! sync that segment is cut and written again, and could end where it ended before with
//! other documents. A finished segment without a file (a store from before them, a crash
//! between its index file and this one, a field added to the indexes, which removes the
//! files that lack it) gets one from the maintenance thread while it is idle
//! ([`super::maint`]); at the first look after an open, a damaged file is written again too.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::format::Reader;
use super::fs::Fs;
use crate::{Document, Result, StoreError};

/// The longest string value kept, in bytes (a screen name, a language, a host name fit; a
/// text does not).
pub(crate) const MAX_VALUE: usize = 1024;

/// The most bytes of strings one field's summary of one segment keeps.
pub(crate) const MAX_FIELD_BYTES: usize = 16 << 20;

const MAGIC: u32 = u32::from_le_bytes(*b"TVL1");

/// A segment's values file.
pub(crate) fn path(jdir: &Path, seq: u64) -> PathBuf {
    jdir.join(format!("{seq:016x}.val"))
}

/// One field's values in one segment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct FieldValues {
    pub coll: String,
    pub field: String,
    /// Documents whose value is null or missing: how many, and the first one's position.
    pub nulls: (u64, u64),
    /// Each string, the first position that holds it and how many do, by first position.
    pub values: Vec<(String, u64, u64)>,
}

/// What the segment holds that a file ties to: its number, end and last record number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tie {
    pub seq: u64,
    pub end: u64,
    pub last_lsn: u64,
}

/// One field's summary as it is gathered; `None` once the field cannot be summarized.
struct Gathering {
    field: String,
    parts: Vec<String>,
    acc: Option<Acc>,
}

#[derive(Default)]
struct Acc {
    slots: HashMap<String, usize>,
    values: Vec<(String, u64, u64)>,
    nulls: (u64, u64),
    bytes: usize,
}

/// Gathers the summaries of a segment's documents as they are read, in position order.
#[derive(Default)]
pub(crate) struct Gather {
    colls: HashMap<String, Vec<Gathering>>,
}

impl Gather {
    /// Adds the document at `pos` of `coll`, whose indexed fields are `fields`.
    pub fn add(&mut self, coll: &str, fields: &[String], pos: u64, doc: &Document) {
        let gathering = match self.colls.get_mut(coll) {
            Some(g) => g,
            None => self.colls.entry(coll.to_owned()).or_insert_with(|| {
                fields
                    .iter()
                    .map(|f| Gathering {
                        field: f.clone(),
                        parts: f.split('.').map(str::to_owned).collect(),
                        acc: Some(Acc::default()),
                    })
                    .collect()
            }),
        };
        for g in gathering {
            let Some(acc) = &mut g.acc else {
                continue;
            };
            let value = crate::query::value_at(doc, &g.parts);
            match value.as_deref() {
                None | Some(Value::Null) => {
                    if acc.nulls.0 == 0 {
                        acc.nulls.1 = pos;
                    }
                    acc.nulls.0 += 1;
                }
                Some(Value::String(s)) if s.len() <= MAX_VALUE => match acc.slots.get(s.as_str()) {
                    Some(&i) => acc.values[i].2 += 1,
                    None => {
                        acc.bytes += s.len();
                        if acc.bytes > MAX_FIELD_BYTES {
                            g.acc = None;
                            continue;
                        }
                        acc.slots.insert(s.clone(), acc.values.len());
                        acc.values.push((s.clone(), pos, 1));
                    }
                },
                Some(_) => g.acc = None,
            }
        }
    }

    /// The summaries that could be made.
    pub fn finish(self) -> Vec<FieldValues> {
        let mut out = Vec::new();
        for (coll, fields) in self.colls {
            for g in fields {
                if let Some(acc) = g.acc {
                    out.push(FieldValues {
                        coll: coll.clone(),
                        field: g.field,
                        nulls: acc.nulls,
                        values: acc.values,
                    });
                }
            }
        }
        out.sort_by(|a, b| (&a.coll, &a.field).cmp(&(&b.coll, &b.field)));
        out
    }
}

/// Writes a segment's values file (through a temporary file, synced, renamed).
pub(crate) fn write(fs: &dyn Fs, path: &Path, tie: Tie, fields: &[FieldValues]) -> Result<()> {
    let mut b = Vec::new();
    b.extend_from_slice(&MAGIC.to_le_bytes());
    for v in [tie.seq, tie.end, tie.last_lsn] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    // A name too long for its length field (none is: names and paths are far shorter) is
    // left out rather than cut.
    let fields: Vec<&FieldValues> = fields
        .iter()
        .filter(|f| f.coll.len() <= usize::from(u16::MAX) && f.field.len() <= usize::from(u16::MAX))
        .collect();
    b.extend_from_slice(&(fields.len() as u32).to_le_bytes());
    let str16 = |b: &mut Vec<u8>, s: &str| {
        b.extend_from_slice(&(s.len() as u16).to_le_bytes());
        b.extend_from_slice(s.as_bytes());
    };
    for f in fields {
        str16(&mut b, &f.coll);
        str16(&mut b, &f.field);
        let mut body =
            Vec::with_capacity(20 + f.values.iter().map(|v| v.0.len() + 18).sum::<usize>());
        body.extend_from_slice(&f.nulls.0.to_le_bytes());
        body.extend_from_slice(&f.nulls.1.to_le_bytes());
        body.extend_from_slice(&(f.values.len() as u32).to_le_bytes());
        for (s, first, count) in &f.values {
            str16(&mut body, s);
            body.extend_from_slice(&first.to_le_bytes());
            body.extend_from_slice(&count.to_le_bytes());
        }
        b.extend_from_slice(&(body.len() as u64).to_le_bytes());
        b.extend_from_slice(&body);
    }
    let crc = crc32fast::hash(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    super::fs::write_atomic(fs, path, &b)
        .map_err(|e| super::journal::io_error(format!("writing {}", path.display()), e))
}

/// Whether the values file at `path` is whole and made for `tie`'s contents (it may still
/// hold no summary of a field).
pub(crate) fn holds(fs: &dyn Fs, path: &Path, tie: Tie) -> bool {
    checked(fs, path).is_some_and(|body| header(&mut Reader::new(&body)).is_ok_and(|at| at == tie))
}

/// The file at `path` without its checksum, when it reads and its checksum holds.
fn checked(fs: &dyn Fs, path: &Path) -> Option<Vec<u8>> {
    let mut b = fs.read(path).ok()?;
    let at = b.len().checked_sub(4)?;
    let crc = b.split_off(at);
    (crc32fast::hash(&b).to_le_bytes()[..] == crc[..]).then_some(b)
}

/// A values file's magic number, and what its contents were made for.
fn header(r: &mut Reader<'_>) -> Result<Tie> {
    if r.u32()? != MAGIC {
        return Err(StoreError::Invalid("values file".into()));
    }
    Ok(Tie {
        seq: r.u64()?,
        end: r.u64()?,
        last_lsn: r.u64()?,
    })
}

/// One value's documents in a segment, as [`read`] hands them out.
pub(crate) struct Group<'a> {
    /// `None`: null or missing.
    pub value: Option<&'a str>,
    pub first: u64,
    pub count: u64,
}

/// Calls `each` with `coll`'s groups of `field` in the values file at `path`, and says whether
/// it did: false when the file is missing, damaged, made for other contents than `tie`'s, or
/// holds no summary of the field. Nothing is handed out from a file that fails its checks.
pub(crate) fn read(
    fs: &dyn Fs,
    path: &Path,
    tie: Tie,
    coll: &str,
    field: &str,
    each: &mut dyn FnMut(Group<'_>),
) -> bool {
    let Some(body) = checked(fs, path) else {
        return false;
    };
    let body = &body[..];
    let parse = || -> Result<Option<Vec<Group<'_>>>> {
        let mut r = Reader::new(body);
        if header(&mut r)? != tie {
            return Ok(None);
        }
        for _ in 0..r.u32()? {
            let (c, f) = (r.str16()?, r.str16()?);
            let len = usize::try_from(r.u64()?).map_err(|_| StoreError::Invalid("size".into()))?;
            let mut v = Reader::new(r.take(len)?);
            if c != coll || f != field {
                continue;
            }
            let nulls = (v.u64()?, v.u64()?);
            let n = v.u32()? as usize;
            let mut groups = Vec::with_capacity(n + 1);
            for _ in 0..n {
                groups.push(Group {
                    value: Some(v.str16()?),
                    first: v.u64()?,
                    count: v.u64()?,
                });
            }
            if nulls.0 > 0 {
                groups.push(Group {
                    value: None,
                    first: nulls.1,
                    count: nulls.0,
                });
            }
            return Ok(Some(groups));
        }
        Ok(None)
    };
    match parse() {
        Ok(Some(groups)) => {
            groups.into_iter().for_each(each);
            true
        }
        _ => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc(v: Value) -> Document {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    #[test]
    fn values_are_gathered_as_a_group_finds_them_and_read_back() {
        let fields = vec!["user.name".to_owned(), "n".to_owned()];
        let mut g = Gather::default();
        g.add(
            "c",
            &fields,
            10,
            &doc(json!({"user": {"name": "a"}, "n": "x"})),
        );
        g.add(
            "c",
            &fields,
            11,
            &doc(json!({"user": {"name": "b"}, "n": 1})),
        );
        g.add("c", &fields, 12, &doc(json!({"user": {"name": "a"}})));
        g.add("c", &fields, 13, &doc(json!({"user": {"name": null}})));
        g.add("c", &fields, 14, &doc(json!({})));
        let out = g.finish();
        // `n` met a number: no summary of it.
        assert_eq!(
            out,
            vec![FieldValues {
                coll: "c".into(),
                field: "user.name".into(),
                nulls: (2, 13),
                values: vec![("a".into(), 10, 2), ("b".into(), 11, 1)],
            }]
        );

        let dir = tempfile::tempdir().unwrap();
        let fs = super::super::fs::RealFs;
        let p = path(dir.path(), 7);
        let tie = Tie {
            seq: 7,
            end: 4096,
            last_lsn: 9,
        };
        write(&fs, &p, tie, &out).unwrap();
        let mut got = Vec::new();
        let mut each = |g: Group<'_>| got.push((g.value.map(str::to_owned), g.first, g.count));
        assert!(read(&fs, &p, tie, "c", "user.name", &mut each));
        assert_eq!(
            got,
            vec![
                (Some("a".to_owned()), 10, 2),
                (Some("b".to_owned()), 11, 1),
                (None, 13, 2)
            ]
        );
        let mut none = |_: Group<'_>| panic!("nothing is handed out");
        // Another field, other contents, a damaged file: not used.
        assert!(!read(&fs, &p, tie, "c", "n", &mut none));
        assert!(!read(
            &fs,
            &p,
            Tie { end: 8192, ..tie },
            "c",
            "user.name",
            &mut none
        ));
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[30] ^= 1;
        std::fs::write(&p, &bytes).unwrap();
        assert!(!read(&fs, &p, tie, "c", "user.name", &mut none));
        assert!(!read(
            &fs,
            &dir.path().join("missing.val"),
            tie,
            "c",
            "user.name",
            &mut none
        ));
    }

    #[test]
    fn long_strings_and_arrays_leave_a_field_unsummarized() {
        let fields = vec!["a".to_owned(), "b".to_owned(), "c".to_owned()];
        let mut g = Gather::default();
        g.add(
            "x",
            &fields,
            1,
            &doc(json!({"a": "x".repeat(MAX_VALUE + 1), "b": ["y"], "c": "z"})),
        );
        let out = g.finish();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].field, "c");
    }
}
