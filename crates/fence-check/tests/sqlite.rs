//! The SQL recipe (docs/fence-check.md): the token check is part of the write statement, in the
//! same transaction as the data change, so no check-then-write race exists.

use rusqlite::{params, Connection};

fn setup() -> Connection {
    let db = Connection::open_in_memory().expect("sqlite");
    db.execute_batch(
        "CREATE TABLE fences (resource TEXT PRIMARY KEY, token INTEGER NOT NULL);
         CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL);
         INSERT INTO accounts VALUES ('alice', 100);",
    )
    .expect("schema");
    db
}

/// Recipe 1: advance the fence row only if the token is not older; write in the same
/// transaction only if the fence accepted it.
fn fenced_update(db: &mut Connection, token: i64, balance: i64) -> Result<(), String> {
    let tx = db.transaction().map_err(|e| e.to_string())?;
    let accepted = tx
        .execute(
            "INSERT INTO fences (resource, token) VALUES ('accounts/alice', ?1)
             ON CONFLICT (resource) DO UPDATE SET token = excluded.token
             WHERE excluded.token >= fences.token",
            params![token],
        )
        .map_err(|e| e.to_string())?;
    if accepted == 0 {
        let highest: i64 = tx
            .query_row(
                "SELECT token FROM fences WHERE resource = 'accounts/alice'",
                [],
                |r| r.get(0),
            )
            .map_err(|e| e.to_string())?;
        return Err(format!("stale token {token}, highest {highest}"));
    }
    tx.execute(
        "UPDATE accounts SET balance = ?1 WHERE id = 'alice'",
        params![balance],
    )
    .map_err(|e| e.to_string())?;
    tx.commit().map_err(|e| e.to_string())
}

/// Recipe 2: the token is a column of the row; one conditional UPDATE.
fn fenced_row_update(db: &Connection, token: i64, value: &str) -> Result<bool, String> {
    let n = db
        .execute(
            "UPDATE docs SET body = ?1, fence = ?2 WHERE id = 'd1' AND fence <= ?2",
            params![value, token],
        )
        .map_err(|e| e.to_string())?;
    Ok(n == 1)
}

fn balance(db: &Connection) -> i64 {
    db.query_row("SELECT balance FROM accounts WHERE id = 'alice'", [], |r| {
        r.get(0)
    })
    .expect("balance")
}

#[test]
fn kleppmann_scenario_against_sqlite_fence_table() {
    let mut db = setup();
    // A holds token 33, pauses; B gets 34 and writes; A wakes and writes with 33.
    fenced_update(&mut db, 34, 150).expect("B writes");
    let err = fenced_update(&mut db, 33, 90).expect_err("A's stale write must be refused");
    assert!(err.contains("stale token 33, highest 34"), "{err}");
    assert_eq!(balance(&db), 150, "B's data survives");
    fenced_update(&mut db, 35, 160).expect("a newer holder writes");
    assert_eq!(balance(&db), 160);
}

#[test]
fn row_level_fence_column() {
    let db = setup();
    db.execute_batch(
        "CREATE TABLE docs (id TEXT PRIMARY KEY, body TEXT, fence INTEGER NOT NULL DEFAULT 0);
         INSERT INTO docs (id, body) VALUES ('d1', '');",
    )
    .expect("docs");
    assert!(fenced_row_update(&db, 34, "from B").expect("B"));
    assert!(!fenced_row_update(&db, 33, "from A").expect("A"));
    let body: String = db
        .query_row("SELECT body FROM docs WHERE id = 'd1'", [], |r| r.get(0))
        .expect("body");
    assert_eq!(body, "from B");
}
