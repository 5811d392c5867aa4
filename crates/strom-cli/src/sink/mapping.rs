//! How event metadata becomes a table row: the `--columns` spec, the
//! column types the sink supports, and the conversion of one JSON object
//! into typed cells (the mapped columns, then a JSONB cell holding every
//! field no column took). Pure: no I/O, no PostgreSQL connection.
//!
//! Spec syntax, comma separated: `COLUMN[=FIELD]:TYPE[?]`.
//! - `COLUMN`: the table column (letters, digits, `_`; not starting with a digit).
//! - `FIELD`: the metadata field; defaults to `COLUMN`. A field starting
//!   with `/` is a JSON pointer into nested objects (`x=/pos/x:double`).
//! - `TYPE`: one of [`ColumnType`]'s names.
//! - `?`: the field may be missing or `null` (the cell is then NULL);
//!   without it, a missing field makes the event bad.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::BytesMut;
use serde_json::{Map, Value};
use tokio_postgres::types::{to_sql_checked, IsNull, ToSql, Type};

/// A PostgreSQL column type the sink can fill from JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnType {
    Text,
    BigInt,
    Integer,
    Double,
    Boolean,
    Uuid,
    /// From a number (seconds since the Unix epoch) or an RFC 3339 string.
    Timestamptz,
    Jsonb,
}

impl ColumnType {
    fn parse(s: &str) -> Option<ColumnType> {
        Some(match s.to_ascii_lowercase().as_str() {
            "text" => ColumnType::Text,
            "bigint" | "int8" => ColumnType::BigInt,
            "integer" | "int" | "int4" => ColumnType::Integer,
            "double" | "float8" | "double precision" => ColumnType::Double,
            "boolean" | "bool" => ColumnType::Boolean,
            "uuid" => ColumnType::Uuid,
            "timestamptz" => ColumnType::Timestamptz,
            "jsonb" => ColumnType::Jsonb,
            _ => return None,
        })
    }

    /// The name PostgreSQL's `format_type` gives this type.
    pub fn sql_name(self) -> &'static str {
        match self {
            ColumnType::Text => "text",
            ColumnType::BigInt => "bigint",
            ColumnType::Integer => "integer",
            ColumnType::Double => "double precision",
            ColumnType::Boolean => "boolean",
            ColumnType::Uuid => "uuid",
            ColumnType::Timestamptz => "timestamp with time zone",
            ColumnType::Jsonb => "jsonb",
        }
    }

    /// The wire type for binary COPY.
    pub fn pg_type(self) -> Type {
        match self {
            ColumnType::Text => Type::TEXT,
            ColumnType::BigInt => Type::INT8,
            ColumnType::Integer => Type::INT4,
            ColumnType::Double => Type::FLOAT8,
            ColumnType::Boolean => Type::BOOL,
            ColumnType::Uuid => Type::UUID,
            ColumnType::Timestamptz => Type::TIMESTAMPTZ,
            ColumnType::Jsonb => Type::JSONB,
        }
    }
}

const TYPE_NAMES: &str = "text, bigint, integer, double, boolean, uuid, timestamptz, jsonb";

/// One mapped column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    /// A top-level key, or a JSON pointer when it starts with `/`.
    pub field: String,
    pub ty: ColumnType,
    pub optional: bool,
}

/// Checks a PostgreSQL identifier the sink creates or names: plain, so it
/// needs no case games, and short enough not to be truncated.
pub fn check_ident(s: &str, what: &str) -> anyhow::Result<()> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    anyhow::ensure!(
        ok,
        "{what} '{s}' is not a plain identifier (letters, digits and _, at most 63, not starting with a digit)"
    );
    Ok(())
}

/// Parses the `--columns` spec.
pub fn parse_columns(spec: &str) -> anyhow::Result<Vec<Column>> {
    let mut out: Vec<Column> = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let col = parse_column(item)?;
        anyhow::ensure!(
            out.iter().all(|c| c.name != col.name),
            "column '{}' appears twice in --columns",
            col.name
        );
        out.push(col);
    }
    Ok(out)
}

fn parse_column(item: &str) -> anyhow::Result<Column> {
    let (lhs, ty) = item.rsplit_once(':').ok_or_else(|| {
        anyhow::anyhow!("column spec '{item}' lacks a type: write COLUMN[=FIELD]:TYPE[?]")
    })?;
    let (ty, optional) = match ty.strip_suffix('?') {
        Some(t) => (t, true),
        None => (ty, false),
    };
    let ty = ColumnType::parse(ty.trim()).ok_or_else(|| {
        anyhow::anyhow!("column spec '{item}': unknown type '{ty}' (known: {TYPE_NAMES})")
    })?;
    let (name, field) = match lhs.split_once('=') {
        Some((n, f)) => (n.trim(), f.trim()),
        None => (lhs.trim(), lhs.trim()),
    };
    check_ident(name, "column")?;
    anyhow::ensure!(!field.is_empty(), "column spec '{item}': empty field name");
    Ok(Column {
        name: name.into(),
        field: field.into(),
        ty,
        optional,
    })
}

/// A typed cell of a row, written with binary COPY.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Null,
    Text(String),
    I64(i64),
    I32(i32),
    F64(f64),
    Bool(bool),
    Uuid(uuid::Uuid),
    Time(SystemTime),
    Json(Value),
}

impl ToSql for Cell {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Cell::Null => Ok(IsNull::Yes),
            Cell::Text(v) => v.to_sql(ty, out),
            Cell::I64(v) => v.to_sql(ty, out),
            Cell::I32(v) => v.to_sql(ty, out),
            Cell::F64(v) => v.to_sql(ty, out),
            Cell::Bool(v) => v.to_sql(ty, out),
            Cell::Uuid(v) => v.to_sql(ty, out),
            Cell::Time(v) => v.to_sql(ty, out),
            Cell::Json(v) => v.to_sql(ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        // Each variant is built for its column's type (see `convert`).
        true
    }

    to_sql_checked!();
}

/// Why an event cannot become a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadEvent {
    NotJson(String),
    NotObject,
    Missing { field: String },
    WrongType { field: String, want: ColumnType },
}

impl fmt::Display for BadEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadEvent::NotJson(e) => write!(f, "metadata is not JSON ({e})"),
            BadEvent::NotObject => write!(f, "metadata is not a JSON object"),
            BadEvent::Missing { field } => write!(f, "metadata lacks field '{field}'"),
            BadEvent::WrongType { field, want } => {
                write!(
                    f,
                    "field '{field}' does not fit a {} column",
                    want.sql_name()
                )
            }
        }
    }
}

/// Builds the mapped cells and the rest (a JSONB cell) of one event's
/// metadata; `columns` order.
pub fn to_cells(columns: &[Column], meta: Value) -> Result<(Vec<Cell>, Cell), BadEvent> {
    let Value::Object(mut obj) = meta else {
        return Err(BadEvent::NotObject);
    };
    let mut cells = Vec::with_capacity(columns.len());
    for c in columns {
        let v = take_field(&mut obj, &c.field);
        let cell = match v {
            None | Some(Value::Null) if c.optional => Cell::Null,
            None => {
                return Err(BadEvent::Missing {
                    field: c.field.clone(),
                })
            }
            Some(v) => convert(v, c.ty).ok_or_else(|| BadEvent::WrongType {
                field: c.field.clone(),
                want: c.ty,
            })?,
        };
        cells.push(cell);
    }
    Ok((cells, Cell::Json(Value::Object(obj))))
}

/// Removes and returns the field (a key, or a JSON pointer).
fn take_field(obj: &mut Map<String, Value>, field: &str) -> Option<Value> {
    if !field.starts_with('/') {
        return obj.remove(field);
    }
    let (parent, last) = field.rsplit_once('/')?;
    let unescape = |s: &str| s.replace("~1", "/").replace("~0", "~");
    let mut cur = obj;
    for key in parent.split('/').skip(1) {
        cur = cur.get_mut(&unescape(key))?.as_object_mut()?;
    }
    cur.remove(&unescape(last))
}

fn convert(v: Value, ty: ColumnType) -> Option<Cell> {
    Some(match (ty, v) {
        (ColumnType::Jsonb, v) => Cell::Json(v),
        (ColumnType::Text, Value::String(s)) => Cell::Text(s),
        (ColumnType::Text, v @ (Value::Number(_) | Value::Bool(_))) => Cell::Text(v.to_string()),
        (ColumnType::BigInt, Value::Number(n)) => Cell::I64(n.as_i64()?),
        (ColumnType::Integer, Value::Number(n)) => Cell::I32(n.as_i64()?.try_into().ok()?),
        (ColumnType::Double, Value::Number(n)) => Cell::F64(n.as_f64()?),
        (ColumnType::Boolean, Value::Bool(b)) => Cell::Bool(b),
        (ColumnType::Uuid, Value::String(s)) => Cell::Uuid(uuid::Uuid::parse_str(&s).ok()?),
        (ColumnType::Timestamptz, Value::Number(n)) => Cell::Time(from_epoch_secs(n.as_f64()?)?),
        (ColumnType::Timestamptz, Value::String(s)) => Cell::Time(parse_rfc3339(&s)?),
        _ => return None,
    })
}

fn from_epoch_secs(s: f64) -> Option<SystemTime> {
    if !s.is_finite() || s.abs() > 1e11 {
        return None;
    }
    let d = Duration::from_secs_f64(s.abs());
    if s >= 0.0 {
        UNIX_EPOCH.checked_add(d)
    } else {
        UNIX_EPOCH.checked_sub(d)
    }
}

/// `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` (a space may replace the `T`).
fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if b[13] != b':' || b[16] != b':' || !(1..=12).contains(&mo) || !(1..=31).contains(&d) {
        return None;
    }
    if h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut rest = &s[19..];
    let mut nanos = 0u32;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let padded = format!("{:0<9}", &frac[..digits.min(9)]);
        nanos = padded.parse().ok()?;
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 && rest.as_bytes()[3] == b':' => {
            let sign = match rest.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            sign * (num_at(rest, 1..3)? * 3600 + num_at(rest, 4..6)? * 60)
        }
        _ => return None,
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + sec - offset;
    let base = if secs >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(secs as u64))?
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(secs.unsigned_abs()))?
    };
    base.checked_add(Duration::from_nanos(nanos.into()))
}

fn num_at(s: &str, r: std::ops::Range<usize>) -> Option<i64> {
    let t = s.get(r)?;
    t.bytes()
        .all(|c| c.is_ascii_digit())
        .then(|| t.parse().ok())?
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn spec_parses_renames_pointers_and_optional_columns() {
        let cols = parse_columns("event_id:uuid, temp=temperature:double?,x=/pos/x:int8").unwrap();
        assert_eq!(cols.len(), 3);
        assert_eq!(cols[0].field, "event_id");
        assert_eq!(cols[1].name, "temp");
        assert_eq!(cols[1].field, "temperature");
        assert!(cols[1].optional && !cols[0].optional);
        assert_eq!(cols[2].field, "/pos/x");
        assert_eq!(cols[2].ty, ColumnType::BigInt);
    }

    #[test]
    fn bad_specs_are_refused_with_the_reason() {
        let err = |s: &str| parse_columns(s).unwrap_err().to_string();
        assert!(err("seq").contains("lacks a type"));
        assert!(err("seq:numeric").contains("unknown type"));
        assert!(err("a b:text").contains("not a plain identifier"));
        assert!(err("a:text,a:bigint").contains("twice"));
        assert!(err("a=:text").contains("empty field"));
    }

    #[test]
    fn mapped_fields_leave_the_rest_in_jsonb() {
        let cols = parse_columns("id:uuid,seq:bigint,x=/pos/x:double").unwrap();
        let id = "0b6f1c2e-6a8e-4c55-9a43-2a1f8f0f1e11";
        let meta = json!({"id": id, "seq": 7, "pos": {"x": 1.5, "y": 2}, "s": "ok"});
        let (cells, rest) = to_cells(&cols, meta).unwrap();
        assert_eq!(cells[0], Cell::Uuid(uuid::Uuid::parse_str(id).unwrap()));
        assert_eq!(cells[1], Cell::I64(7));
        assert_eq!(cells[2], Cell::F64(1.5));
        assert_eq!(rest, Cell::Json(json!({"pos": {"y": 2}, "s": "ok"})));
    }

    #[test]
    fn missing_and_mistyped_fields_are_bad_unless_optional() {
        let cols = parse_columns("seq:bigint,t:text?").unwrap();
        let missing = to_cells(&cols, json!({"t": "a"})).unwrap_err();
        assert_eq!(missing.to_string(), "metadata lacks field 'seq'");
        let wrong = to_cells(&cols, json!({"seq": "x"})).unwrap_err();
        assert!(wrong.to_string().contains("does not fit a bigint"));
        // null in a required column is bad here, not a NOT NULL failure of
        // the whole COPY later.
        assert!(to_cells(&cols, json!({"seq": null})).is_err());
        let (cells, _) = to_cells(&cols, json!({"seq": 1})).unwrap();
        assert_eq!(cells[1], Cell::Null);
        assert_eq!(
            to_cells(&cols, json!([1])).unwrap_err(),
            BadEvent::NotObject
        );
        let int = parse_columns("n:integer").unwrap();
        assert!(to_cells(&int, json!({"n": 1u64 << 40})).is_err());
    }

    #[test]
    fn timestamps_from_epoch_seconds_and_rfc3339_agree() {
        let want = UNIX_EPOCH + Duration::from_millis(1_700_000_000_250);
        assert_eq!(from_epoch_secs(1_700_000_000.25), Some(want));
        assert_eq!(parse_rfc3339("2023-11-14T22:13:20.25Z"), Some(want));
        assert_eq!(parse_rfc3339("2023-11-15T00:13:20.250+02:00"), Some(want));
        assert_eq!(
            parse_rfc3339("1969-12-31T23:59:59Z"),
            UNIX_EPOCH.checked_sub(Duration::from_secs(1))
        );
        assert_eq!(parse_rfc3339("2023-13-01T00:00:00Z"), None);
        assert_eq!(parse_rfc3339("yesterday"), None);
    }
}
