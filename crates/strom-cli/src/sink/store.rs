//! The PostgreSQL side of the sink: connecting, creating or checking the
//! target table and the offsets table, the per-(topic, consumer name) lock,
//! and writing one batch: a binary COPY of its rows plus the upsert of each
//! touched partition's next offset, in ONE transaction. That transaction is
//! what makes the sink exactly-once: rows and position commit together or
//! not at all.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::runtime::Runtime;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, NoTls};

use super::mapping::{check_ident, Cell, Column, ColumnType};

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a restarted sink waits for the lock its killed predecessor's
/// session may still hold until PostgreSQL notices the closed socket.
const LOCK_WAIT: Duration = Duration::from_secs(10);

/// The partition and offset columns every sink table has.
pub const PARTITION_COLUMN: &str = "strom_partition";
pub const OFFSET_COLUMN: &str = "strom_offset";

/// What the sink writes to and where it keeps its positions.
pub struct Layout {
    /// Quoted `"schema"."table"` or `"table"`.
    pub table: String,
    /// The table as the user named it, stored in the offsets table.
    pub table_label: String,
    pub offsets: String,
    pub columns: Vec<Column>,
    pub rest_column: String,
}

impl Layout {
    /// Validates the names; the offsets table lives in the target table's
    /// schema (or the search path when the table has none).
    pub fn new(
        table: &str,
        offsets: &str,
        columns: Vec<Column>,
        rest: &str,
    ) -> anyhow::Result<Layout> {
        let parts: Vec<&str> = table.split('.').collect();
        anyhow::ensure!(
            (1..=2).contains(&parts.len()),
            "--table takes TABLE or SCHEMA.TABLE, not '{table}'"
        );
        for p in &parts {
            check_ident(p, "table name part")?;
        }
        check_ident(offsets, "--offsets-table")?;
        check_ident(rest, "--rest-column")?;
        for reserved in [PARTITION_COLUMN, OFFSET_COLUMN, rest] {
            anyhow::ensure!(
                columns.iter().all(|c| c.name != reserved),
                "column '{reserved}' is the sink's own; map the field to another column name"
            );
        }
        anyhow::ensure!(
            rest != PARTITION_COLUMN && rest != OFFSET_COLUMN,
            "--rest-column may not be '{rest}'"
        );
        let quoted: Vec<String> = parts.iter().map(|p| format!("\"{p}\"")).collect();
        let offsets = match parts.len() {
            2 => format!("{}.\"{offsets}\"", quoted[0]),
            _ => format!("\"{offsets}\""),
        };
        Ok(Layout {
            table: quoted.join("."),
            table_label: table.to_string(),
            offsets,
            columns,
            rest_column: rest.to_string(),
        })
    }

    /// Every column the sink writes, in COPY order, with its type.
    fn all_columns(&self) -> Vec<(&str, ColumnType, bool)> {
        let mut v = vec![
            (PARTITION_COLUMN, ColumnType::Integer, false),
            (OFFSET_COLUMN, ColumnType::BigInt, false),
        ];
        v.extend(
            self.columns
                .iter()
                .map(|c| (c.name.as_str(), c.ty, c.optional)),
        );
        v.push((self.rest_column.as_str(), ColumnType::Jsonb, false));
        v
    }

    fn create_sql(&self) -> String {
        let cols: Vec<String> = self
            .all_columns()
            .iter()
            .map(|(n, t, opt)| {
                let null = if *opt { "" } else { " NOT NULL" };
                format!("\"{n}\" {}{null}", t.sql_name())
            })
            .collect();
        format!(
            "CREATE TABLE IF NOT EXISTS {} ({}, PRIMARY KEY (\"{PARTITION_COLUMN}\", \"{OFFSET_COLUMN}\"))",
            self.table,
            cols.join(", ")
        )
    }

    fn copy_sql(&self) -> String {
        let cols: Vec<String> = self
            .all_columns()
            .iter()
            .map(|(n, _, _)| format!("\"{n}\""))
            .collect();
        format!(
            "COPY {} ({}) FROM STDIN (FORMAT binary)",
            self.table,
            cols.join(", ")
        )
    }
}

/// One row: where the event came from, its mapped cells and the rest.
pub struct Row {
    pub partition: u32,
    pub offset: u64,
    pub cells: Vec<Cell>,
    pub rest: Cell,
}

/// A partition's position change in one batch: from `expected` (what the
/// offsets table holds now; `None` for no row) to `next`.
#[derive(Clone, Copy, Debug)]
pub struct Advance {
    pub expected: Option<u64>,
    pub next: u64,
}

/// Time spent in one batch's statements.
#[derive(Default, Clone, Copy)]
pub struct WriteTimes {
    pub copy: Duration,
    pub commit: Duration,
}

/// A connection to PostgreSQL, driven by its own single-threaded runtime.
pub struct Store {
    rt: Runtime,
    client: Client,
    layout: Layout,
    topic: String,
    name: String,
    types: Vec<Type>,
    copy_sql: String,
    upsert_sql: String,
}

impl Store {
    /// Connects, creates or checks both tables, and takes the lock on
    /// (topic, consumer name).
    pub fn open(dsn: &str, layout: Layout, topic: &str, name: &str) -> anyhow::Result<Store> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the PostgreSQL runtime")?;
        let client = rt.block_on(connect(dsn))?;
        let types = layout
            .all_columns()
            .iter()
            .map(|(_, t, _)| t.pg_type())
            .collect();
        let upsert_sql = format!(
            "INSERT INTO {o} AS o (topic, consumer_name, partition, next_offset, table_name) \
             VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (topic, consumer_name, partition) DO UPDATE \
             SET next_offset = EXCLUDED.next_offset, updated_at = now() \
             WHERE o.next_offset = $6",
            o = layout.offsets
        );
        let store = Store {
            rt,
            client,
            copy_sql: layout.copy_sql(),
            layout,
            topic: topic.into(),
            name: name.into(),
            types,
            upsert_sql,
        };
        store.rt.block_on(store.prepare())?;
        Ok(store)
    }

    async fn prepare(&self) -> anyhow::Result<()> {
        self.lock().await?;
        let offsets = format!(
            "CREATE TABLE IF NOT EXISTS {} (topic text NOT NULL, consumer_name text NOT NULL, \
             partition integer NOT NULL, next_offset bigint NOT NULL, table_name text NOT NULL, \
             updated_at timestamptz NOT NULL DEFAULT now(), \
             PRIMARY KEY (topic, consumer_name, partition))",
            self.layout.offsets
        );
        for sql in [offsets, self.layout.create_sql()] {
            self.client
                .batch_execute(&sql)
                .await
                .with_context(|| format!("creating a table: {sql}"))?;
        }
        self.check_table().await
    }

    /// Session lock on (topic, name), so two sinks never share a position.
    async fn lock(&self) -> anyhow::Result<()> {
        let key = format!("strom-sink/{}/{}", self.topic, self.name);
        let deadline = Instant::now() + LOCK_WAIT;
        loop {
            let row = self
                .client
                .query_one(
                    "SELECT pg_try_advisory_lock(hashtextextended($1, 0))",
                    &[&key],
                )
                .await
                .context("taking the sink's advisory lock")?;
            if row.get::<_, bool>(0) {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "another sink holds topic '{}' as consumer '{}' in this database \
                 (advisory lock on '{key}'); stop it first",
                self.topic,
                self.name
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Refuses a table whose columns do not fit: each sink column must be
    /// there with its type, and any other column must accept NULL or
    /// have a default.
    async fn check_table(&self) -> anyhow::Result<()> {
        let rows = self
            .client
            .query(
                "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), \
                 a.attnotnull AND NOT a.atthasdef \
                 FROM pg_attribute a WHERE a.attrelid = to_regclass($1) \
                 AND a.attnum > 0 AND NOT a.attisdropped",
                &[&self.layout.table],
            )
            .await
            .context("reading the table's columns")?;
        let have: BTreeMap<String, (String, bool)> = rows
            .iter()
            .map(|r| (r.get(0), (r.get(1), r.get(2))))
            .collect();
        let t = &self.layout.table_label;
        let mut problems = Vec::new();
        let want = self.layout.all_columns();
        for (name, ty, _) in &want {
            match have.get(*name) {
                None => problems.push(format!("column {name} is missing")),
                Some((got, _)) if got != ty.sql_name() => problems.push(format!(
                    "column {name} is {got}, the sink writes {}",
                    ty.sql_name()
                )),
                Some(_) => {}
            }
        }
        for (name, (_, required)) in &have {
            if *required && want.iter().all(|(n, _, _)| n != name) {
                problems.push(format!(
                    "column {name} is NOT NULL without a default and the sink does not fill it"
                ));
            }
        }
        anyhow::ensure!(
            problems.is_empty(),
            "table {t} exists but does not match the sink's columns: {}; \
             drop it, or choose another --table",
            problems.join("; ")
        );
        Ok(())
    }

    /// The stored next offset of each partition (PostgreSQL's word is final).
    pub fn load_offsets(&self) -> anyhow::Result<BTreeMap<u32, u64>> {
        let sql = format!(
            "SELECT partition, next_offset, table_name FROM {} \
             WHERE topic = $1 AND consumer_name = $2",
            self.layout.offsets
        );
        let rows = self
            .rt
            .block_on(self.client.query(&sql, &[&self.topic, &self.name]))
            .context("reading the sink's offsets")?;
        let mut out = BTreeMap::new();
        for r in rows {
            let (p, next, table): (i32, i64, String) = (r.get(0), r.get(1), r.get(2));
            anyhow::ensure!(
                table == self.layout.table_label,
                "consumer '{}' already sinks topic '{}' into table {table}, not {}; \
                 use another --name",
                self.name,
                self.topic,
                self.layout.table_label
            );
            anyhow::ensure!(
                p >= 0 && next >= 0,
                "bad row in {}: partition {p}",
                self.layout.offsets
            );
            out.insert(p as u32, next as u64);
        }
        Ok(out)
    }

    /// Writes `rows` and moves the positions in one transaction.
    pub fn write(
        &mut self,
        rows: &[Row],
        advances: &BTreeMap<u32, Advance>,
    ) -> anyhow::Result<WriteTimes> {
        let Store {
            rt,
            client,
            types,
            copy_sql,
            upsert_sql,
            layout,
            topic,
            name,
            ..
        } = self;
        rt.block_on(async {
            let started = Instant::now();
            let tx = client.transaction().await.context("BEGIN")?;
            if !rows.is_empty() {
                let sink = tx.copy_in(copy_sql.as_str()).await.context("COPY")?;
                let w = BinaryCopyInWriter::new(sink, types);
                let mut w = std::pin::pin!(w);
                for row in rows {
                    let part = Cell::I32(row.partition as i32);
                    let off = Cell::I64(row.offset as i64);
                    let mut vals: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(types.len());
                    vals.push(&part);
                    vals.push(&off);
                    vals.extend(row.cells.iter().map(|c| c as &(dyn ToSql + Sync)));
                    vals.push(&row.rest);
                    w.as_mut().write(&vals).await.context("COPY row")?;
                }
                w.finish().await.context("COPY")?;
            }
            for (p, a) in advances {
                let expected = a.expected.map(|e| e as i64);
                let n = tx
                    .execute(
                        upsert_sql.as_str(),
                        &[
                            &*topic,
                            &*name,
                            &(*p as i32),
                            &(a.next as i64),
                            &layout.table_label,
                            &expected,
                        ],
                    )
                    .await
                    .context("storing the offsets")?;
                anyhow::ensure!(
                    n == 1,
                    "partition {p}'s stored offset is no longer {expected:?}: \
                     another writer moved it; stopping without committing"
                );
            }
            let copied = Instant::now();
            tx.commit().await.context("COMMIT")?;
            Ok(WriteTimes {
                copy: copied - started,
                commit: copied.elapsed(),
            })
        })
    }
}

async fn connect(dsn: &str) -> anyhow::Result<Client> {
    let config: tokio_postgres::Config =
        dsn.parse().map_err(|e| anyhow::anyhow!("bad --dsn: {e}"))?;
    let (client, conn) = tokio::time::timeout(CONNECT_TIMEOUT, config.connect(NoTls))
        .await
        .map_err(|_| {
            anyhow::anyhow!("connecting to PostgreSQL timed out after {CONNECT_TIMEOUT:?}")
        })?
        .context("connecting to PostgreSQL")?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::error!(error = %e, "PostgreSQL connection failed");
        }
    });
    Ok(client)
}
