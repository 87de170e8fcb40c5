//! The store contract suite against a MongoDB-compatible server, plus what only MongoDB can
//! show.
//!
//! Runs when `TAILRACE_TEST_MONGODB_URI` names a server: a MongoDB replica set (a single-node
//! one will do, e.g. `mongodb://localhost:27017/?replicaSet=rs0`), or FerretDB
//! (`scripts/ferretdb.sh start` prints its URI; CI runs the suite against it). Each check uses a
//! fresh database, `tailrace_test_<pid>_<nanos>_<n>`, dropped at its end.
//!
//! This file is its own test harness (`harness = false`, libtest-mimic), because whether a
//! check can run is only known at run time: before the checks, the engine's capability probe
//! asks the server what it supports (`Store::capabilities`), and a check that needs something
//! the server lacks is reported as **ignored**, labelled `[needs <capability>]`, with the
//! server's reply printed once above the results. Nothing is skipped by the server's name.
//! Without the variable every server check is ignored with that reason; with it, a server that
//! cannot be reached fails the run (skip when not configured, fail when configured but broken).
//!
//! The `wire_*` checks always run: they pin the commands the engine sends against a scripted
//! stand-in on 127.0.0.1 (options, write concerns, tailable flags, the order of a stream's open
//! and the writes after it), which a server does not show.
//!
//! `cargo test -p store --features mongodb --test mongodb` (or `-- --include-ignored` to run an
//! ignored check anyway and see it fail).

#![allow(clippy::unwrap_used)]

#[macro_use]
mod contract;

use std::panic::AssertUnwindSafe;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::FutureExt;
use futures::future::LocalBoxFuture;
use libtest_mimic::{Arguments, Trial};
use mongodb::bson::{Bson, Document as BsonDoc, doc};
use serde_json::json;
use store::mongo::{MongoOptions, MongoStore};
use store::{Capabilities, Capability, CappedSpec, Durability, Start, Store, StoreError, Support};

const URI_VAR: &str = "TAILRACE_TEST_MONGODB_URI";

/// A store on a database of its own, dropped by [`TestDb::finish`].
struct TestDb {
    store: MongoStore,
    name: String,
    uri: String,
}

fn database_name() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "tailrace_test_{}_{nanos}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

impl TestDb {
    async fn open(uri: &str, options: MongoOptions) -> TestDb {
        let name = database_name();
        let store = Self::connect(uri, &name, options).await;
        TestDb {
            store,
            name,
            uri: uri.to_string(),
        }
    }

    async fn connect(uri: &str, name: &str, options: MongoOptions) -> MongoStore {
        match MongoStore::connect(uri, name, options).await {
            Ok(store) => store,
            Err(e) => panic!(
                "{URI_VAR} is set ({uri}) but the server cannot be used there: {e} \
                 (unset it to skip the MongoDB suite)"
            ),
        }
    }

    /// Drops the database and closes the store, then fails if the check failed.
    async fn finish(self, outcome: std::thread::Result<()>) {
        let dropped = self.store.database().drop().await;
        let closed = self.store.close().await;
        if let Err(panic) = outcome {
            std::panic::resume_unwind(panic);
        }
        dropped.unwrap_or_else(|e| panic!("dropping test database {}: {e}", self.name));
        closed.unwrap();
    }
}

/// A check that needs a server: its name, what it needs, the engine options, and its body.
struct ServerCheck {
    name: &'static str,
    needs: Vec<Need>,
    options: fn() -> MongoOptions,
    body: for<'a> fn(&'a TestDb) -> LocalBoxFuture<'a, ()>,
}

/// What a check needs of the server.
#[derive(Clone, Copy, Debug)]
enum Need {
    /// A capability the engine's probe reports.
    Engine(Capability),
    /// `explain` answering in MongoDB's format (`queryPlanner.winningPlan`), which the check
    /// reads to see the index used. The harness asks the server itself.
    MongoExplain,
}

impl Need {
    fn name(self) -> String {
        match self {
            Need::Engine(c) => c.as_str().to_string(),
            Need::MongoExplain => "MongoDB's explain format".to_string(),
        }
    }
}

fn default_options() -> MongoOptions {
    MongoOptions::default()
}

fn raw_oplog_options() -> MongoOptions {
    MongoOptions {
        raw_oplog: true,
        ..MongoOptions::default()
    }
}

/// What the server behind the URI supports: the engine's probe, and the harness's own.
struct Probed {
    uri: String,
    capabilities: Capabilities,
    mongo_explain: Support,
}

impl Probed {
    fn support(&self, need: Need) -> &Support {
        match need {
            Need::Engine(c) => self.capabilities.get(c),
            Need::MongoExplain => &self.mongo_explain,
        }
    }
}

/// Connects once, reads the engine's capability probe and checks `explain`'s format; prints
/// what is missing and why. Panics (failing the run) when the URI is set but unusable.
async fn probe(uri: &str) -> Probed {
    let t = TestDb::open(uri, MongoOptions::default()).await;
    let capabilities = t.store.capabilities();
    let plan = t
        .store
        .database()
        .run_command(doc! {
            "explain": {"find": "probe", "filter": {"a": 1_i64}},
            "verbosity": "queryPlanner",
        })
        .await;
    let mongo_explain = match plan {
        Ok(p)
            if p.get_document("queryPlanner")
                .is_ok_and(|q| q.contains_key("winningPlan")) =>
        {
            Support::Yes
        }
        Ok(p) => Support::No {
            reason: format!("explain answered without queryPlanner.winningPlan: {p}"),
        },
        Err(e) => Support::No {
            reason: format!("explain answered {e}"),
        },
    };
    t.finish(Ok(())).await;
    let probed = Probed {
        uri: uri.to_string(),
        capabilities,
        mongo_explain,
    };
    eprintln!("MongoDB contract suite against {uri}");
    let mut missing = false;
    for need in Capability::ALL
        .into_iter()
        .map(Need::Engine)
        .chain([Need::MongoExplain])
    {
        if let Some(reason) = probed.support(need).reason() {
            missing = true;
            eprintln!("  missing {}: {reason}", need.name());
        }
    }
    if missing {
        eprintln!("  checks that need these are ignored, labelled [needs ...]");
    } else {
        eprintln!("  the server supports everything the suite checks");
    }
    probed
}

/// A trial for a server check: ignored (labelled with the first missing need) when the URI is
/// unset or the server lacks something it needs.
fn server_trial(check: ServerCheck, probed: Option<&std::sync::Arc<Probed>>) -> Trial {
    let Some(probed) = probed else {
        return Trial::test(check.name, || Ok(()))
            .with_ignored_flag(true)
            .with_kind(format!("needs {URI_VAR}"));
    };
    if let Some(need) = check
        .needs
        .iter()
        .copied()
        .find(|n| !probed.support(*n).is_yes())
    {
        return Trial::test(check.name, || Ok(()))
            .with_ignored_flag(true)
            .with_kind(format!("needs {}", need.name()));
    }
    let uri = probed.uri.clone();
    Trial::test(check.name, move || {
        runtime().block_on(async {
            let t = TestDb::open(&uri, (check.options)()).await;
            let outcome = AssertUnwindSafe((check.body)(&t)).catch_unwind().await;
            t.finish(outcome).await;
        });
        Ok(())
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a test runtime")
}

/// The contract checks, each with what it needs of the server.
fn contract_checks() -> Vec<ServerCheck> {
    let mut checks = Vec::new();
    macro_rules! add {
        ($($name:ident: [$($need:ident),*]),* $(,)?) => {$(
            checks.push(ServerCheck {
                name: stringify!($name),
                needs: vec![$(Need::Engine(Capability::$need)),*],
                options: default_options,
                body: |t| contract::$name(&t.store).boxed_local(),
            });
        )*};
    }
    contract::every_check!(add);
    // The checks whose meaning survives oplog mode (no before images; an update's after image
    // is read when the change is), again with `raw_oplog`.
    macro_rules! raw_oplog {
        ($($test:ident => $name:ident),* $(,)?) => {$(
            checks.push(ServerCheck {
                name: stringify!($test),
                needs: vec![Need::Engine(Capability::Oplog)],
                options: raw_oplog_options,
                body: |t| contract::$name(&t.store).boxed_local(),
            });
        )*};
    }
    raw_oplog!(
        raw_oplog_resume_from_token => resume_from_token,
        raw_oplog_across_collections => oplog_across_collections,
        raw_oplog_resume_token_advances_past_filtered => resume_token_advances_past_filtered,
    );
    checks
}

/// What only a MongoDB-compatible server shows.
fn server_checks() -> Vec<ServerCheck> {
    let check = |name, needs: Vec<Need>, body: for<'a> fn(&'a TestDb) -> LocalBoxFuture<'a, ()>| {
        ServerCheck {
            name,
            needs,
            options: default_options,
            body,
        }
    };
    vec![
        check("positions_continue_after_a_reopen", vec![], |t| {
            positions_continue_after_a_reopen(t).boxed_local()
        }),
        check(
            "an_existing_collection_that_is_not_capped_is_refused",
            vec![],
            |t| an_existing_collection_that_is_not_capped_is_refused(t).boxed_local(),
        ),
        check(
            "latest_reads_the_index_newest_first_without_sorting",
            vec![Need::MongoExplain],
            |t| latest_reads_the_index_newest_first_without_sorting(t).boxed_local(),
        ),
        check("a_tail_reports_ack_times_of_this_process", vec![], |t| {
            a_tail_reports_ack_times_of_this_process(t).boxed_local()
        }),
        check(
            "keyed_collections_open_again_after_a_restart",
            vec![],
            |t| keyed_collections_open_again_after_a_restart(t).boxed_local(),
        ),
        check(
            "several_keys_update_where_transactions_are_refused",
            vec![],
            |t| several_keys_update_where_transactions_are_refused(t).boxed_local(),
        ),
        check(
            "a_tail_overtaken_by_eviction_reports_position_lost",
            vec![],
            |t| a_tail_overtaken_by_eviction_reports_position_lost(t).boxed_local(),
        ),
        check(
            "an_append_whose_documents_are_already_stored_keeps_them_once",
            vec![],
            |t| an_append_whose_documents_are_already_stored_keeps_them_once(t).boxed_local(),
        ),
        check("a_named_update_sent_again_counts_once", vec![], |t| {
            a_named_update_sent_again_counts_once(t).boxed_local()
        }),
    ]
}

/// The checks against the scripted stand-in: no server needed.
fn wire_checks() -> Vec<Trial> {
    macro_rules! wire {
        ($($name:ident),* $(,)?) => {
            vec![$(Trial::test(stringify!($name), || {
                runtime().block_on($name());
                Ok(())
            })),*]
        };
    }
    wire!(
        wire_capped_create_append_and_tail,
        wire_keyed_changes_open_before_later_writes,
        wire_a_reader_overtaken_by_eviction_gets_position_lost,
        wire_an_insert_retried_after_its_reply_was_lost_stores_once,
        wire_named_updates_in_a_transaction_skip_what_landed,
        wire_a_polling_tail_takes_its_own_appends_from_memory,
    )
}

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let uri = std::env::var(URI_VAR).ok().filter(|u| !u.is_empty());
    // The probe connects only when a server check is going to run (not for `--list`, nor
    // when a filter selects only the wire checks).
    let wanted = |name: &str| {
        args.filter.as_deref().is_none_or(|f| {
            if args.exact {
                name == f
            } else {
                name.contains(f)
            }
        })
    };
    let checks: Vec<ServerCheck> = contract_checks()
        .into_iter()
        .chain(server_checks())
        .collect();
    let probed = match &uri {
        Some(uri) if !args.list && checks.iter().any(|c| wanted(c.name)) => {
            Some(std::sync::Arc::new(runtime().block_on(probe(uri))))
        }
        _ => {
            if uri.is_none() {
                if std::env::var_os("CI").is_some() {
                    // CI starts a server (scripts/ferretdb.sh): a suite that silently skips is
                    // how the engine once went untested.
                    eprintln!(
                        "{URI_VAR} is not set under CI: the MongoDB contract suite cannot run \
                         (.ci/run starts FerretDB with scripts/ferretdb.sh and sets it)"
                    );
                    return ExitCode::FAILURE;
                }
                eprintln!(
                    "{URI_VAR} is not set: the MongoDB contract suite is ignored \
                     (scripts/ferretdb.sh start prints a URI to set it to)"
                );
            }
            None
        }
    };
    let mut trials: Vec<Trial> = checks
        .into_iter()
        .map(|c| server_trial(c, probed.as_ref()))
        .collect();
    trials.push(
        Trial::test("history_lost", || Ok(()))
            .with_ignored_flag(true)
            .with_kind("needs a history smaller than MongoDB's 990 MB minimum oplog"),
    );
    trials.extend(wire_checks());
    libtest_mimic::run(&args, trials).exit_code()
}

// ---------------------------------------------------------------------------------------------
// What only a MongoDB-compatible server shows
// ---------------------------------------------------------------------------------------------

// `history_lost` needs a retained history it can overrun with a few thousand changes. The oplog
// is MongoDB's history, and it cannot be made that small: replSetResizeOplog's minimum is
// 990 MB, and overrunning that in a test takes minutes and slows the server for everyone else.
// The mapping of ChangeStreamHistoryLost (286) to HistoryLost is unit-tested in the engine.

fn spec(indexes: &[&str]) -> CappedSpec {
    CappedSpec {
        max_docs: 100,
        max_bytes: 1 << 20,
        indexes: indexes.iter().map(|s| s.to_string()).collect(),
    }
}

async fn positions_continue_after_a_reopen(t: &TestDb) {
    let c = t.store.capped("events", &spec(&[])).await.unwrap();
    let first = c
        .append(vec![contract::doc(json!({"a": 1}))], Durability::Journaled)
        .await
        .unwrap()[0];
    // A second store on the same database: a restarted process.
    let again = TestDb::connect(&t.uri, &t.name, MongoOptions::default()).await;
    let c2 = again.capped("events", &spec(&[])).await.unwrap();
    assert_eq!(c2.get(first).await.unwrap().unwrap().doc["a"], json!(1));
    let next = c2
        .append(vec![contract::doc(json!({"a": 2}))], Durability::Journaled)
        .await
        .unwrap()[0];
    assert!(next > first, "positions continue: {first} then {next}");
    let r = c2.get(next).await.unwrap().unwrap();
    assert!(
        r.committed_at_us.is_some(),
        "this process wrote it: its ack time is known"
    );
    let old = c2.get(first).await.unwrap().unwrap();
    assert_eq!(
        old.committed_at_us, None,
        "written by another process: unknown"
    );
    again.close().await.unwrap();
}

async fn an_existing_collection_that_is_not_capped_is_refused(t: &TestDb) {
    t.store.database().create_collection("plain").await.unwrap();
    let err = t
        .store
        .capped("plain", &spec(&[]))
        .await
        .err()
        .expect("refused");
    assert!(
        matches!(&err, StoreError::Incompatible { collection, .. } if collection == "plain"),
        "got {err}"
    );
    t.store
        .database()
        .create_collection("small")
        .capped(true)
        .size(4096)
        .max(5)
        .await
        .unwrap();
    let err = t
        .store
        .capped("small", &spec(&[]))
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("collMod"), "names the fix: {err}");
}

async fn latest_reads_the_index_newest_first_without_sorting(t: &TestDb) {
    let c = t.store.capped("events", &spec(&["user.id"])).await.unwrap();
    // Enough documents that the planner can tell the index from an `_id` scan.
    let docs = (0..50)
        .map(|i| contract::doc(json!({"user": {"id": i % 10}})))
        .collect();
    c.append(docs, Durability::Acknowledged).await.unwrap();
    let plan = t
        .store
        .database()
        .run_command(doc! {
            "explain": {
                "find": "events",
                "filter": {"user.id": 7_i64},
                "sort": {"_id": -1},
                "limit": 20,
            },
            "verbosity": "queryPlanner",
        })
        .await
        .unwrap();
    let winning = plan
        .get_document("queryPlanner")
        .and_then(|q| q.get_document("winningPlan"))
        .map(BsonDoc::to_string)
        .unwrap_or_else(|_| plan.to_string());
    assert!(
        winning.contains("tailrace_latest_user.id"),
        "the plan should use the latest index: {winning}"
    );
    assert!(
        !winning.contains("\"SORT\""),
        "newest-first must come from the index, not a sort: {winning}"
    );
}

/// A keyed collection opens again, in this process and in a restarted one, whatever the
/// server thinks of switching pre- and post-images on (`collMod` needs more than the readWrite
/// role, and some servers do not implement it): a refusal costs before images, not the open.
async fn keyed_collections_open_again_after_a_restart(t: &TestDb) {
    let k = t.store.keyed("rollups").await.unwrap();
    k.update(
        vec![store::KeyUpdate::new("a", store::Update::inc("n", 1))],
        Durability::Acknowledged,
    )
    .await
    .unwrap();
    t.store.keyed("rollups").await.expect("opens again");
    let again = TestDb::connect(&t.uri, &t.name, MongoOptions::default()).await;
    let k2 = again.keyed("rollups").await.expect("opens after a restart");
    assert_eq!(k2.get("a").await.unwrap().unwrap()["n"], json!(1));
    again.close().await.unwrap();
}

/// An update of several keys lands whole, in one transaction where the server runs them and
/// one key at a time where it refuses them (the probe decides).
async fn several_keys_update_where_transactions_are_refused(t: &TestDb) {
    let k = t.store.keyed("rollups").await.unwrap();
    let ku = store::KeyUpdate::new;
    k.update(
        vec![
            ku("a", store::Update::inc("n", 1)),
            ku("b", store::Update::inc("n", 2)),
            ku("a", store::Update::inc("n", 3).and_set("tag", "x")),
        ],
        Durability::Journaled,
    )
    .await
    .expect("the update is taken");
    let a = k.get("a").await.unwrap().unwrap();
    assert_eq!((&a["n"], &a["tag"]), (&json!(4), &json!("x")));
    assert_eq!(k.get("b").await.unwrap().unwrap()["n"], json!(2));
}

/// Named updates ([`store::WriteId`]) sent again after a request that did not succeed (as
/// the ingester does after a failure, and after a reply lost with its connection) count once:
/// whole or by their tail, in one or several commands (more keys than one command carries),
/// with and without a transaction (the probe decides), and after a request dropped on its
/// way. A key created meanwhile by another writer takes the update. Readers never see the
/// names.
async fn a_named_update_sent_again_counts_once(t: &TestDb) {
    use store::{KeyUpdate, Update, WriteId};
    let k = t.store.keyed("rollups").await.unwrap();
    let raw = t.store.database().collection::<BsonDoc>("rollups");
    // A document whose `count` no `$inc` can add to: a statement the server refuses.
    raw.insert_one(doc! {"_id": "bad", "count": "text"})
        .await
        .unwrap();
    // All 64 bits, as a writer drawn at random may have.
    let writer = u64::MAX - 6;
    let named = |key: &str, seq: u64, update: Update| {
        KeyUpdate::new(key, update).once(WriteId { writer, seq })
    };
    let refused = |seq: u64| named("bad", seq, Update::inc("count", 1));
    let tag = "hashtags:東京🚀";
    let mut batch = vec![
        named(tag, 1, Update::inc("count", 1)),
        named(
            "source:s",
            2,
            Update::inc("count", 1).and_set("last", "مرحبا"),
        ),
        named(
            "source:s",
            3,
            Update::inc("count", 1).and_set("last", "naïve"),
        ),
    ];
    // More keys than one `update` command carries (32), so the batch spans commands; the
    // refused statement comes after the first command.
    for i in 0..40 {
        batch.push(named(&format!("user:{i}"), 4 + i, Update::inc("count", 1)));
    }
    let mut failing = batch.clone();
    failing.insert(36, refused(100));
    let count = async |key: &str| k.get(key).await.unwrap().unwrap()["count"].clone();
    let failed = k.update(failing, Durability::Acknowledged).await;
    assert!(failed.is_err(), "the refused statement fails the request");
    k.update(batch.clone(), Durability::Acknowledged)
        .await
        .expect("sent again whole, without the refused statement");
    assert_eq!(count(tag).await, json!(1), "counted once");
    let s = k.get("source:s").await.unwrap().unwrap();
    assert_eq!((&s["count"], &s["last"]), (&json!(2), &json!("naïve")));
    assert_eq!(count("user:0").await, json!(1));
    assert_eq!(count("user:39").await, json!(1));

    // Settled: later names go out plain, and apply.
    k.update(
        vec![named(tag, 44, Update::inc("count", 5))],
        Durability::Acknowledged,
    )
    .await
    .unwrap();
    assert_eq!(count(tag).await, json!(6));

    // A request dropped on its way (polled once) may or may not have landed: sent again, it
    // counts once either way.
    raw.insert_one(doc! {"_id": "fresh", "count": 100_i64})
        .await
        .unwrap();
    let again = vec![
        named(tag, 45, Update::inc("count", 1)),
        named("fresh", 46, Update::inc("count", 1)),
    ];
    // Polled exactly once, then dropped (a timeout of zero is no such thing: tokio's timer
    // fires on its next millisecond tick, time enough for the request to finish).
    let dropped = k
        .update(again.clone(), Durability::Acknowledged)
        .now_or_never();
    assert!(dropped.is_none(), "one poll cannot finish a request");
    k.update(again, Durability::Acknowledged).await.unwrap();
    assert_eq!(count(tag).await, json!(7));
    assert_eq!(
        count("fresh").await,
        json!(101),
        "a key created without a name takes a named update"
    );

    // Failed before its update of a key that another writer creates meanwhile: sent again,
    // the update applies to that document.
    let failed = k
        .update(
            vec![refused(101), named("late", 47, Update::inc("count", 1))],
            Durability::Acknowledged,
        )
        .await;
    assert!(failed.is_err());
    raw.insert_one(doc! {"_id": "late", "count": 10_i64})
        .await
        .unwrap();
    k.update(
        vec![named("late", 47, Update::inc("count", 1))],
        Durability::Acknowledged,
    )
    .await
    .unwrap();
    assert_eq!(count("late").await, json!(11));

    // The names are the engine's: no reader sees them.
    let read = k.get(tag).await.unwrap().unwrap();
    let scanned = k.scan("hashtags:").await.unwrap();
    for doc in [&read, &scanned[0].doc] {
        assert!(
            doc.keys().all(|f| !f.starts_with("_tailrace")),
            "the engine's fields are left out: {doc:?}"
        );
    }
    let stored = raw.find_one(doc! {"_id": tag}).await.unwrap().unwrap();
    assert_eq!(stored.get_i64("_tailrace_seq").ok(), Some(45), "{stored}");
}

/// A tail whose next document is evicted while it waits reports `PositionLost`, on a server
/// that evicts at insert (MongoDB) and on one that evicts in the background (FerretDB, whose
/// `compact` runs that cleanup now; it answers the tail's next getMore with an InternalError,
/// after which the tail re-opens and finds the position gone).
async fn a_tail_overtaken_by_eviction_reports_position_lost(t: &TestDb) {
    let spec = CappedSpec {
        max_docs: 200,
        max_bytes: 1 << 20,
        indexes: vec![],
    };
    let c = t.store.capped("small", &spec).await.unwrap();
    let docs = |from: i64, n: i64| {
        (from..from + n)
            .map(|i| contract::doc(json!({"n": i})))
            .collect::<Vec<_>>()
    };
    // More than a first batch (101), so the server keeps the cursor open and the loss shows
    // on a getMore, not only when the tail re-opens.
    c.append(docs(0, 150), Durability::Acknowledged)
        .await
        .unwrap();
    let mut tail = c.tail(Start::Oldest);
    let first = tokio::time::timeout(contract::WAIT, futures::StreamExt::next(&mut tail))
        .await
        .expect("the tail yields")
        .expect("the tail does not end")
        .unwrap();
    assert_eq!(first.doc["n"], json!(0));
    c.append(docs(150, 300), Durability::Acknowledged)
        .await
        .unwrap();
    // MongoDB has evicted already; a server that evicts in the background does it now.
    let _ = t
        .store
        .database()
        .run_command(doc! {"compact": "small", "force": true})
        .await;
    let deadline = tokio::time::Instant::now() + contract::WAIT;
    loop {
        let next = tokio::time::timeout_at(deadline, futures::StreamExt::next(&mut tail))
            .await
            .expect("the tail reports the loss within the timeout")
            .expect("the tail does not end");
        match next {
            Err(e) => {
                assert!(e.is_position_lost(), "PositionLost, not: {e}");
                break;
            }
            // Documents still there when the tail read them are fine; the loss must follow.
            Ok(r) => assert!(
                r.doc["n"].as_i64().is_some_and(|n| n < 150),
                "a document after the evicted ones came without PositionLost first: {:?}",
                r.doc
            ),
        }
    }
}

async fn a_tail_reports_ack_times_of_this_process(t: &TestDb) {
    let c = t.store.capped("events", &spec(&[])).await.unwrap();
    let mut tail = c.tail(Start::Now);
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    c.append(
        vec![contract::doc(json!({"n": 1}))],
        Durability::Acknowledged,
    )
    .await
    .unwrap();
    let r = tokio::time::timeout(contract::WAIT, futures::StreamExt::next(&mut tail))
        .await
        .expect("tail yields")
        .expect("tail does not end")
        .unwrap();
    let at = r
        .committed_at_us
        .expect("ack time of a document this process wrote");
    assert!(
        at >= before,
        "ack time {at} is after the append began {before}"
    );
}

/// What a retried insert meets on a server that does not recognise retries: its own documents
/// at its positions (the first attempt stored them). The server's real duplicate-key reply is
/// read: the documents stored as sent are the append's, each kept once; another writer's
/// document at a position is not taken for the append's own.
async fn an_append_whose_documents_are_already_stored_keeps_them_once(t: &TestDb) {
    let c = t.store.capped("events", &spec(&[])).await.unwrap();
    let raw = t.store.database().collection::<BsonDoc>("events");
    let doc = contract::doc(json!({
        "text": "naïve café, 東京, مرحبا, 🚀🔥",
        "user": {"id": 7, "cost$": 1.5, "名前": "ユーザー"},
        "tags": ["x", "y"],
    }));
    let p = c
        .append(vec![doc.clone()], Durability::Acknowledged)
        .await
        .unwrap()[0];
    // The first attempt of the next append, as the server stored it: the same document, as
    // the engine wrote it, at the next position.
    let mut landed = raw
        .find_one(doc! {"_id": p.0 as i64})
        .await
        .unwrap()
        .expect("stored");
    landed.insert("_id", p.0 as i64 + 1);
    raw.insert_one(landed).await.unwrap();
    let again = c
        .append(vec![doc.clone()], Durability::Acknowledged)
        .await
        .expect("the document at its position is the append's own");
    assert_eq!(again, vec![store::Position(p.0 + 1)]);
    assert_eq!(
        raw.count_documents(doc! {}).await.unwrap(),
        2,
        "kept once, not written again"
    );
    assert_eq!(c.get(again[0]).await.unwrap().unwrap().doc.as_ref(), &doc);

    // Another writer's document at the next position is not the append's.
    let foreign = doc! {"_id": p.0 as i64 + 2, "writer": "another"};
    raw.insert_one(foreign.clone()).await.unwrap();
    let refused = c
        .append(
            vec![contract::doc(json!({"n": 1}))],
            Durability::Acknowledged,
        )
        .await;
    assert!(
        refused.is_err(),
        "a position held by another document is refused: {refused:?}"
    );
    assert_eq!(
        raw.find_one(doc! {"_id": p.0 as i64 + 2}).await.unwrap(),
        Some(foreign),
        "the other document is left as it was"
    );
    let after = c
        .append(
            vec![contract::doc(json!({"n": 1}))],
            Durability::Acknowledged,
        )
        .await
        .unwrap();
    assert_eq!(
        after,
        vec![store::Position(p.0 + 3)],
        "the next append goes after it"
    );
}

// ---------------------------------------------------------------------------------------------
// Wire shape: the commands the engine sends, checked against a scripted fake server. These
// run without MongoDB: they pin how the driver is used (options, write concerns, tailable
// flags, the change-stream stages, the order of a stream's open and the writes after it).
// They say nothing of the server's semantics, which the contract suite above checks.
// ---------------------------------------------------------------------------------------------

mod fake {
    //! A MongoDB stand-in speaking just enough OP_MSG for the engine's commands. Each command
    //! is logged; replies are scripted (tiny in-memory collections serve find/getMore).

    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use mongodb::bson::{Bson, DateTime, Document as BsonDoc, Timestamp, doc};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    #[derive(Default)]
    struct State {
        /// name → (create options, documents)
        colls: HashMap<String, (BsonDoc, Vec<BsonDoc>)>,
        /// cursor id → (collection, last `_id` returned) for tails; `None` for change streams.
        cursors: HashMap<i64, Option<(String, i64)>>,
        next_cursor: i64,
        /// Closes every tailable cursor after its first batch, as FerretDB does.
        close_tails: bool,
    }

    /// The fake server: its address and every command it received, in order.
    pub struct Fake {
        pub uri: String,
        log: Arc<Mutex<Vec<BsonDoc>>>,
        lose_insert_reply: Arc<AtomicBool>,
    }

    impl Fake {
        pub async fn start() -> Fake {
            Fake::start_with(false).await
        }

        /// A server whose tailable cursors close after their first batch (FerretDB's), so
        /// that tails poll.
        pub async fn start_closing_tails() -> Fake {
            Fake::start_with(true).await
        }

        async fn start_with(close_tails: bool) -> Fake {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            let log = Arc::new(Mutex::new(Vec::new()));
            let state = Arc::new(Mutex::new(State {
                close_tails,
                ..State::default()
            }));
            let lose_insert_reply = Arc::new(AtomicBool::new(false));
            let (l, a, lose) = (log.clone(), addr.clone(), lose_insert_reply.clone());
            tokio::spawn(async move {
                while let Ok((sock, _)) = listener.accept().await {
                    tokio::spawn(serve(
                        sock,
                        l.clone(),
                        state.clone(),
                        a.clone(),
                        lose.clone(),
                    ));
                }
            });
            Fake {
                uri: format!(
                    "mongodb://{addr}/?directConnection=true&serverSelectionTimeoutMS=3000"
                ),
                log,
                lose_insert_reply,
            }
        }

        /// The next `insert` is applied, then its connection closes without a reply: a
        /// server killed between its commit and its answer.
        pub fn lose_next_insert_reply(&self) {
            self.lose_insert_reply.store(true, Ordering::SeqCst);
        }

        /// Commands named `name`, in order.
        pub fn commands(&self, name: &str) -> Vec<BsonDoc> {
            self.log
                .lock()
                .unwrap()
                .iter()
                .filter(|c| c.keys().next().is_some_and(|k| k == name))
                .cloned()
                .collect()
        }

        /// The `create` command of collection `name` (the capability probe creates its own
        /// scratch collection first).
        pub fn created(&self, name: &str) -> BsonDoc {
            self.commands("create")
                .into_iter()
                .find(|c| c.get_str("create").ok() == Some(name))
                .unwrap_or_else(|| panic!("no create of {name}"))
        }

        /// Names of all commands, in order (heartbeats left out).
        pub fn names(&self) -> Vec<String> {
            self.log
                .lock()
                .unwrap()
                .iter()
                .filter_map(|c| c.keys().next().cloned())
                .filter(|n| n != "hello" && n != "isMaster")
                .collect()
        }
    }

    fn le_i32(b: &[u8]) -> i32 {
        i32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    async fn serve(
        mut sock: TcpStream,
        log: Arc<Mutex<Vec<BsonDoc>>>,
        state: Arc<Mutex<State>>,
        addr: String,
        lose_insert_reply: Arc<AtomicBool>,
    ) -> std::io::Result<()> {
        loop {
            let mut header = [0u8; 16];
            sock.read_exact(&mut header).await?;
            let len = le_i32(&header[0..4]) as usize;
            let request_id = le_i32(&header[4..8]);
            assert_eq!(
                le_i32(&header[12..16]),
                2013,
                "the driver speaks OP_MSG only"
            );
            let mut body = vec![0u8; len - 16];
            sock.read_exact(&mut body).await?;
            let flags = u32::from_le_bytes([body[0], body[1], body[2], body[3]]);
            let end = if flags & 1 != 0 {
                body.len() - 4
            } else {
                body.len()
            };
            let mut i = 4;
            let mut cmd = BsonDoc::new();
            let mut sequences = Vec::new();
            while i < end {
                let kind = body[i];
                i += 1;
                let n = le_i32(&body[i..]) as usize;
                if kind == 0 {
                    cmd = BsonDoc::from_reader(&body[i..i + n]).unwrap();
                } else {
                    let section = &body[i + 4..i + n];
                    let zero = section.iter().position(|b| *b == 0).unwrap();
                    let id = String::from_utf8(section[..zero].to_vec()).unwrap();
                    let mut docs = Vec::new();
                    let mut j = zero + 1;
                    while j < section.len() {
                        let m = le_i32(&section[j..]) as usize;
                        docs.push(Bson::Document(
                            BsonDoc::from_reader(&section[j..j + m]).unwrap(),
                        ));
                        j += m;
                    }
                    sequences.push((id, docs));
                }
                i += n;
            }
            for (id, docs) in sequences {
                cmd.insert(id, docs);
            }
            log.lock().unwrap().push(cmd.clone());
            let reply = respond(&state, &cmd, &addr).await;
            if cmd.contains_key("insert") && lose_insert_reply.swap(false, Ordering::SeqCst) {
                return Ok(());
            }
            if flags & 2 != 0 {
                continue; // moreToCome: no reply expected
            }
            let bytes = reply.to_vec().unwrap();
            let total = 16 + 4 + 1 + bytes.len();
            let mut out = Vec::with_capacity(total);
            out.extend_from_slice(&(total as i32).to_le_bytes());
            out.extend_from_slice(&0i32.to_le_bytes());
            out.extend_from_slice(&request_id.to_le_bytes());
            out.extend_from_slice(&2013i32.to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
            out.push(0);
            out.extend_from_slice(&bytes);
            sock.write_all(&out).await?;
        }
    }

    fn id_of(d: &BsonDoc) -> i64 {
        match d.get("_id") {
            Some(Bson::Int64(i)) => *i,
            Some(Bson::Int32(i)) => i64::from(*i),
            _ => 0,
        }
    }

    /// The documents of `coll` matching `{}`, `{_id: n}` or `{_id: {$gt: n}}`.
    fn matching(state: &State, coll: &str, filter: &BsonDoc) -> Vec<BsonDoc> {
        let docs = state
            .colls
            .get(coll)
            .map(|c| c.1.clone())
            .unwrap_or_default();
        docs.into_iter()
            .filter(|d| match filter.get("_id") {
                None => true,
                Some(Bson::Document(op)) => match op.get("$gt") {
                    Some(Bson::Int64(n)) => id_of(d) > *n,
                    _ => true,
                },
                Some(v) => d.get("_id") == Some(v),
            })
            .collect()
    }

    async fn respond(state: &Arc<Mutex<State>>, cmd: &BsonDoc, addr: &str) -> BsonDoc {
        let name = cmd.keys().next().cloned().unwrap_or_default();
        let ok = doc! {"ok": 1.0};
        let mut reply = match name.as_str() {
            "hello" | "isMaster" | "ismaster" => doc! {
                "helloOk": true, "ismaster": true, "isWritablePrimary": true,
                "setName": "rs0", "hosts": [addr], "primary": addr, "me": addr,
                "setVersion": 1, "electionId": mongodb::bson::oid::ObjectId::new(),
                "maxBsonObjectSize": 16_777_216, "maxMessageSizeBytes": 48_000_000,
                "maxWriteBatchSize": 100_000, "localTime": DateTime::now(),
                "logicalSessionTimeoutMinutes": 30, "connectionId": 1,
                "minWireVersion": 0, "maxWireVersion": 21,
            },
            "listCollections" => {
                let want = cmd
                    .get_document("filter")
                    .ok()
                    .and_then(|f| f.get_str("name").ok())
                    .unwrap_or_default()
                    .to_string();
                let s = state.lock().unwrap();
                let batch: Vec<Bson> = s
                    .colls
                    .get(&want)
                    .map(|(o, _)| doc! {"name": want.as_str(), "type": "collection", "options": o.clone()})
                    .into_iter()
                    .map(Bson::Document)
                    .collect();
                doc! {"cursor": {"id": 0_i64, "ns": "t.$cmd.listCollections", "firstBatch": batch}}
            }
            "create" => {
                let coll = cmd.get_str("create").unwrap().to_string();
                let mut options = BsonDoc::new();
                for (k, v) in cmd {
                    if !["create", "$db", "lsid", "$clusterTime", "writeConcern"]
                        .contains(&k.as_str())
                    {
                        options.insert(k.clone(), v.clone());
                    }
                }
                state
                    .lock()
                    .unwrap()
                    .colls
                    .insert(coll, (options, Vec::new()));
                BsonDoc::new()
            }
            "createIndexes" => doc! {"numIndexesBefore": 1, "numIndexesAfter": 2},
            "listIndexes" => {
                doc! {"cursor": {"id": 0_i64, "ns": "t.$cmd.listIndexes", "firstBatch": [
                    {"v": 2, "key": {"_id": 1}, "name": "_id_"}
                ]}}
            }
            "insert" => {
                let coll = cmd.get_str("insert").unwrap().to_string();
                let docs: Vec<BsonDoc> = cmd
                    .get_array("documents")
                    .unwrap()
                    .iter()
                    .filter_map(|d| d.as_document().cloned())
                    .collect();
                let mut s = state.lock().unwrap();
                let (options, stored) = s.colls.entry(coll).or_default();
                // Ordered, and `_id` unique: a duplicate stops the insert there. A retried
                // write is not recognised as one (as on FerretDB).
                let mut n = 0;
                let mut refused = None;
                for (i, d) in docs.into_iter().enumerate() {
                    if stored.iter().any(|s| s.get("_id") == d.get("_id")) {
                        refused = Some(doc! {
                            "index": i as i32, "code": 11000,
                            "errmsg": format!("E11000 duplicate key error dup key: {{ _id: {} }}", id_of(&d)),
                        });
                        break;
                    }
                    stored.push(d);
                    n += 1;
                }
                // Capped by count, oldest first, like the server.
                if let Ok(max) = options.get_i64("max") {
                    let excess = stored.len().saturating_sub(max as usize);
                    stored.drain(..excess);
                }
                match refused {
                    None => doc! {"n": n},
                    Some(e) => doc! {"n": n, "writeErrors": [e]},
                }
            }
            "update" => doc! {"n": 1, "nModified": 0, "upserted": [{"index": 0, "_id": "k"}]},
            "find" => {
                let coll = cmd.get_str("find").unwrap().to_string();
                let filter = cmd.get_document("filter").cloned().unwrap_or_default();
                let mut s = state.lock().unwrap();
                let mut docs = matching(&s, &coll, &filter);
                if cmd
                    .get_document("sort")
                    .ok()
                    .and_then(|d| d.get_i32("_id").ok())
                    == Some(-1)
                {
                    docs.reverse();
                }
                if let Ok(limit) = cmd.get_i64("limit") {
                    docs.truncate(limit as usize);
                }
                let tailable = cmd.get_bool("tailable").unwrap_or(false);
                let empty = s.colls.get(&coll).is_none_or(|c| c.1.is_empty());
                let id = if tailable && !empty && !s.close_tails {
                    s.next_cursor += 1;
                    let last = docs
                        .last()
                        .map(id_of)
                        .unwrap_or_else(|| match filter.get("_id") {
                            Some(Bson::Document(op)) => op.get_i64("$gt").unwrap_or(0),
                            _ => 0,
                        });
                    let id = s.next_cursor;
                    s.cursors.insert(id, Some((coll.clone(), last)));
                    id
                } else {
                    0
                };
                let batch: Vec<Bson> = docs.into_iter().map(Bson::Document).collect();
                doc! {"cursor": {"id": id, "ns": format!("t.{coll}"), "firstBatch": batch}}
            }
            "getMore" => {
                let id = cmd.get_i64("getMore").unwrap();
                let wait = cmd.get_i32("maxTimeMS").unwrap_or(100).clamp(0, 200) as u64;
                let deadline = tokio::time::Instant::now() + Duration::from_millis(wait);
                loop {
                    let cursor = state.lock().unwrap().cursors.get(&id).cloned().flatten();
                    let batch: Vec<BsonDoc> = match &cursor {
                        Some((coll, last)) => {
                            let s = state.lock().unwrap();
                            matching(&s, coll, &doc! {"_id": {"$gt": *last}})
                        }
                        None => Vec::new(),
                    };
                    if !batch.is_empty() || tokio::time::Instant::now() >= deadline {
                        if let (Some((coll, _)), Some(last)) = (&cursor, batch.last()) {
                            state
                                .lock()
                                .unwrap()
                                .cursors
                                .insert(id, Some((coll.clone(), id_of(last))));
                        }
                        let batch: Vec<Bson> = batch.into_iter().map(Bson::Document).collect();
                        break doc! {"cursor": {
                            "id": id, "ns": "t.x", "nextBatch": batch,
                            "postBatchResumeToken": {"_data": "8200000002"},
                        }};
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            "aggregate" => {
                let pipeline = cmd.get_array("pipeline").unwrap();
                let first = pipeline[0].as_document().unwrap();
                if first.contains_key("$changeStream") {
                    let mut s = state.lock().unwrap();
                    s.next_cursor += 1;
                    let id = s.next_cursor;
                    s.cursors.insert(id, None);
                    doc! {
                        "cursor": {"id": id, "ns": "t.$cmd.aggregate", "firstBatch": [],
                                   "postBatchResumeToken": {"_data": "8200000001"}},
                        "operationTime": Timestamp { time: 1, increment: 1 },
                    }
                } else {
                    let coll = cmd.get_str("aggregate").unwrap_or("x").to_string();
                    let n = state
                        .lock()
                        .unwrap()
                        .colls
                        .get(&coll)
                        .map(|c| c.1.len())
                        .unwrap_or(0);
                    doc! {"cursor": {"id": 0_i64, "ns": "t.x", "firstBatch": [
                        {"storageStats": {"count": n as i64, "size": 100 * n as i64}}
                    ]}}
                }
            }
            _ => BsonDoc::new(),
        };
        reply.extend(ok);
        reply
    }
}

/// A store on the fake server.
async fn fake_store(fake: &fake::Fake) -> MongoStore {
    let options = MongoOptions {
        max_await_time: std::time::Duration::from_millis(100),
        ..MongoOptions::default()
    };
    tokio::time::timeout(contract::WAIT, MongoStore::connect(&fake.uri, "t", options))
        .await
        .expect("connect answers")
        .expect("connect to the fake server")
}

/// On a server whose tailable cursors close after each batch, a caught-up tail takes this
/// process's appends from the writer's memory: no re-open of the collection, which such a
/// server answers by reading all of it (FerretDB). Another process's document is still found:
/// after a quiet second, by a lookup of the next position, then a read of the server.
async fn wire_a_polling_tail_takes_its_own_appends_from_memory() {
    let fake = fake::Fake::start_closing_tails().await;
    let store = fake_store(&fake).await;
    assert!(
        !store.capabilities().awaiting_tails.is_yes(),
        "the probe sees cursors closing: {:?}",
        store.capabilities().awaiting_tails
    );
    let spec = CappedSpec {
        max_docs: 100,
        max_bytes: 1 << 20,
        indexes: vec![],
    };
    let c = store.capped("events", &spec).await.unwrap();
    let n = |i: i64| contract::doc(json!({"n": i}));
    c.append(vec![n(0), n(1), n(2)], Durability::Acknowledged)
        .await
        .unwrap();
    let mut tail = c.tail(Start::Oldest);
    for want in 0..3 {
        assert_eq!(
            contract::next_record(&mut tail).await.doc["n"],
            json!(want),
            "read from the server"
        );
    }
    let reopens = || {
        fake.commands("find")
            .iter()
            .filter(|f| {
                f.get_str("find").ok() == Some("events")
                    && f.get_bool("tailable").ok() == Some(true)
            })
            .count()
    };
    let before = reopens();
    for i in 3..13 {
        c.append(vec![n(i)], Durability::Acknowledged)
            .await
            .unwrap();
        let r = contract::next_record(&mut tail).await;
        assert_eq!(r.doc["n"], json!(i));
        assert!(r.committed_at_us.is_some(), "its acknowledgment time");
    }
    assert_eq!(
        reopens(),
        before,
        "a caught-up tail re-opened the collection for its own process's appends"
    );
    // Another process appends (its own store: its own writer and memory).
    let other = fake_store(&fake).await;
    let oc = other.capped("events", &spec).await.unwrap();
    let p = oc
        .append(vec![n(100)], Durability::Acknowledged)
        .await
        .unwrap();
    assert_eq!(p, vec![store::Position(14)]);
    let r = contract::next_record(&mut tail).await;
    assert_eq!((r.position, r.doc["n"].clone()), (p[0], json!(100)));
    assert!(reopens() > before, "found by reading the server");
}

async fn wire_capped_create_append_and_tail() {
    let fake = fake::Fake::start().await;
    let store = fake_store(&fake).await;
    let spec = CappedSpec {
        max_docs: 100,
        max_bytes: 1 << 20,
        indexes: vec!["user.id".into()],
    };
    let c = store.capped("events", &spec).await.unwrap();

    let create = &fake.created("events");
    assert_eq!(create.get_bool("capped").ok(), Some(true), "{create}");
    assert_eq!(create.get_i64("size").ok(), Some(1 << 20), "{create}");
    assert_eq!(create.get_i64("max").ok(), Some(100), "{create}");
    let index = fake.commands("createIndexes")[0]
        .get_array("indexes")
        .unwrap()[0]
        .as_document()
        .unwrap()
        .clone();
    assert_eq!(
        index.get_document("key").unwrap(),
        &doc! {"user.id": 1, "_id": 1}
    );
    assert_eq!(index.get_str("name").unwrap(), "tailrace_latest_user.id");

    let mut tail = c.tail(Start::Oldest);
    let p = c
        .append(
            vec![
                contract::doc(json!({"n": 0})),
                contract::doc(json!({"n": 1})),
            ],
            Durability::Journaled,
        )
        .await
        .unwrap();
    assert_eq!(p, vec![store::Position(1), store::Position(2)]);
    let inserts: Vec<BsonDoc> = fake
        .commands("insert")
        .into_iter()
        .filter(|i| i.get_str("insert").ok() == Some("events"))
        .collect();
    let insert = &inserts[0];
    assert_eq!(
        insert.get_bool("ordered").ok(),
        Some(true),
        "ordered: {insert}"
    );
    assert_eq!(
        insert.get_document("writeConcern").unwrap(),
        &doc! {"w": 1, "wtimeout": 10_000, "j": true},
        "journaled = w:1, j:true, with the wtimeout"
    );
    let first = insert.get_array("documents").unwrap()[0]
        .as_document()
        .unwrap();
    assert_eq!(
        first.keys().next().map(String::as_str),
        Some("_id"),
        "_id first"
    );
    assert_eq!(first.get("_id"), Some(&Bson::Int64(1)));

    for want in 0..2 {
        let r = tokio::time::timeout(contract::WAIT, futures::StreamExt::next(&mut tail))
            .await
            .expect("tail yields")
            .expect("tail does not end")
            .unwrap();
        assert_eq!(r.doc["n"], json!(want));
        assert!(
            r.committed_at_us.is_some(),
            "written here: the ack time is known"
        );
    }
    // The next one arrives through a getMore on the live tailable cursor.
    let none = c
        .append(
            vec![contract::doc(json!({"n": 2}))],
            Durability::Unacknowledged,
        )
        .await
        .unwrap();
    assert!(none.is_empty(), "unacknowledged returns no positions");
    let r = tokio::time::timeout(contract::WAIT, futures::StreamExt::next(&mut tail))
        .await
        .expect("tail yields")
        .expect("tail does not end")
        .unwrap();
    assert_eq!(
        (r.position, r.doc["n"].clone()),
        (store::Position(3), json!(2))
    );
    let unack = fake
        .commands("insert")
        .into_iter()
        .filter(|i| i.get_str("insert").ok() == Some("events"))
        .nth(1)
        .expect("the unacknowledged insert");
    let unack = &unack;
    assert_eq!(
        unack
            .get_document("writeConcern")
            .unwrap()
            .get_i32("w")
            .ok(),
        Some(1),
        "unacknowledged goes out as w:1, never w:0: {unack}"
    );
    let find = fake
        .commands("find")
        .into_iter()
        .find(|f| f.get_bool("tailable").unwrap_or(false))
        .expect("a tailable find");
    assert_eq!(find.get_bool("awaitData").ok(), Some(true), "{find}");
    let get_more = &fake.commands("getMore")[0];
    assert_eq!(get_more.get_i32("maxTimeMS").ok(), Some(100), "{get_more}");

    drop(tail);
    tokio::time::timeout(contract::WAIT, store.close())
        .await
        .expect("close finishes")
        .unwrap();
}

/// In a transaction a guarded statement that matched nothing would abort it, so named updates
/// sent again are checked against the documents' names first, read inside the transaction:
/// what an earlier attempt landed is not sent again.
async fn wire_named_updates_in_a_transaction_skip_what_landed() {
    use store::{KeyUpdate, Update, WriteId};
    let fake = fake::Fake::start().await;
    let store = fake_store(&fake).await;
    let k = store.keyed("k").await.unwrap();
    // What an earlier attempt left, its reply lost: "a" updated under the name (42, 5).
    store
        .database()
        .collection::<BsonDoc>("k")
        .insert_one(
            doc! {"_id": "a", "n": 1_i64, "_tailrace_writer": 42_i64, "_tailrace_seq": 5_i64},
        )
        .await
        .unwrap();
    let named = |key: &str, seq: u64| {
        KeyUpdate::new(key, Update::inc("n", 1)).once(WriteId { writer: 42, seq })
    };
    let batch = vec![named("a", 5), named("b", 6)];
    // The earlier attempt: polled once and dropped on its way, its outcome unknown to the
    // engine (not a zero timeout, which may let it finish before its timer fires).
    let dropped = k
        .update(batch.clone(), Durability::Acknowledged)
        .now_or_never();
    assert!(dropped.is_none(), "one poll cannot finish a request");
    k.update(batch, Durability::Acknowledged).await.unwrap();
    let find = fake
        .commands("find")
        .into_iter()
        .rfind(|f| f.get_str("find").ok() == Some("k"))
        .expect("the names read");
    assert_eq!(
        find.get_document("filter").unwrap(),
        &doc! {"_id": {"$in": ["a", "b"]}}
    );
    assert_eq!(
        find.get_bool("startTransaction").ok(),
        Some(true),
        "read in the transaction's snapshot: {find}"
    );
    let update = fake
        .commands("update")
        .into_iter()
        .rfind(|u| u.get_str("update").ok() == Some("k"))
        .expect("the update");
    let statements = update.get_array("updates").unwrap();
    assert_eq!(statements.len(), 1, "only what did not land: {update}");
    let statement = statements[0].as_document().unwrap();
    assert_eq!(
        statement.get_document("q").unwrap(),
        &doc! {"_id": "b"},
        "no guard inside a transaction"
    );
    let set = statement
        .get_document("u")
        .unwrap()
        .get_document("$set")
        .unwrap();
    assert_eq!(
        (
            set.get_i64("_tailrace_writer").ok(),
            set.get_i64("_tailrace_seq").ok()
        ),
        (Some(42), Some(6)),
        "the update leaves its name: {set}"
    );
    let names = fake.names();
    let last_update = names.iter().rposition(|n| n == "update").unwrap();
    assert!(
        names[last_update..]
            .iter()
            .any(|n| n == "commitTransaction"),
        "committed: {names:?}"
    );

    // Settled: the next batch is sent for the first time, and nothing is read before it.
    let finds = fake.commands("find").len();
    k.update(vec![named("c", 7), named("d", 8)], Durability::Acknowledged)
        .await
        .unwrap();
    assert_eq!(
        fake.commands("find").len(),
        finds,
        "no read on the way of every write"
    );
}

async fn wire_keyed_changes_open_before_later_writes() {
    let fake = fake::Fake::start().await;
    let store = fake_store(&fake).await;
    let k = store.keyed("k").await.unwrap();
    // What the connect's capability probe sent is not this check's business.
    let opened = fake.names().len();
    let create = &fake.created("k");
    assert_eq!(
        create.get_document("changeStreamPreAndPostImages").unwrap(),
        &doc! {"enabled": true}
    );

    let filter = store::ChangeFilter {
        key_prefix: Some("yes:".into()),
        ..store::ChangeFilter::default()
    };
    let mut s = k.changes(filter, store::ChangeStart::Now);
    k.update(
        vec![store::KeyUpdate::new("yes:1", store::Update::inc("n", 1))],
        Durability::Majority,
    )
    .await
    .unwrap();
    let names = fake.names().split_off(opened);
    let agg = names
        .iter()
        .position(|n| n == "aggregate")
        .expect("the stream opened");
    let upd = names
        .iter()
        .position(|n| n == "update")
        .expect("the update was sent");
    assert!(
        agg < upd,
        "a write after changes(Now) waits for the stream to open: {names:?}"
    );

    let aggregate = fake
        .commands("aggregate")
        .pop()
        .expect("the stream's aggregate");
    let aggregate = &aggregate;
    let pipeline = aggregate.get_array("pipeline").unwrap();
    let stage = pipeline[0]
        .as_document()
        .unwrap()
        .get_document("$changeStream")
        .unwrap();
    assert_eq!(
        stage.get_str("fullDocument").ok(),
        Some("whenAvailable"),
        "{stage}"
    );
    assert_eq!(
        stage.get_str("fullDocumentBeforeChange").ok(),
        Some("whenAvailable"),
        "{stage}"
    );
    let matched = pipeline[1]
        .as_document()
        .unwrap()
        .get_document("$match")
        .unwrap();
    assert_eq!(
        matched.get_document("documentKey._id").unwrap(),
        &doc! {"$type": "string", "$regex": "^yes:"}
    );

    let update = fake.commands("update").pop().expect("the update");
    let update = &update;
    let statement = update.get_array("updates").unwrap()[0]
        .as_document()
        .unwrap();
    assert_eq!(statement.get_document("q").unwrap(), &doc! {"_id": "yes:1"});
    let u = statement.get_document("u").unwrap();
    assert_eq!(u.get_document("$inc").unwrap(), &doc! {"n": 1_i64}, "{u}");
    // The engine's write time rides along for the notify latency; a reader
    // never sees it (scan_page and snapshot strip it).
    let set = u.get_document("$set").unwrap();
    assert_eq!(
        set.keys().collect::<Vec<_>>(),
        ["_tailrace_written_us"],
        "{u}"
    );
    assert!(set.get_i64("_tailrace_written_us").unwrap() > 0, "{u}");
    assert_eq!(statement.get_bool("upsert").ok(), Some(true));
    assert_eq!(
        update.get_document("writeConcern").unwrap(),
        &doc! {"w": "majority", "wtimeout": 10_000, "j": true}
    );

    // A quiet stream: its token is the post-batch token of the empty getMore.
    assert!(
        tokio::time::timeout(
            std::time::Duration::from_millis(300),
            futures::StreamExt::next(&mut s)
        )
        .await
        .is_err(),
        "nothing arrives"
    );
    let token = s.resume_token().expect("a quiet stream still has a token");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&token.0).unwrap(),
        json!({"_data": "8200000002"}),
        "the post-batch token of the last empty batch"
    );

    // Several keys: one transaction.
    k.update(
        vec![
            store::KeyUpdate::new("a", store::Update::inc("n", 1)),
            store::KeyUpdate::new("b", store::Update::inc("n", 1)),
        ],
        Durability::Acknowledged,
    )
    .await
    .unwrap();
    let txn: Vec<BsonDoc> = fake
        .commands("update")
        .into_iter()
        .filter(|u| u.get_str("update").ok() == Some("k"))
        .skip(1)
        .collect();
    assert_eq!(txn.len(), 1, "one update command for the batch: {txn:?}");
    assert_eq!(
        txn[0].get_bool("startTransaction").ok(),
        Some(true),
        "{}",
        txn[0]
    );
    let keys: Vec<&str> = txn[0]
        .get_array("updates")
        .unwrap()
        .iter()
        .filter_map(|u| u.as_document()?.get_document("q").ok()?.get_str("_id").ok())
        .collect();
    assert_eq!(keys, ["a", "b"], "one ordered statement per key");
    assert_eq!(txn[0].get_bool("ordered").ok(), Some(true));
    assert!(
        txn[0].get("writeConcern").is_none(),
        "inside a transaction the commit carries the write concern: {}",
        txn[0]
    );
    let commit = fake
        .commands("commitTransaction")
        .pop()
        .expect("the transaction's commit");
    let commit = &commit;
    assert_eq!(
        commit
            .get_document("writeConcern")
            .unwrap()
            .get_i32("w")
            .ok(),
        Some(1)
    );

    store
        .save_checkpoint("feed", json!({"pos": 1}), Durability::Journaled)
        .await
        .unwrap();
    let cp = fake.commands("update").pop().unwrap();
    assert_eq!(cp.get_str("update").ok(), Some("checkpoints"));
    let statement = cp.get_array("updates").unwrap()[0].as_document().unwrap();
    assert_eq!(
        statement
            .get_document("u")
            .unwrap()
            .get_document("body")
            .unwrap(),
        &doc! {"pos": 1_i64}
    );
    assert_eq!(statement.get_bool("upsert").ok(), Some(true));

    drop(s);
    tokio::time::timeout(contract::WAIT, store.close())
        .await
        .expect("close finishes")
        .unwrap();
}

async fn wire_a_reader_overtaken_by_eviction_gets_position_lost() {
    let fake = fake::Fake::start().await;
    let store = fake_store(&fake).await;
    let spec = CappedSpec {
        max_docs: 5,
        max_bytes: 1 << 20,
        indexes: vec![],
    };
    let c = store.capped("events", &spec).await.unwrap();
    let docs = (0..20).map(|i| contract::doc(json!({"n": i}))).collect();
    let p = c.append(docs, Durability::Acknowledged).await.unwrap();
    let mut tail = c.tail(Start::After(p[1]));
    let err = tokio::time::timeout(contract::WAIT, futures::StreamExt::next(&mut tail))
        .await
        .expect("tail answers")
        .expect("an error, not an end")
        .expect_err("the next document was evicted");
    match err {
        StoreError::PositionLost { after, oldest, .. } => {
            assert_eq!((after, oldest), (p[1], p[15]));
        }
        other => panic!("expected PositionLost, got {other}"),
    }
    let mut again = c.tail(Start::Oldest);
    let r = tokio::time::timeout(contract::WAIT, futures::StreamExt::next(&mut again))
        .await
        .expect("tail yields")
        .expect("tail does not end")
        .unwrap();
    assert_eq!(r.position, p[15], "restarting from the oldest works");
    assert_eq!(
        c.bounds().await.unwrap(),
        Some(store::Bounds {
            oldest: p[15],
            newest: p[19]
        })
    );
    assert_eq!(c.usage().await.unwrap().docs, 5, "$collStats count");
    drop((tail, again));
    tokio::time::timeout(contract::WAIT, store.close())
        .await
        .expect("close finishes")
        .unwrap();
}

/// The server stores an insert and its connection closes before the reply; the driver sends
/// the insert again (a retryable write), which the server does not know for a retry and
/// refuses at its first document as a duplicate `_id`, as FerretDB does. The append succeeds
/// with each document stored once, and the next one continues after them.
async fn wire_an_insert_retried_after_its_reply_was_lost_stores_once() {
    let fake = fake::Fake::start().await;
    let store = fake_store(&fake).await;
    let c = store.capped("events", &spec(&[])).await.unwrap();
    let first = c
        .append(
            vec![contract::doc(json!({"n": 0}))],
            Durability::Acknowledged,
        )
        .await
        .unwrap();
    fake.lose_next_insert_reply();
    let docs = (1..4).map(|i| contract::doc(json!({"n": i}))).collect();
    let p = tokio::time::timeout(contract::WAIT, c.append(docs, Durability::Acknowledged))
        .await
        .expect("append answers")
        .expect("the documents the first attempt stored are this append's");
    let inserts: Vec<BsonDoc> = fake
        .commands("insert")
        .into_iter()
        .filter(|c| c.get_str("insert").ok() == Some("events"))
        .collect();
    assert_eq!(inserts.len(), 3, "the driver retried the insert once");
    assert_eq!(
        inserts[1].get_array("documents").unwrap(),
        inserts[2].get_array("documents").unwrap(),
        "the retry sent the same documents"
    );
    assert_eq!(p.len(), 3);
    assert!(
        p[0] > first[0] && p[0] < p[1] && p[1] < p[2],
        "{first:?} {p:?}"
    );
    let next = c
        .append(
            vec![contract::doc(json!({"n": 4}))],
            Durability::Acknowledged,
        )
        .await
        .unwrap();
    assert!(
        next[0] > p[2],
        "positions continue after: {p:?} then {next:?}"
    );
    let mut tail = c.tail(Start::Oldest);
    let mut seen = Vec::new();
    while seen.len() < 5 {
        let r = tokio::time::timeout(contract::WAIT, futures::StreamExt::next(&mut tail))
            .await
            .expect("tail yields")
            .expect("tail does not end")
            .unwrap();
        seen.push((r.position, r.doc["n"].as_i64().unwrap()));
    }
    assert_eq!(
        seen,
        vec![(first[0], 0), (p[0], 1), (p[1], 2), (p[2], 3), (next[0], 4)],
        "each document once, in order, at the positions the appends returned"
    );
    drop(tail);
    tokio::time::timeout(contract::WAIT, store.close())
        .await
        .expect("close finishes")
        .unwrap();
}
