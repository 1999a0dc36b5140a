//! The hot statements' generic plans read a batch's rows by key, whatever the statistics said
//! when the plans were made: a hot connection plans each statement once and keeps the plan for
//! its life (`snapfence::store::HOT_SETTINGS`), so a plan made while a table was empty (a new
//! database, a new connection before autovacuum looked) must not scan that table once it has
//! grown. Checked on the generic plans themselves, as PostgreSQL makes them on an empty
//! database, rather than by timing anything.

use serde_json::Value;
use sqlx::{Connection, PgConnection};

use crate::harness::TestApp;

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

#[tokio::test]
async fn hot_statements_planned_on_empty_tables_read_rows_by_key_only() {
    let app = TestApp::spawn().await;
    let options = app.options.clone().options(snapfence::store::HOT_SETTINGS);
    let mut conn = PgConnection::connect_with(&options).await.unwrap();
    sqlx::raw_sql("CREATE TEMP TABLE snapfence_upload (body bytea NOT NULL)")
        .execute(&mut conn)
        .await
        .unwrap();
    let mut found = Vec::new();
    for (name, statement) in snapfence::store::hot_statements() {
        sqlx::raw_sql(&format!("PREPARE hot AS {statement}"))
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let params: i32 = sqlx::query_scalar(
            "SELECT cardinality(parameter_types) FROM pg_prepared_statements WHERE name = 'hot'",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap();
        let nulls = vec!["NULL"; usize::try_from(params).unwrap()].join(", ");
        let (plan,): (Value,) =
            sqlx::query_as(&format!("EXPLAIN (FORMAT JSON) EXECUTE hot({nulls})"))
                .fetch_one(&mut conn)
                .await
                .unwrap();
        let mut scans = Vec::new();
        scans_not_by_key(&plan[0]["Plan"], &mut scans);
        found.extend(scans.into_iter().map(|s| format!("{name}: {s}")));
        sqlx::raw_sql("DEALLOCATE hot")
            .execute(&mut conn)
            .await
            .unwrap();
    }
    assert!(found.is_empty(), "{found:#?}");
    conn.close().await.unwrap();
    app.stop().await;
}

/// The change feed's relay and readers run on ordinary connections, so their statements are
/// replanned as the tables grow, except what a connection keeps: the plan of
/// `epoch_changes()`' body, made on its first call. Checked on that body as the database has it,
/// with the function's own settings, planned generically on a table of a few rows.
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
    let body = body
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
