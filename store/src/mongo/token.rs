//! The "read up to" cell of a [`ChangeStream`](crate::ChangeStream), which both change
//! feeds (the change stream and the oplog watcher) move as they read.

use std::sync::{Arc, Mutex};

use crate::ResumeToken;

/// The token of the last change the stream has read, matching or not.
pub(crate) type TokenCell = Arc<Mutex<Option<ResumeToken>>>;

/// Sets the stream's read-up-to token.
pub(crate) fn publish(cell: &TokenCell, token: Option<ResumeToken>) {
    if let (Some(t), Ok(mut cur)) = (token, cell.lock()) {
        *cur = Some(t);
    }
}

/// Sets it only when nothing was read yet (the start position).
pub(crate) fn publish_if_unset(cell: &TokenCell, token: Option<ResumeToken>) {
    if let (Some(t), Ok(mut cur)) = (token, cell.lock())
        && cur.is_none()
    {
        *cur = Some(t);
    }
}
