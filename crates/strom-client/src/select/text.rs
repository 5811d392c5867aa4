//! The textual form of a [`Selector`], for command lines and
//! configuration (`strom consume --select EXPR`):
//!
//! ```text
//! EXPR  := DATA | PRED | PRED then DATA
//! DATA  := all | none | bytes[START:STOP] | [INDEX, INDEX, ...]
//! INDEX := ... | I | [I]:[I] | [I]:[I]:[STEP]      (numpy basic indexing)
//! PRED  := FIELD OP VALUE                          (OP: == != < <= > >=)
//! ```
//!
//! `FIELD` is everything before the first comparison character: a
//! top-level key or a JSON pointer (`/a/b`). `VALUE` is a JSON literal
//! (`3`, `-1.5`, `true`, `"two words"`, `null`), or else one bare word
//! taken as a string (`kind == frame`). A predicate alone fetches all the
//! data of matching events. Examples: `bytes[0:4096]`, `[:, 10:20, ::2]`,
//! `kind == frame then [..., 0]`, `/run/step >= 100`.

use std::str::FromStr;

use serde_json::Value;
use strom_proto::Selection;

use super::{AxisIndex, CompareOp, Predicate, Selector};

/// A selector expression that does not parse, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad selector '{text}': {reason}")]
pub struct ParseError {
    pub text: String,
    pub reason: String,
}

impl FromStr for Selector {
    type Err = ParseError;

    /// Parses the textual form described in this module.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        parse(text.trim()).map_err(|reason| ParseError {
            text: text.to_string(),
            reason,
        })
    }
}

fn parse(s: &str) -> Result<Selector, String> {
    if let Some(d) = parse_data(s) {
        return d;
    }
    let at = s.find(['=', '!', '<', '>']).ok_or(
        "expected all, none, bytes[START:STOP], an array index such as [:, 0], \
         or a comparison FIELD OP VALUE",
    )?;
    let field = s[..at].trim();
    if field.is_empty() {
        return Err("the comparison names no field".into());
    }
    let rest = &s[at..];
    let len = if ["==", "!=", "<=", ">="]
        .iter()
        .any(|op| rest.starts_with(op))
    {
        2
    } else {
        1
    };
    let op: CompareOp = rest[..len].parse().map_err(|e| format!("{e}"))?;
    let (value, rest) = parse_value(rest[len..].trim_start())?;
    let then = match rest.trim() {
        "" => Selector::all(),
        r => {
            let data = r
                .strip_prefix("then")
                .filter(|d| d.starts_with(char::is_whitespace))
                .ok_or_else(|| format!("expected 'then DATA' after the value, not '{r}'"))?;
            parse_data(data.trim()).unwrap_or_else(|| {
                Err(format!(
                    "after 'then' comes all, none, bytes[START:STOP] or an array index, not '{}'",
                    data.trim()
                ))
            })?
        }
    };
    Ok(Selector::where_then(Predicate::new(field, op, value), then))
}

/// A JSON literal, or one bare word as a string; and what follows it.
fn parse_value(s: &str) -> Result<(Value, &str), String> {
    let mut values = serde_json::Deserializer::from_str(s).into_iter::<Value>();
    if let Some(Ok(v)) = values.next() {
        let rest = &s[values.byte_offset()..];
        if rest.is_empty() || rest.starts_with(char::is_whitespace) {
            return Ok((v, rest));
        }
    }
    let end = s.find(char::is_whitespace).unwrap_or(s.len());
    if end == 0 {
        return Err("the comparison has no value".into());
    }
    Ok((Value::String(s[..end].to_string()), &s[end..]))
}

/// `Some` when `s` has the shape of a `DATA` form (then parsed or refused).
fn parse_data(s: &str) -> Option<Result<Selector, String>> {
    match s {
        "all" => return Some(Ok(Selector::all())),
        "none" => return Some(Ok(Selector::none())),
        _ => {}
    }
    if let Some(inner) = s.strip_prefix("bytes[").and_then(|r| r.strip_suffix(']')) {
        return Some(parse_bytes(inner));
    }
    let inner = s.strip_prefix('[')?.strip_suffix(']')?;
    Some(parse_index(inner).map(Selector::Array))
}

fn parse_bytes(inner: &str) -> Result<Selector, String> {
    let (a, b) = inner
        .split_once(':')
        .ok_or("a byte range is bytes[START:STOP]")?;
    let num = |t: &str| -> Result<u64, String> {
        t.trim()
            .parse()
            .map_err(|_| format!("'{}' is not a byte offset", t.trim()))
    };
    let (start, stop) = (num(a)?, num(b)?);
    if stop < start {
        return Err(format!(
            "the byte range ends ({stop}) before it starts ({start})"
        ));
    }
    Ok(Selector::Fixed(Selection::Range {
        offset: start,
        len: stop - start,
    }))
}

fn parse_index(inner: &str) -> Result<Vec<AxisIndex>, String> {
    if inner.trim().is_empty() {
        return Ok(Vec::new());
    }
    inner
        .split(',')
        .map(|item| parse_axis(item.trim()))
        .collect()
}

fn parse_axis(item: &str) -> Result<AxisIndex, String> {
    let int = |t: &str| -> Result<Option<i64>, String> {
        match t.trim() {
            "" => Ok(None),
            t => t
                .parse()
                .map(Some)
                .map_err(|_| format!("'{t}' is not an integer index")),
        }
    };
    if item == "..." {
        return Ok(AxisIndex::Ellipsis);
    }
    let parts: Vec<&str> = item.split(':').collect();
    match parts[..] {
        [i] => int(i)?
            .map(AxisIndex::At)
            .ok_or_else(|| "an empty index (use ':' for a whole axis)".into()),
        [start, stop] => Ok(AxisIndex::Slice {
            start: int(start)?,
            stop: int(stop)?,
            step: 1,
        }),
        [start, stop, step] => {
            let step = int(step)?.unwrap_or(1);
            if step == 0 {
                return Err("slice step cannot be zero".into());
            }
            Ok(AxisIndex::Slice {
                start: int(start)?,
                stop: int(stop)?,
                step,
            })
        }
        _ => Err(format!("'{item}' has too many ':'")),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn sel(s: &str) -> Selector {
        s.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    fn slice(start: Option<i64>, stop: Option<i64>, step: i64) -> AxisIndex {
        AxisIndex::Slice { start, stop, step }
    }

    #[test]
    fn data_forms_parse() {
        assert_eq!(sel("all"), Selector::all());
        assert_eq!(sel(" none "), Selector::none());
        assert_eq!(
            sel("bytes[16:48]"),
            Selector::Fixed(Selection::Range {
                offset: 16,
                len: 32
            })
        );
        assert_eq!(sel("[]"), Selector::Array(vec![]));
        assert_eq!(
            sel("[:, 10:20, ::2]"),
            Selector::Array(vec![
                AxisIndex::FULL,
                slice(Some(10), Some(20), 1),
                slice(None, None, 2)
            ])
        );
        assert_eq!(
            sel("[..., -1, 5::-3]"),
            Selector::Array(vec![
                AxisIndex::Ellipsis,
                AxisIndex::At(-1),
                slice(Some(5), None, -3)
            ])
        );
    }

    #[test]
    fn predicates_parse_json_values_and_bare_words() {
        let w = |f: &str, op, v| Selector::where_then(Predicate::new(f, op, v), Selector::all());
        assert_eq!(
            sel("kind == frame"),
            w("kind", CompareOp::Eq, json!("frame"))
        );
        assert_eq!(sel("kind==frame"), w("kind", CompareOp::Eq, json!("frame")));
        assert_eq!(sel("i>=-2"), w("i", CompareOp::Ge, json!(-2)));
        assert_eq!(sel("i < 2.5"), w("i", CompareOp::Lt, json!(2.5)));
        assert_eq!(sel("/a/b != true"), w("/a/b", CompareOp::Ne, json!(true)));
        assert_eq!(
            sel(r#"name == "two words""#),
            w("name", CompareOp::Eq, json!("two words"))
        );
        // A word that merely starts like a literal is a word.
        assert_eq!(
            sel("flag == falsey"),
            w("flag", CompareOp::Eq, json!("falsey"))
        );
    }

    #[test]
    fn predicate_then_data() {
        assert_eq!(
            sel("keep == true then [:, 1, ::2]"),
            Selector::where_then(
                Predicate::new("keep", CompareOp::Eq, json!(true)),
                Selector::Array(vec![
                    AxisIndex::FULL,
                    AxisIndex::At(1),
                    slice(None, None, 2)
                ])
            )
        );
        assert_eq!(
            sel("i > 1 then bytes[0:8]"),
            Selector::where_then(
                Predicate::new("i", CompareOp::Gt, json!(1)),
                Selector::Fixed(Selection::Range { offset: 0, len: 8 })
            )
        );
    }

    #[test]
    fn malformed_expressions_say_what_is_wrong() {
        let err = |s: &str| s.parse::<Selector>().unwrap_err().reason;
        assert!(err("everything").contains("expected all, none"));
        assert!(err("== 3").contains("no field"));
        assert!(err("i = 3").contains("unknown comparison '='"));
        assert!(err("i ==").contains("no value"));
        assert!(err("i == 3 and j").contains("expected 'then DATA'"));
        assert!(err("i == 3 then some").contains("after 'then'"));
        assert!(err("bytes[8:4]").contains("ends (4) before it starts (8)"));
        assert!(err("bytes[a:4]").contains("not a byte offset"));
        assert!(err("[::0]").contains("step cannot be zero"));
        assert!(err("[1:2:3:4]").contains("too many ':'"));
        assert!(err("[x]").contains("not an integer index"));
        assert!(err("[0,]").contains("empty index"));
        let e = "nope".parse::<Selector>().unwrap_err();
        assert!(e.to_string().starts_with("bad selector 'nope': "), "{e}");
    }
}
