//! Pure translations between the store's types and the driver's: JSON ⇄ BSON, durability →
//! write concern, driver errors → [`StoreError`], [`Update`] → `$inc`/`$set`, resume tokens.
//! Nothing here talks to a server, so all of it is unit-tested.

use std::time::Duration;

use mongodb::bson::{self, Bson, Document as BsonDoc, Timestamp, doc};
use mongodb::change_stream::event::ResumeToken as DriverToken;
use mongodb::error::{Error as DriverError, ErrorKind, WriteFailure};
use mongodb::options::{Acknowledgment, WriteConcern};
use serde_json::{Number, Value};

use crate::{Capability, Document, Durability, ResumeToken, StoreError, Update};

/// The `engine` name in errors and metrics.
pub(crate) const ENGINE: &str = "mongodb";

/// A store error in the engine's own words.
pub(crate) fn engine_err(message: impl Into<String>) -> StoreError {
    StoreError::Engine {
        engine: ENGINE,
        message: message.into(),
    }
}

// ---------------------------------------------------------------------------------------------
// JSON ⇄ BSON
// ---------------------------------------------------------------------------------------------

/// A JSON value as BSON. Integers become `Int64` (so `$inc` stays integral, as in
/// [`crate::update::apply`]); an integer beyond `i64` becomes a `Double`, like serde_json's own
/// arithmetic; a date (`{"$date": "<RFC 3339>"}`, [`crate::date`]) becomes a BSON date, so
/// that the server's date operators, date ranges and TTL indexes work on it; everything else
/// maps one to one.
pub(crate) fn json_to_bson(value: &Value) -> Bson {
    if let Some(ms) = crate::date::millis(value) {
        return Bson::DateTime(bson::DateTime::from_millis(ms));
    }
    match value {
        Value::Null => Bson::Null,
        Value::Bool(b) => Bson::Boolean(*b),
        Value::Number(n) => number_to_bson(n),
        Value::String(s) => Bson::String(s.clone()),
        Value::Array(items) => Bson::Array(items.iter().map(json_to_bson).collect()),
        Value::Object(map) => Bson::Document(doc_to_bson(map)),
    }
}

fn number_to_bson(n: &Number) -> Bson {
    match n.as_i64() {
        Some(i) => Bson::Int64(i),
        None => Bson::Double(n.as_f64().unwrap_or(f64::NAN)),
    }
}

/// A JSON object as a BSON document, keys in the same order.
pub(crate) fn doc_to_bson(doc: &Document) -> BsonDoc {
    doc.iter()
        .map(|(k, v)| (k.clone(), json_to_bson(v)))
        .collect()
}

/// A BSON value as JSON: numbers, strings, booleans, arrays and documents map one to one (a
/// document this engine wrote reads back exactly as it was given); types JSON lacks (ObjectId,
/// dates, decimals, binaries) written by other tools read back in relaxed extended JSON
/// (`{"$oid": ..}`, `{"$date": ..}`).
pub(crate) fn bson_to_json(value: Bson) -> Value {
    value.into_relaxed_extjson()
}

/// A BSON document as a JSON object.
pub(crate) fn bson_doc_to_json(doc: BsonDoc) -> Document {
    doc.into_iter().map(|(k, v)| (k, bson_to_json(v))).collect()
}

/// A BSON number as `i64` (Int32, Int64, or an integral Double: servers and shells disagree
/// about which they store for options like `size` and `max`).
pub(crate) fn bson_as_i64(value: &Bson) -> Option<i64> {
    match value {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        Bson::Double(f) if f.fract() == 0.0 && f.is_finite() => Some(*f as i64),
        _ => None,
    }
}

/// Escapes a literal for use inside a PCRE regular expression (the key-prefix match).
pub(crate) fn regex_escape(literal: &str) -> String {
    let mut out = String::with_capacity(literal.len() + 8);
    for c in literal.chars() {
        if "\\^$.|?*+()[]{}-#/ ".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The key (`_id`) of a keyed document as the store's `String`. Keys this engine writes are
/// strings; another type (written by another tool) reads as its JSON text.
pub(crate) fn key_string(id: &Bson) -> String {
    match id {
        Bson::String(s) => s.clone(),
        other => bson_to_json(other.clone()).to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// Durability → write concern
// ---------------------------------------------------------------------------------------------

/// The write concern a durability level is written with. `Unacknowledged` maps to `w: 1` on
/// purpose: the Rust driver refuses `w: 0` on the client side, so unacknowledged writes are sent
/// as `w: 1` by a background task and the caller does not wait (see the module docs).
pub(crate) fn write_concern(durability: Durability, timeout: Duration) -> WriteConcern {
    let (w, journal) = match durability {
        Durability::Unacknowledged | Durability::Acknowledged => (Acknowledgment::Nodes(1), None),
        Durability::Journaled => (Acknowledgment::Nodes(1), Some(true)),
        Durability::Majority => (Acknowledgment::Majority, Some(true)),
    };
    WriteConcern::builder()
        .w(w)
        .journal(journal)
        .w_timeout(timeout)
        .build()
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// What a driver error means to the store, decided on codes, kinds and labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// `CappedPositionLost` (136): a tailable cursor's position was evicted.
    PositionLost,
    /// `ChangeStreamHistoryLost` (286): the resume point left the oplog. Not resumable.
    HistoryLost,
    /// The request itself is wrong (bad update path, `$inc` of a string, document too large).
    Invalid,
    /// The server does not implement the command, stage or option (CommandNotFound,
    /// CommandNotSupported, NotImplemented, a change stream on a server that is not a replica
    /// set, an unknown pipeline stage).
    Unsupported,
    /// The client was shut down.
    Closed,
    /// Network trouble, an election, a killed cursor: worth re-opening with backoff.
    Transient,
    /// Anything else.
    Other,
}

/// The class of a server error code (codes from the server's `error_codes.yml`).
pub(crate) fn class_of_code(code: i32) -> Class {
    match code {
        136 => Class::PositionLost,
        286 => Class::HistoryLost,
        59 | 115 | 238 | 40324 | 40573 => Class::Unsupported,
        // BadValue, FailedToParse, TypeMismatch, PathNotViable, ConflictingUpdateOperators,
        // DollarPrefixedFieldName, EmptyFieldName, DottedFieldName, ImmutableField,
        // InvalidIdField, Location10334 (BSONObjectTooLarge), Overflow (15).
        2 | 9 | 14 | 15 | 28 | 40 | 52 | 56 | 57 | 66 | 10334 | 17419 => Class::Invalid,
        // HostUnreachable, HostNotFound, NetworkTimeout, ShutdownInProgress, CursorNotFound,
        // PrimarySteppedDown, NotWritablePrimary, InterruptedAtShutdown,
        // InterruptedDueToReplStateChange, NotPrimaryNoSecondaryOk, NotPrimaryOrSecondary,
        // SocketException, ExceededTimeLimit, FailedToSatisfyReadPreference, StaleShardVersion,
        // RetryChangeStream, CursorKilled (237); and for writes: LockTimeout (24),
        // MaxTimeMSExpired (50), WriteConcernFailed (64, a `wtimeout`), Interrupted (11601),
        // OutOfDiskSpace (14031).
        6 | 7 | 89 | 91 | 43 | 189 | 10107 | 11600 | 11602 | 13435 | 13436 | 9001 | 262 | 133
        | 63 | 234 | 237 | 24 | 50 | 64 | 11601 | 14031 => Class::Transient,
        _ => Class::Other,
    }
}

/// The server error code carried by a driver error, if any (the driver keeps its own `code()`
/// private, so this reads the public error kinds).
pub(crate) fn error_code(e: &DriverError) -> Option<i32> {
    match &*e.kind {
        ErrorKind::Command(c) => Some(c.code),
        ErrorKind::Write(WriteFailure::WriteError(w)) => Some(w.code),
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => Some(w.code),
        ErrorKind::InsertMany(m) => m
            .write_errors
            .as_ref()
            .and_then(|errors| errors.first())
            .map(|w| w.code)
            .or_else(|| m.write_concern_error.as_ref().map(|w| w.code)),
        _ => None,
    }
}

/// What a driver error means (see [`Class`]).
pub(crate) fn classify(e: &DriverError) -> Class {
    if let Some(code) = error_code(e) {
        let class = class_of_code(code);
        if class != Class::Other {
            return class;
        }
    }
    match &*e.kind {
        ErrorKind::Io(_) | ErrorKind::ConnectionPoolCleared { .. } => Class::Transient,
        ErrorKind::ServerSelection { .. } => Class::Transient,
        ErrorKind::Shutdown => Class::Closed,
        ErrorKind::InvalidArgument { .. } => Class::Invalid,
        _ if e.contains_label(mongodb::error::RESUMABLE_CHANGE_STREAM_ERROR)
            || e.contains_label(mongodb::error::RETRYABLE_WRITE_ERROR) =>
        {
            Class::Transient
        }
        _ => Class::Other,
    }
}

/// Maps a driver error by meaning. `CappedPositionLost` needs the reader's position to become
/// [`StoreError::PositionLost`], so the tail maps it itself; here it stays an engine error.
/// `ChangeStreamHistoryLost` becomes [`StoreError::HistoryLost`] with unknown tokens; change
/// streams replace them with the real ones.
pub(crate) fn map_error(e: DriverError) -> StoreError {
    match classify(&e) {
        Class::HistoryLost => StoreError::HistoryLost {
            token: ResumeToken("(unknown)".into()),
            oldest: ResumeToken("(unknown)".into()),
        },
        Class::Invalid => StoreError::Invalid(e.to_string()),
        Class::Unsupported => StoreError::Unsupported {
            capability: Capability::Other,
            reply: reply_of(&e),
        },
        Class::Closed => StoreError::Closed,
        Class::Transient => StoreError::Unavailable {
            engine: ENGINE,
            message: e.to_string(),
        },
        Class::PositionLost | Class::Other => engine_err(e.to_string()),
    }
}

/// The store error of a server error code read from a reply (a `writeErrors` entry), mapped as
/// [`map_error`] maps the driver's errors.
pub(crate) fn error_of_code(code: i32, message: String) -> StoreError {
    match class_of_code(code) {
        Class::Invalid => StoreError::Invalid(message),
        Class::Unsupported => StoreError::Unsupported {
            capability: Capability::Other,
            reply: message,
        },
        Class::Transient => StoreError::Unavailable {
            engine: ENGINE,
            message,
        },
        Class::HistoryLost | Class::PositionLost | Class::Closed | Class::Other => {
            engine_err(message)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Updates
// ---------------------------------------------------------------------------------------------

fn check_update_path(path: &str) -> Result<(), StoreError> {
    if path.is_empty() || path.split('.').any(|p| p.is_empty()) {
        return Err(StoreError::Invalid(format!("empty field path {path:?}")));
    }
    if path.split('.').any(|p| p.starts_with('$')) {
        return Err(StoreError::Invalid(format!(
            "field path {path:?}: a segment starting with $ is an operator to MongoDB"
        )));
    }
    if path == "_id" || path.starts_with("_id.") {
        return Err(StoreError::Invalid(format!(
            "field path {path:?}: _id is the document's key and cannot be updated"
        )));
    }
    Ok(())
}

/// `true` when `inner` lies strictly inside `outer` (`a.b` inside `a`).
fn is_under(inner: &str, outer: &str) -> bool {
    inner.len() > outer.len() && inner.starts_with(outer) && inner.as_bytes()[outer.len()] == b'.'
}

/// Adds two JSON numbers the way `$inc` (and [`crate::update::apply`]) does.
fn add(a: &Number, b: &Number) -> Option<Number> {
    if let (Some(x), Some(y)) = (a.as_i64(), b.as_i64()) {
        return x.checked_add(y).map(Number::from);
    }
    Number::from_f64(a.as_f64()? + b.as_f64()?)
}

/// Sets `rest` (a dotted path) inside `target`, creating objects on the way, as
/// [`crate::update::apply`] does.
fn set_inside(target: &mut Value, full: &str, rest: &str, value: Value) -> Result<(), StoreError> {
    let mut cur = target;
    let mut parts = rest.split('.').peekable();
    while let Some(part) = parts.next() {
        let obj = cur.as_object_mut().ok_or_else(|| {
            StoreError::Invalid(format!(
                "cannot update {full:?}: {part:?} is not in an object"
            ))
        })?;
        if parts.peek().is_none() {
            obj.insert(part.to_string(), value);
            return Ok(());
        }
        cur = obj
            .entry(part.to_string())
            .or_insert_with(|| Value::Object(Document::new()));
    }
    Ok(())
}

/// Rewrites an [`Update`] so that MongoDB's `$inc`/`$set` (which refuse two operators on one
/// path, or on a path and its parent) mean exactly what [`crate::update::apply`] does with it:
/// all increments first, in order, then all sets, in order.
///
/// - increments of one path are summed;
/// - an increment of a path that a later `$set` overwrites (the path itself or a parent) is
///   dropped, since `apply` would overwrite its result;
/// - a `$set` of a path inside an earlier `$set`'s value is merged into that value;
/// - a later `$set` of a parent replaces earlier sets inside it;
/// - an increment of a parent and a child, or a `$set` inside an incremented number, is refused
///   as [`StoreError::Invalid`] (`apply` fails on those too).
///
/// One difference remains: `apply` fails on `$inc` of a field holding a string even when a
/// later `$set` overwrites it; here the increment is dropped and the set succeeds.
pub(crate) fn normalize_update(update: &Update) -> Result<Update, StoreError> {
    let mut inc: Vec<(String, Number)> = Vec::new();
    for (path, delta) in &update.inc {
        check_update_path(path)?;
        let delta = delta.as_number().ok_or_else(|| {
            StoreError::Invalid(format!("$inc of {path:?} by a non-number {delta}"))
        })?;
        if let Some((_, sum)) = inc.iter_mut().find(|(p, _)| p == path) {
            *sum = add(sum, delta)
                .ok_or_else(|| StoreError::Invalid(format!("$inc of {path:?} overflows")))?;
            continue;
        }
        if let Some((other, _)) = inc
            .iter()
            .find(|(p, _)| is_under(path, p) || is_under(p, path))
        {
            return Err(StoreError::Invalid(format!(
                "cannot $inc both {other:?} and {path:?}: one holds the other"
            )));
        }
        inc.push((path.clone(), delta.clone()));
    }
    let mut set: Vec<(String, Value)> = Vec::new();
    for (path, value) in &update.set {
        check_update_path(path)?;
        inc.retain(|(p, _)| !(p == path || is_under(p, path)));
        if let Some((p, _)) = inc.iter().find(|(p, _)| is_under(path, p)) {
            return Err(StoreError::Invalid(format!(
                "cannot update {path:?}: {p:?} is incremented, so it is a number, not an object"
            )));
        }
        set.retain(|(p, _)| !(p == path || is_under(p, path)));
        if let Some((parent, parent_value)) = set.iter_mut().find(|(p, _)| is_under(path, p)) {
            let rest = &path[parent.len() + 1..];
            set_inside(parent_value, path, rest, value.clone())?;
        } else {
            set.push((path.clone(), value.clone()));
        }
    }
    Ok(Update {
        inc: inc
            .into_iter()
            .map(|(p, n)| (p, Value::Number(n)))
            .collect(),
        set,
    })
}

/// The MongoDB update document (`{$inc: .., $set: ..}`) for an [`Update`], normalized first
/// (see [`normalize_update`]). An empty update becomes `{$set: {}}`, which MongoDB 5.0+
/// accepts: the upsert then creates `{_id: key}`, like `apply` on an empty document.
pub(crate) fn update_document(update: &Update) -> Result<BsonDoc, StoreError> {
    let update = normalize_update(update)?;
    let mut out = BsonDoc::new();
    if !update.inc.is_empty() {
        let inc: BsonDoc = update
            .inc
            .iter()
            .map(|(p, v)| (p.clone(), json_to_bson(v)))
            .collect();
        out.insert("$inc", inc);
    }
    if !update.set.is_empty() || out.is_empty() {
        let set: BsonDoc = update
            .set
            .iter()
            .map(|(p, v)| (p.clone(), json_to_bson(v)))
            .collect();
        out.insert("$set", set);
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Resume tokens
// ---------------------------------------------------------------------------------------------

/// A place in the oplog: an entry's `ts`, and the operation's index inside it (an `applyOps`
/// entry of a transaction holds several). Ordered by `ts`, then by the place inside the entry,
/// where the entry's end (its last operation, or the whole entry) comes after every operation
/// of it: a stream resumed from a whole-entry position (`ChangeStart::Now`, `newest_change`, a
/// snapshot's token) has seen all of that transaction, and skips all of it. Equality follows
/// the same order, so `{n: 0, end: true}` (a whole entry, as tokens written before this order
/// encode it) equals the entry's last operation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OplogPos {
    /// `ts.time`.
    pub t: u32,
    /// `ts.increment`.
    pub i: u32,
    /// The operation's index in its entry; `-1` means "before the entry's first operation".
    pub n: i64,
    /// Whether this is the entry's last operation (so resuming after it skips the entry).
    pub end: bool,
}

impl OplogPos {
    /// What the order compares: `ts`, then the place in the entry (its end after all of it).
    fn order_key(self) -> (u32, u32, i64) {
        (self.t, self.i, if self.end { i64::MAX } else { self.n })
    }

    /// The position of a whole entry's end.
    pub(crate) fn entry(ts: Timestamp) -> Self {
        OplogPos {
            t: ts.time,
            i: ts.increment,
            n: 0,
            end: true,
        }
    }

    /// Just before the entry at `ts`: resuming after it yields that entry.
    pub(crate) fn before(ts: Timestamp) -> Self {
        OplogPos {
            t: ts.time,
            i: ts.increment,
            n: -1,
            end: false,
        }
    }

    /// The entry's timestamp.
    pub(crate) fn ts(self) -> Timestamp {
        Timestamp {
            time: self.t,
            increment: self.i,
        }
    }

    /// The cluster time a change stream resuming after this position starts at: the next
    /// timestamp when the whole entry was seen, the entry itself otherwise (a transaction seen
    /// in part is replayed whole: at-least-once, never a gap).
    pub(crate) fn resume_operation_time(self) -> Timestamp {
        if !self.end {
            return self.ts();
        }
        match self.i.checked_add(1) {
            Some(i) => Timestamp {
                time: self.t,
                increment: i,
            },
            None => Timestamp {
                time: self.t.saturating_add(1),
                increment: 0,
            },
        }
    }
}

impl PartialEq for OplogPos {
    fn eq(&self, other: &Self) -> bool {
        self.order_key() == other.order_key()
    }
}

impl Eq for OplogPos {}

impl PartialOrd for OplogPos {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OplogPos {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.order_key().cmp(&other.order_key())
    }
}

/// The two kinds of [`ResumeToken`] this engine makes.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Token {
    /// A change stream's own token (the JSON of the driver's `ResumeToken`, `{"_data": ..}`).
    Stream(DriverToken),
    /// An oplog position (`{"oplog": {"t", "i", "n", "e"}}`): made by oplog mode, by
    /// `newest_change`, and as the `oldest` of `HistoryLost`. Change streams accept it too.
    Oplog(OplogPos),
}

/// Encodes a token as the store's [`ResumeToken`] (JSON text).
pub(crate) fn encode_token(token: &Token) -> Result<ResumeToken, StoreError> {
    let json = match token {
        Token::Stream(t) => {
            let b = bson::serialize_to_bson(t)
                .map_err(|e| engine_err(format!("encoding a resume token: {e}")))?;
            bson_to_json(b)
        }
        Token::Oplog(p) => serde_json::json!({"oplog": {"t": p.t, "i": p.i, "n": p.n, "e": p.end}}),
    };
    Ok(ResumeToken(json.to_string()))
}

/// Decodes a [`ResumeToken`] made by [`encode_token`].
pub(crate) fn decode_token(token: &ResumeToken) -> Result<Token, StoreError> {
    let bad = || {
        StoreError::Invalid(format!(
            "resume token {token:?} was not made by the MongoDB engine"
        ))
    };
    let json: Value = serde_json::from_str(&token.0).map_err(|_| bad())?;
    if let Some(p) = json.get("oplog") {
        let t = p.get("t").and_then(Value::as_u64).ok_or_else(bad)?;
        let i = p.get("i").and_then(Value::as_u64).ok_or_else(bad)?;
        let n = p.get("n").and_then(Value::as_i64).ok_or_else(bad)?;
        let end = p.get("e").and_then(Value::as_bool).ok_or_else(bad)?;
        return Ok(Token::Oplog(OplogPos {
            t: u32::try_from(t).map_err(|_| bad())?,
            i: u32::try_from(i).map_err(|_| bad())?,
            n,
            end,
        }));
    }
    if json.get("_data").is_none() {
        return Err(bad());
    }
    // Extended JSON back to BSON, so a `$binary` token of an old server survives too.
    let b = Bson::try_from(json).map_err(|_| bad())?;
    let t: DriverToken = bson::deserialize_from_bson(b).map_err(|_| bad())?;
    Ok(Token::Stream(t))
}

/// `{_id: position}` as the capped collection stores it.
pub(crate) fn position_filter(position: u64) -> BsonDoc {
    doc! {"_id": position as i64}
}

/// MongoDB's code for a duplicate key.
pub(crate) const DUPLICATE_KEY: i32 = 11000;

/// A server reply as people read it: `CodeName (code): message`, or the driver's message.
pub(crate) fn reply_of(e: &DriverError) -> String {
    match &*e.kind {
        ErrorKind::Command(c) => {
            if c.code_name.is_empty() {
                format!("code {}: {}", c.code, c.message)
            } else {
                format!("{} ({}): {}", c.code_name, c.code, c.message)
            }
        }
        ErrorKind::Write(WriteFailure::WriteError(w)) => {
            format!("code {}: {}", w.code, w.message)
        }
        ErrorKind::InsertMany(m) => match m.write_errors.as_ref().and_then(|w| w.first()) {
            Some(w) => format!("code {}: {}", w.code, w.message),
            None => e.to_string(),
        },
        _ => e.to_string(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
