//! `where` predicates: a comparison of one metadata field (a top-level key
//! or a JSON pointer) with a JSON value. Numbers compare as numbers,
//! strings lexicographically, booleans `false < true`; values of different
//! types are only ever unequal. Pure computation on `serde_json` values.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use serde_json::Value;

/// The comparison of a [`Predicate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// A comparison name that is not one of `== != < <= > >=` (or `eq`, ...).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown comparison '{0}'; use one of == != < <= > >=")]
pub struct UnknownComparison(pub String);

impl FromStr for CompareOp {
    type Err = UnknownComparison;

    fn from_str(op: &str) -> Result<Self, Self::Err> {
        Ok(match op {
            "==" | "eq" => CompareOp::Eq,
            "!=" | "ne" => CompareOp::Ne,
            "<" | "lt" => CompareOp::Lt,
            "<=" | "le" => CompareOp::Le,
            ">" | "gt" => CompareOp::Gt,
            ">=" | "ge" => CompareOp::Ge,
            _ => return Err(UnknownComparison(op.to_string())),
        })
    }
}

impl fmt::Display for CompareOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CompareOp::Eq => "==",
            CompareOp::Ne => "!=",
            CompareOp::Lt => "<",
            CompareOp::Le => "<=",
            CompareOp::Gt => ">",
            CompareOp::Ge => ">=",
        })
    }
}

impl CompareOp {
    /// Whether `a op b` holds.
    pub fn holds(self, a: &Value, b: &Value) -> bool {
        let ord = match (a, b) {
            (Value::Number(x), Value::Number(y)) => x
                .as_f64()
                .zip(y.as_f64())
                .and_then(|(x, y)| x.partial_cmp(&y)),
            (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
            (Value::Bool(x), Value::Bool(y)) => Some(x.cmp(y)),
            _ => None,
        };
        match (self, ord) {
            (CompareOp::Eq, Some(o)) => o == Ordering::Equal,
            (CompareOp::Ne, Some(o)) => o != Ordering::Equal,
            (CompareOp::Eq, None) => a == b,
            (CompareOp::Ne, None) => a != b,
            (CompareOp::Lt, Some(o)) => o == Ordering::Less,
            (CompareOp::Le, Some(o)) => o != Ordering::Greater,
            (CompareOp::Gt, Some(o)) => o == Ordering::Greater,
            (CompareOp::Ge, Some(o)) => o != Ordering::Less,
            (_, None) => false,
        }
    }
}

/// `field op value` on an event's metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct Predicate {
    pointer: String,
    op: CompareOp,
    value: Value,
}

/// The JSON pointer of a field name: itself when it starts with `/`, else
/// the pointer to that top-level key (with `~` and `/` escaped).
pub fn field_pointer(field: &str) -> String {
    if field.starts_with('/') {
        field.to_string()
    } else {
        format!("/{}", field.replace('~', "~0").replace('/', "~1"))
    }
}

impl Predicate {
    /// `field` is a top-level key, or a JSON pointer such as `/a/b`.
    pub fn new(field: &str, op: CompareOp, value: Value) -> Self {
        Predicate {
            pointer: field_pointer(field),
            op,
            value,
        }
    }

    /// The JSON pointer of the compared field.
    pub fn pointer(&self) -> &str {
        &self.pointer
    }

    pub fn op(&self) -> CompareOp {
        self.op
    }

    pub fn value(&self) -> &Value {
        &self.value
    }

    /// Whether the metadata's field compares true; `false` when the field
    /// is missing.
    pub fn matches(&self, metadata: &Value) -> bool {
        metadata
            .pointer(&self.pointer)
            .is_some_and(|x| self.op.holds(x, &self.value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(field: &str, op: &str, value: Value) -> Predicate {
        Predicate::new(field, op.parse().unwrap(), value)
    }

    #[test]
    fn numbers_compare_as_numbers_whatever_their_json_type() {
        let m = json!({"i": 2, "x": 2.5, "big": u64::MAX});
        assert!(p("i", "==", json!(2.0)).matches(&m));
        assert!(p("i", "<", json!(2.5)).matches(&m));
        assert!(p("x", ">=", json!(2)).matches(&m));
        assert!(!p("x", "<=", json!(2)).matches(&m));
        assert!(p("big", ">", json!(-1)).matches(&m));
        assert!(p("i", "ne", json!(3)).matches(&m));
    }

    #[test]
    fn strings_compare_lexicographically_and_booleans_false_first() {
        let m = json!({"kind": "frame", "keep": true});
        assert!(p("kind", "==", json!("frame")).matches(&m));
        assert!(p("kind", ">", json!("flat")).matches(&m));
        assert!(p("kind", "<", json!("g")).matches(&m));
        assert!(p("keep", ">", json!(false)).matches(&m));
        assert!(!p("keep", "==", json!(false)).matches(&m));
    }

    #[test]
    fn mismatched_types_are_only_unequal() {
        let m = json!({"i": 2, "o": {"a": 1}, "n": null});
        for op in ["==", "<", "<=", ">", ">="] {
            assert!(!p("i", op, json!("2")).matches(&m), "{op}");
        }
        assert!(p("i", "!=", json!("2")).matches(&m));
        assert!(p("o", "==", json!({"a": 1})).matches(&m));
        assert!(p("n", "==", Value::Null).matches(&m));
        assert!(!p("n", "<", Value::Null).matches(&m));
    }

    #[test]
    fn a_missing_field_never_matches_not_even_ne() {
        let m = json!({"i": 2});
        assert!(!p("j", "!=", json!(1)).matches(&m));
        assert!(!p("/i/deeper", "==", json!(2)).matches(&m));
        assert!(!p("i", "==", json!(2)).matches(&json!("not an object")));
    }

    #[test]
    fn fields_are_keys_or_json_pointers() {
        let m = json!({"a": {"b": 7}, "a/b": 1, "t~x": 3});
        assert!(p("/a/b", "==", json!(7)).matches(&m));
        assert!(p("a/b", "==", json!(1)).matches(&m));
        assert!(p("t~x", "==", json!(3)).matches(&m));
        assert_eq!(p("a/b", "==", json!(1)).pointer(), "/a~1b");
    }

    #[test]
    fn comparisons_parse_symbols_and_names_and_print_symbols() {
        for (s, name) in [
            ("==", "eq"),
            ("!=", "ne"),
            ("<", "lt"),
            ("<=", "le"),
            (">", "gt"),
            (">=", "ge"),
        ] {
            let op: CompareOp = s.parse().unwrap();
            assert_eq!(name.parse::<CompareOp>().unwrap(), op);
            assert_eq!(op.to_string(), s);
        }
        let e = "=~".parse::<CompareOp>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown comparison '=~'; use one of == != < <= > >="
        );
    }
}
