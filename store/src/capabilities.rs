//! What a store's server can do, learned from the server's own replies (never from its name).
//!
//! The embedded engine can do everything. A MongoDB-compatible server may lack change streams
//! (a standalone MongoDB, FerretDB), an oplog, transactions, before images or a majority that
//! means anything; the MongoDB engine probes each at connect ([`crate::Store::capabilities`]),
//! so the pipeline can refuse a feed the server cannot serve at startup, with one clear
//! error, instead of a feed that stays silently empty.

use std::fmt;

use serde::Serialize;

/// A feature of the server some part of tailrace needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Capability {
    /// Change streams (`$changeStream`): the `changes` feed kind, `/api/changes` on keyed
    /// collections, `Store::changes` and `Keyed::changes` unless the oplog is read instead.
    ChangeStreams,
    /// An oplog that can be tailed (`local.oplog.rs`): the `oplog` feed kind.
    Oplog,
    /// Multi-document transactions: several keys of one rollup update commit at once.
    Transactions,
    /// A write concern of `majority` that waits for a majority of a replica set's members.
    Majority,
    /// Change events that carry the document before the change (MongoDB 6.0+ pre-images).
    BeforeImages,
    /// Reads of a consistent snapshot at a known cluster time: a keyed collection's initial
    /// documents followed by its changes with no gap and no duplicate.
    SnapshotReads,
    /// Documents stored as sent: `$`-prefixed and dotted keys (MongoDB 5.0+), nested arrays.
    DocumentsAsSent,
    /// A capped collection kept within `max_docs` and `max_bytes` at every insert, so a tail
    /// is overtaken exactly when the documents after it are evicted.
    CappedBounds,
    /// Query filters evaluated by the server with MongoDB's semantics (arrays, nulls, dotted
    /// paths), so a filter can run on the server and mean what it means in tailrace.
    ServerFilters,
    /// Tailable cursors that stay open after their first batch and wait for new documents
    /// (`awaitData`), so a tail is told of a new document without asking again.
    AwaitingTails,
    /// Something the server does not implement that none of the above names (a command, an
    /// operator); the reply says what.
    Other,
}

impl Capability {
    /// Every capability, in the order reports list them.
    /// Every probed capability ([`Capability::Other`] is not probed), in report order.
    pub const ALL: [Capability; 10] = [
        Capability::ChangeStreams,
        Capability::Oplog,
        Capability::Transactions,
        Capability::Majority,
        Capability::BeforeImages,
        Capability::SnapshotReads,
        Capability::DocumentsAsSent,
        Capability::CappedBounds,
        Capability::ServerFilters,
        Capability::AwaitingTails,
    ];

    /// The name used in messages, `/api/status` and test reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Capability::ChangeStreams => "change streams",
            Capability::Oplog => "an oplog",
            Capability::Transactions => "transactions",
            Capability::Majority => "a majority write concern",
            Capability::BeforeImages => "before images",
            Capability::SnapshotReads => "snapshot reads",
            Capability::DocumentsAsSent => {
                "documents as sent ($-prefixed and dotted keys, nested arrays)"
            }
            Capability::CappedBounds => "capped bounds kept at every insert",
            Capability::ServerFilters => "MongoDB's query semantics on the server",
            Capability::AwaitingTails => "tailable cursors that stay open",
            Capability::Other => "this operation",
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether the server has one capability, and if not, why tailrace thinks so. Serialised as
/// `{"supported": true}` or `{"supported": false, "reason": "..."}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Support {
    /// The server has it.
    Yes,
    /// The server lacks it. `reason` says how that was detected, quoting the server's reply.
    No {
        /// How it was detected ("aggregate with $changeStream answered NotImplemented (238):
        /// ...").
        reason: String,
    },
}

impl Support {
    /// Whether the capability is there.
    pub fn is_yes(&self) -> bool {
        matches!(self, Support::Yes)
    }

    /// Why the capability is missing, if it is.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Support::Yes => None,
            Support::No { reason } => Some(reason),
        }
    }
}

impl Serialize for Support {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("supported", &self.is_yes())?;
        if let Support::No { reason } = self {
            map.serialize_entry("reason", reason)?;
        }
        map.end()
    }
}

/// The answer for what is not probed.
static YES: Support = Support::Yes;

/// What one store's server supports, probed once when the store was opened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Capabilities {
    /// Change streams.
    pub change_streams: Support,
    /// A tailable oplog.
    pub oplog: Support,
    /// Multi-document transactions.
    pub transactions: Support,
    /// A majority write concern that means a majority of replicas.
    pub majority: Support,
    /// Before images in change events.
    pub before_images: Support,
    /// Snapshot reads at a cluster time.
    pub snapshot_reads: Support,
    /// Documents stored as sent: `$`-prefixed and dotted keys, nested arrays.
    pub documents_as_sent: Support,
    /// Capped bounds kept at every insert.
    pub capped_bounds: Support,
    /// Filters evaluated by the server with MongoDB's semantics.
    pub server_filters: Support,
    /// Tailable cursors that stay open and await data.
    pub awaiting_tails: Support,
}

impl Capabilities {
    /// A store that supports everything (the embedded engine).
    pub fn all() -> Self {
        Capabilities {
            change_streams: Support::Yes,
            oplog: Support::Yes,
            transactions: Support::Yes,
            majority: Support::Yes,
            before_images: Support::Yes,
            snapshot_reads: Support::Yes,
            documents_as_sent: Support::Yes,
            capped_bounds: Support::Yes,
            server_filters: Support::Yes,
            awaiting_tails: Support::Yes,
        }
    }

    /// The support of one capability ([`Capability::Other`] is never probed: `Yes`).
    pub fn get(&self, capability: Capability) -> &Support {
        match capability {
            Capability::Other => &YES,
            Capability::ChangeStreams => &self.change_streams,
            Capability::Oplog => &self.oplog,
            Capability::Transactions => &self.transactions,
            Capability::Majority => &self.majority,
            Capability::BeforeImages => &self.before_images,
            Capability::SnapshotReads => &self.snapshot_reads,
            Capability::DocumentsAsSent => &self.documents_as_sent,
            Capability::CappedBounds => &self.capped_bounds,
            Capability::ServerFilters => &self.server_filters,
            Capability::AwaitingTails => &self.awaiting_tails,
        }
    }

    /// The capabilities that are missing, each with its reason.
    pub fn missing(&self) -> impl Iterator<Item = (Capability, &str)> {
        Capability::ALL
            .into_iter()
            .filter_map(|c| self.get(c).reason().map(|r| (c, r)))
    }
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities::all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_lists_only_what_is_missing_with_its_reason() {
        let mut caps = Capabilities::all();
        assert_eq!(caps.missing().count(), 0);
        caps.change_streams = Support::No {
            reason: "NotImplemented (238)".into(),
        };
        caps.majority = Support::No {
            reason: "no setVersion".into(),
        };
        let missing: Vec<_> = caps.missing().collect();
        assert_eq!(
            missing,
            vec![
                (Capability::ChangeStreams, "NotImplemented (238)"),
                (Capability::Majority, "no setVersion"),
            ]
        );
        assert!(caps.get(Capability::Oplog).is_yes());
    }

    #[test]
    fn support_serialises_as_a_flag_with_its_reason() {
        let no = Support::No {
            reason: "why".into(),
        };
        assert_eq!(
            serde_json::to_value(&no).ok(),
            Some(serde_json::json!({"supported": false, "reason": "why"}))
        );
        assert_eq!(
            serde_json::to_value(Support::Yes).ok(),
            Some(serde_json::json!({"supported": true}))
        );
    }
}
