//! The hot statements' generic plans read a batch's rows by key: a hot connection plans each
//! statement once and keeps the plan (`snapfence::store::HOT_SETTINGS`) until it plans again as
//! it ages, so a plan made on a new database must not scan a table, and one made while a table
//! was small must not outlive its growth for long. Checked on the generic plans themselves, as
//! PostgreSQL makes them, rather than by timing anything.

use deadpool::managed::{Manager, Metrics};
use serde_json::Value;
use snapfence::store::{Connector, Db, DbSettings, HotConn, REPLAN_AFTER, Warmed};
use sqlx::{Connection, PgConnection};

use crate::harness::{TestApp, token};

/// The scans in `plan` (PostgreSQL's JSON plan) that read a table other than by key: a
/// sequential scan of it, or an index scan with no condition (a walk of the whole index).
fn scans_not_by_key(plan: &Value, found: &mut Vec<String>) {
    let node = plan["Node Type"].as_str().unwrap_or("");
    if let Some(table) = plan["Relation Name"].as_str() {
        let by_key = match node {
            "Seq Scan" => false,
            "Index Scan" | "Index Only Scan" => plan.get("Index Cond").is_some(),
            _ => true,
        };
        // The upload table holds one row, the body of the statement's own request.
        if !by_key && table != "snapfence_upload" {
            found.push(format!("{node} on {table}"));
        }
    }
    for child in plan["Plans"].as_array().into_iter().flatten() {
        scans_not_by_key(child, found);
    }
}

/// The generic plan of prepared statement `name` (all its parameters NULL) on `conn`.
async fn generic_plan(conn: &mut PgConnection, name: &str) -> Value {
    let params: i32 = sqlx::query_scalar(
        "SELECT cardinality(parameter_types) FROM pg_prepared_statements WHERE name = $1",
    )
    .bind(name)
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    let nulls = vec!["NULL"; usize::try_from(params).unwrap()].join(", ");
    let (plan,): (Value,) =
        sqlx::query_as(&format!("EXPLAIN (FORMAT JSON) EXECUTE {name}({nulls})"))
            .fetch_one(&mut *conn)
            .await
            .unwrap();
    plan[0]["Plan"].clone()
}

/// Plans each of `statements` generically on a new, empty database, on a connection with the
/// hot connections' settings (a generic plan, as any connection keeps one once it looks no
/// dearer than planning), and asserts that none reads a table other than by key.
async fn assert_planned_on_empty_tables_by_key<'a>(
    statements: impl IntoIterator<Item = (&'a str, &'a str)>,
) {
    let app = TestApp::spawn().await;
    let options = app.options.clone().options(snapfence::store::HOT_SETTINGS);
    let mut conn = PgConnection::connect_with(&options).await.unwrap();
    sqlx::raw_sql("CREATE TEMP TABLE snapfence_upload (body bytea NOT NULL)")
        .execute(&mut conn)
        .await
        .unwrap();
    let mut found = Vec::new();
    for (name, statement) in statements {
        sqlx::raw_sql(&format!("PREPARE planned AS {statement}"))
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut scans = Vec::new();
        scans_not_by_key(&generic_plan(&mut conn, "planned").await, &mut scans);
        found.extend(scans.into_iter().map(|s| format!("{name}: {s}")));
        sqlx::raw_sql("DEALLOCATE planned")
            .execute(&mut conn)
            .await
            .unwrap();
    }
    assert!(found.is_empty(), "{found:#?}");
    conn.close().await.unwrap();
    app.stop().await;
}

#[tokio::test]
async fn hot_statements_planned_on_empty_tables_read_rows_by_key_only() {
    assert_planned_on_empty_tables_by_key(snapfence::store::hot_statements()).await;
}

/// Connections warmed as an instance starts hold every hot statement's generic plan before their
/// first request (PostgreSQL's own `generic_plans` counters say so), and wait in the pool.
#[tokio::test]
async fn warmed_hot_connections_hold_every_hot_statements_plan_before_any_request() {
    let app = TestApp::spawn().await;
    let settings = DbSettings {
        pool_size: 4,
        ..DbSettings::default()
    };
    let db = Db::new(snapfence::store::pool(app.options.clone(), &settings));
    let warmed = db.warm(3).await.unwrap();
    // All but the large bodies' put (both forms), which reads a table its own transaction makes.
    let planned = snapfence::store::hot_statements().len() - 2;
    assert_eq!(
        warmed,
        Warmed {
            connections: 3,
            plans: 3 * planned
        }
    );
    let pool = db.hot_status();
    assert_eq!((pool.open, pool.idle), (3, 3));
    app.stop().await;
}

/// A hot connection keeps a plan made for small tables only for a while: a table that has grown
/// since is read by key once the connection has planned again, as it does when its plans are as
/// old as it was when it made them.
#[tokio::test]
async fn a_hot_connection_plans_again_for_a_table_that_has_grown() {
    let app = TestApp::spawn().await;
    for n in 0..5 {
        let key = format!("plans/{n}");
        let token = token(&app.acquire(&key, "planner", 60_000).await);
        assert!(app.put(&key, token, "v").await.status().is_success());
    }
    let mut other = PgConnection::connect_with(&app.options).await.unwrap();
    // Only this test's growth changes the statistics' view, not autovacuum's timing.
    sqlx::raw_sql("ALTER TABLE snapshot_versions SET (autovacuum_enabled = false); ANALYZE")
        .execute(&mut other)
        .await
        .unwrap();
    let connector = Connector::new(app.options.clone().options(snapfence::store::HOT_SETTINGS));
    let metrics = Metrics::default();
    let mut hot = connector.create().await.unwrap();
    let put = snapfence::store::hot_statements()
        .into_iter()
        .find(|(name, _)| *name == "put")
        .unwrap()
        .1;
    sqlx::raw_sql(&format!("PREPARE put AS {put}"))
        .execute(&mut *hot)
        .await
        .unwrap();
    let versions_read_whole = async |hot: &mut HotConn| {
        let mut scans = Vec::new();
        scans_not_by_key(&generic_plan(hot, "put").await, &mut scans);
        scans.contains(&"Seq Scan on snapshot_versions".to_owned())
    };
    assert!(
        versions_read_whole(&mut hot).await,
        "five versions are read whole, as they should be"
    );
    sqlx::raw_sql(
        "INSERT INTO snapshot_versions (key, version, token, etag, size, content_type, updated_at, body) \
         SELECT 'grown/' || n, 1, 1, 'e', 1, 'text/plain', now(), 'x' FROM generate_series(1, 20000) n",
    )
    .execute(&mut other)
    .await
    .unwrap();
    assert!(
        versions_read_whole(&mut hot).await,
        "the plan is kept until it is due"
    );
    tokio::time::sleep(REPLAN_AFTER).await;
    connector.recycle(&mut hot, &metrics).await.unwrap();
    assert!(
        !versions_read_whole(&mut hot).await,
        "20,000 versions are read by key"
    );
    app.stop().await;
}

/// The relay reports a few hundred expiries at a time under load; a plan that read all of
/// `expiry_reports` (a row per key ever expired) for each report made every report cost what
/// the table weighs.
#[tokio::test]
async fn the_relays_statements_over_leases_planned_on_empty_tables_read_them_by_key_only() {
    assert_planned_on_empty_tables_by_key(snapfence::store::watch::relay_statements()).await;
}

/// The relay turns every few milliseconds under load, on an ordinary connection, which plans a
/// statement at every call for as long as its generic plan looks dearer than planning: the
/// turn's did, and planning it took about as long as running it.
#[tokio::test]
async fn a_connection_that_relays_plans_the_turn_once_not_at_every_turn() {
    let app = TestApp::spawn().await;
    let mut conn = PgConnection::connect_with(&app.options).await.unwrap();
    // This connection takes the role over, as another instance would once the app's lapsed.
    sqlx::raw_sql(&format!(
        "UPDATE change_relay SET holder = 'plans', expires_at = now() + interval '1 hour'; \
         PREPARE turn(text, boolean, bigint) AS {}",
        snapfence::store::watch::relay_turn()
    ))
    .execute(&mut conn)
    .await
    .unwrap();
    let epochs = "SELECT count(*) FROM change_epochs";
    let before: i64 = sqlx::query_scalar(epochs)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    for _ in 0..10 {
        // A change committed before each turn, so that each makes an epoch, as under load.
        sqlx::raw_sql(
            "INSERT INTO change_log (kind, key, token, at) VALUES ('lease.granted', 'k', 1, now())",
        )
        .execute(&mut conn)
        .await
        .unwrap();
        sqlx::raw_sql("EXECUTE turn('plans', true, 3600000)")
            .execute(&mut conn)
            .await
            .unwrap();
    }
    let after: i64 = sqlx::query_scalar(epochs)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(after - before, 10, "each turn made an epoch");
    let (generic, custom): (i64, i64) = sqlx::query_as(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = 'turn'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        (generic, custom),
        (5, 5),
        "planned once for the connection's later turns"
    );
    conn.close().await.unwrap();
    app.stop().await;
}

/// Every read of the change feed goes through `epoch_changes()`, whose body a connection plans
/// on its first call and keeps. Checked on that body as the database has it, with the
/// function's own settings, planned generically on a table of a few rows.
#[tokio::test]
async fn the_change_feed_reads_an_epoch_by_index_whatever_the_statistics() {
    let app = TestApp::spawn().await;
    let mut conn = PgConnection::connect_with(&app.options).await.unwrap();
    // A few changes, analysed: the statistics of an instance's first seconds, from which the
    // planner finds a scan of the whole table cheaper than its index.
    sqlx::raw_sql(
        "INSERT INTO change_log (kind, key, token, at) \
         SELECT 'lease.granted', 'k' || i, i, now() FROM generate_series(1, 40) i; \
         ANALYZE change_log",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let (body, settings): (String, Option<Vec<String>>) =
        sqlx::query_as("SELECT prosrc, proconfig FROM pg_proc WHERE proname = 'epoch_changes'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    for setting in settings.unwrap_or_default() {
        let (name, value) = setting.split_once('=').unwrap();
        sqlx::raw_sql(&format!("SET {name} = {value}"))
            .execute(&mut conn)
            .await
            .unwrap();
    }
    // The PL/pgSQL body's one query (migrations/20261210000000_epoch_changes_planned_once.sql).
    let query = body
        .split_once("RETURN QUERY")
        .and_then(|(_, rest)| rest.rsplit_once(';'))
        .map(|(query, _)| query)
        .expect("the body is one RETURN QUERY");
    let body = query
        .replace("after_snap", "$1")
        .replace("(snap)", "($2)")
        .replace(", snap)", ", $2)");
    sqlx::raw_sql(&format!(
        "SET plan_cache_mode = force_generic_plan; PREPARE feed(pg_snapshot, pg_snapshot) AS {body}"
    ))
    .execute(&mut conn)
    .await
    .unwrap();
    let (plan,): (Value,) = sqlx::query_as("EXPLAIN (FORMAT JSON) EXECUTE feed(NULL, NULL)")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let mut scans = Vec::new();
    scans_not_by_key(&plan[0]["Plan"], &mut scans);
    assert!(scans.is_empty(), "{scans:#?}\n{plan:#}");
    conn.close().await.unwrap();
    app.stop().await;
}

/// An audit page is sent unprepared, so PostgreSQL plans it with its values: the filters not given
/// drop out, and a page of one key (or one reason) reads that index, not the whole log.
#[tokio::test]
async fn an_audit_page_reads_the_index_of_the_filter_it_was_given() {
    let app = TestApp::spawn().await;
    let mut conn = PgConnection::connect_with(&app.options).await.unwrap();
    sqlx::raw_sql(
        "INSERT INTO rejections (key, reason, presented_token, operation) \
             SELECT 'k' || (n % 500), 'stale_token', 1, 'put' FROM generate_series(1, 20000) n; \
         INSERT INTO rejections (key, reason, presented_token, operation) \
             VALUES ('k1', 'unknown_token', 1, 'put'); \
         ANALYZE rejections",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let page = snapfence::store::audit::Log::Rejections.page();
    for (key, reason, index) in [
        (Some("k7"), None, "rejections_key_id"),
        (None, Some("unknown_token"), "rejections_reason_id"),
    ] {
        let (plan,): (Value,) = sqlx::query_as(&format!("EXPLAIN (FORMAT JSON) {page}"))
            .persistent(false)
            .bind(key)
            .bind(reason)
            .bind(None::<chrono::DateTime<chrono::Utc>>)
            .bind(None::<chrono::DateTime<chrono::Utc>>)
            .bind(None::<i64>)
            .bind(51_i64)
            .fetch_one(&mut conn)
            .await
            .unwrap();
        let mut indexes = Vec::new();
        index_names(&plan[0]["Plan"], &mut indexes);
        assert_eq!(indexes, [index], "{plan:#}");
    }
    conn.close().await.unwrap();
    app.stop().await;
}

/// `f` on every node of a plan, the plan's own first.
fn each_node(plan: &Value, f: &mut impl FnMut(&Value)) {
    f(plan);
    for child in plan["Plans"].as_array().into_iter().flatten() {
        each_node(child, f);
    }
}

/// The indexes a plan reads.
fn index_names(plan: &Value, found: &mut Vec<String>) {
    each_node(plan, &mut |node| {
        found.extend(node["Index Name"].as_str().map(str::to_owned));
    });
}

/// Every node of a plan, by type.
fn node_types(plan: &Value, found: &mut Vec<String>) {
    each_node(plan, &mut |node| {
        if let Some(t) = node["Node Type"].as_str() {
            let on = node["Relation Name"].as_str().unwrap_or("");
            found.push(format!("{t} {on}").trim().to_owned());
        }
    });
}

/// The ordered listing (v1.3) reads the heads' key index forwards or backwards from
/// `start_after`: no sort, whichever order, over a few thousand analysed keys.
#[tokio::test]
async fn the_ordered_listing_walks_the_key_index_without_a_sort() {
    let app = TestApp::spawn().await;
    let options = app.options.clone().options(snapfence::store::HOT_SETTINGS);
    let mut conn = PgConnection::connect_with(&options).await.unwrap();
    sqlx::raw_sql(
        "INSERT INTO snapshot_heads (key, version, etag, written_token) \
             SELECT 't/' || lpad(n::text, 5, '0'), 1, 'e', 1 FROM generate_series(1, 5000) n; \
         INSERT INTO snapshot_versions (key, version, token, etag, size, content_type, \
             updated_at, body) \
             SELECT key, 1, 1, 'e', 1, 'x', now(), '\\x00' FROM snapshot_heads; \
         ANALYZE snapshot_heads; ANALYZE snapshot_versions;",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let statement = snapfence::store::snapshots::list::STATEMENT;
    sqlx::raw_sql(&format!("PREPARE listing AS {statement}"))
        .execute(&mut conn)
        .await
        .unwrap();
    for order in ["asc", "desc"] {
        let (plan,): (Value,) = sqlx::query_as(&format!(
            "EXPLAIN (FORMAT JSON) EXECUTE listing('t/', 't0', 't/02500', 101, '{order}')"
        ))
        .fetch_one(&mut conn)
        .await
        .unwrap();
        let mut nodes = Vec::new();
        node_types(&plan[0]["Plan"], &mut nodes);
        assert!(
            !nodes.iter().any(|n| n.starts_with("Sort")),
            "{order}: {nodes:?}"
        );
        assert!(
            nodes.iter().any(|n| n == "Index Scan snapshot_heads"),
            "{order}: {nodes:?}"
        );
        let mut scans = Vec::new();
        scans_not_by_key(&plan[0]["Plan"], &mut scans);
        assert!(scans.is_empty(), "{order}: {scans:?}");
    }
    conn.close().await.unwrap();
    app.stop().await;
}

/// A batch of one request runs its statement's lone form (src/store/engine/statement.rs): its
/// `req` is one row the planner knows as one, so the generic plan joins by nested loops and sets
/// up no hash table at every execution, as the batch form's plan does.
#[tokio::test]
async fn a_lone_statements_generic_plan_builds_no_hash_table() {
    let app = TestApp::spawn().await;
    let options = app.options.clone().options(snapfence::store::HOT_SETTINGS);
    let mut conn = PgConnection::connect_with(&options).await.unwrap();
    sqlx::raw_sql("CREATE TEMP TABLE snapfence_upload (body bytea NOT NULL)")
        .execute(&mut conn)
        .await
        .unwrap();
    let mut hashed = Vec::new();
    let mut batch_hashes = 0;
    for (name, statement) in snapfence::store::hot_statements() {
        sqlx::raw_sql(&format!("PREPARE planned AS {statement}"))
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut nodes = Vec::new();
        node_types(&generic_plan(&mut conn, "planned").await, &mut nodes);
        let hashes = nodes.iter().filter(|n| n.starts_with("Hash")).count();
        // A transaction's prefix deletes match as many keys as the data holds, lone or not.
        if name.starts_with("lone/") && name != "lone/txn" && hashes > 0 {
            hashed.push(format!("{name}: {nodes:?}"));
        } else if name == "put" {
            batch_hashes = hashes;
        }
        sqlx::raw_sql("DEALLOCATE planned")
            .execute(&mut conn)
            .await
            .unwrap();
    }
    assert!(hashed.is_empty(), "{hashed:#?}");
    // The control: the batch form of the put joins by hash.
    assert!(batch_hashes > 0);
    conn.close().await.unwrap();
    app.stop().await;
}
