//! The built-in data selectors, one engine for every surface (Rust, the
//! Python binding, the CLI's `--select`, later the C API): a fixed
//! [`Selection`], a `where` [`Predicate`] on a metadata field, and an N-d
//! sub-array of an array payload described by an [`ArrayLayout`]. A
//! [`Selector`] is a [`DataSelector`], so it plugs straight into
//! [`ConsumerOptions::selector`](crate::ConsumerOptions); it also has a
//! textual form (see [`Selector::from_str`](std::str::FromStr)).
//!
//! Everything here is pure computation on metadata and descriptors: no
//! I/O, no runtime, nothing a binding's interpreter lock would have to
//! guard. Language bindings only convert their own objects into these
//! types.

mod array;
mod predicate;
mod text;

use strom_proto::Selection;

use crate::data::{DataDescriptor, DataSelector, EventMeta};

pub use array::{itemsize, ArrayError, ArrayLayout, AxisIndex, Order, SubArray};
pub use predicate::{field_pointer, CompareOp, Predicate, UnknownComparison};
pub use text::ParseError;

/// A built-in data selector.
#[derive(Clone, Debug, PartialEq)]
pub enum Selector {
    /// The same selection for every event.
    Fixed(Selection),
    /// `then` for events whose metadata matches, nothing for the others
    /// (nor for events whose field is missing).
    Where {
        predicate: Predicate,
        then: Box<Selector>,
    },
    /// A sub-array of array payloads (numpy basic indexing), for events
    /// whose descriptor is an [`ArrayLayout`]; other events are an error.
    Array(Vec<AxisIndex>),
}

/// Why a selector refused an event. The consumer reports it as a
/// `DATA_SELECTOR` error on the pull.
#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    /// A `where` selector could not decode the event's metadata.
    #[error(transparent)]
    Metadata(Box<crate::Error>),
    #[error("event {partition}/{offset} has no array descriptor; an array selection needs data pushed as a numpy array")]
    NotAnArray { partition: u32, offset: u64 },
    #[error("event {partition}/{offset}: the array descriptor describes {described:?} bytes but the data has {size}")]
    SizeMismatch {
        partition: u32,
        offset: u64,
        described: Option<u64>,
        size: u64,
    },
    #[error(transparent)]
    Array(#[from] ArrayError),
}

/// What a [`Selector`] chose for one event.
#[derive(Clone, Debug, PartialEq)]
pub struct Picked {
    pub selection: Selection,
    /// For an array sub-selection: the layout of the fetched bytes.
    pub layout: Option<ArrayLayout>,
}

impl Picked {
    fn fixed(selection: Selection) -> Self {
        Picked {
            selection,
            layout: None,
        }
    }
}

impl Selector {
    /// Every byte (what a consumer fetches by default).
    pub fn all() -> Self {
        Selector::Fixed(Selection::All)
    }

    /// No data: metadata only.
    pub fn none() -> Self {
        Selector::Fixed(Selection::None)
    }

    /// `then` for events whose metadata matches `predicate`, nothing for
    /// the others.
    pub fn where_then(predicate: Predicate, then: Selector) -> Self {
        Selector::Where {
            predicate,
            then: Box::new(then),
        }
    }

    /// The sub-array `index` of every array payload.
    pub fn array(index: Vec<AxisIndex>) -> Self {
        Selector::Array(index)
    }

    /// Whether some events may get an array sub-selection (and so a
    /// [`Picked::layout`] the application needs to read the bytes).
    pub fn selects_arrays(&self) -> bool {
        match self {
            Selector::Fixed(_) => false,
            Selector::Where { then, .. } => then.selects_arrays(),
            Selector::Array(_) => true,
        }
    }

    /// Evaluates the selector on one event.
    pub fn eval(&self, meta: &EventMeta, data: &DataDescriptor) -> Result<Picked, SelectError> {
        match self {
            Selector::Fixed(s) => Ok(Picked::fixed(s.clone())),
            Selector::Where { predicate, then } => {
                let v = meta
                    .json()
                    .map_err(|e| SelectError::Metadata(Box::new(e)))?;
                if predicate.matches(&v) {
                    then.eval(meta, data)
                } else {
                    Ok(Picked::fixed(Selection::None))
                }
            }
            Selector::Array(index) => {
                let Some(l) = ArrayLayout::parse(&data.descriptor) else {
                    return Err(SelectError::NotAnArray {
                        partition: meta.partition,
                        offset: meta.offset,
                    });
                };
                if l.nbytes() != Some(data.size) {
                    return Err(SelectError::SizeMismatch {
                        partition: meta.partition,
                        offset: meta.offset,
                        described: l.nbytes(),
                        size: data.size,
                    });
                }
                let sub = l.select(index)?;
                Ok(Picked {
                    selection: Selection::Ranges(sub.ranges),
                    layout: Some(sub.layout),
                })
            }
        }
    }
}

impl From<Selection> for Selector {
    fn from(s: Selection) -> Self {
        Selector::Fixed(s)
    }
}

/// The consumer calls [`try_select`](DataSelector::try_select), so an event
/// a selector refuses fails the pull with `DATA_SELECTOR` and the reason;
/// a direct call of `select` fetches nothing of it.
impl DataSelector for Selector {
    fn select(&self, meta: &EventMeta, data: &DataDescriptor) -> Selection {
        self.try_select(meta, data).unwrap_or(Selection::None)
    }

    fn try_select(&self, meta: &EventMeta, data: &DataDescriptor) -> Result<Selection, String> {
        self.eval(meta, data)
            .map(|p| p.selection)
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;
    use serde_json::json;
    use strom_policy::TopicPolicy;

    use super::*;

    fn meta(json: &str) -> EventMeta {
        let policy = TopicPolicy::new("none", None, "round-robin", "json").unwrap();
        EventMeta::new(
            3,
            17,
            0,
            Bytes::from(json.to_owned()),
            crate::data::PolicyHandle::new(Arc::new(policy)),
        )
    }

    fn array_data(layout: &ArrayLayout) -> DataDescriptor {
        DataDescriptor {
            size: layout.nbytes().unwrap(),
            descriptor: layout.to_descriptor().into(),
        }
    }

    fn plain(size: u64) -> DataDescriptor {
        DataDescriptor {
            size,
            descriptor: Bytes::new(),
        }
    }

    fn grid() -> ArrayLayout {
        ArrayLayout {
            dtype: "<f4".into(),
            shape: vec![4, 5],
            order: Order::C,
        }
    }

    #[test]
    fn where_applies_then_only_to_matching_events() {
        let sel = Selector::where_then(
            Predicate::new("i", CompareOp::Ge, json!(2)),
            Selector::Fixed(Selection::Range { offset: 4, len: 8 }),
        );
        let d = plain(100);
        assert_eq!(
            sel.try_select(&meta(r#"{"i": 3}"#), &d),
            Ok(Selection::Range { offset: 4, len: 8 })
        );
        assert_eq!(
            sel.try_select(&meta(r#"{"i": 1}"#), &d),
            Ok(Selection::None)
        );
        assert_eq!(
            sel.try_select(&meta(r#"{"j": 9}"#), &d),
            Ok(Selection::None)
        );
        assert!(!sel.selects_arrays());
    }

    #[test]
    fn where_on_undecodable_metadata_is_an_error() {
        let sel = Selector::where_then(
            Predicate::new("i", CompareOp::Eq, json!(1)),
            Selector::all(),
        );
        let e = sel.eval(&meta("{not json"), &plain(1)).unwrap_err();
        assert!(matches!(e, SelectError::Metadata(_)), "{e:?}");
    }

    #[test]
    fn array_selection_returns_ranges_and_the_fetched_layout() {
        let sel = Selector::array(vec![
            AxisIndex::Slice {
                start: Some(1),
                stop: Some(3),
                step: 1,
            },
            AxisIndex::At(-1),
        ]);
        let p = sel.eval(&meta("{}"), &array_data(&grid())).unwrap();
        assert_eq!(p.selection, Selection::Ranges(vec![(36, 4), (56, 4)]));
        assert_eq!(p.layout.unwrap().shape, vec![2]);
        assert!(sel.selects_arrays());
    }

    #[test]
    fn array_selection_refuses_data_that_is_not_the_described_array() {
        let sel = Selector::array(vec![AxisIndex::At(0)]);
        let e = sel.try_select(&meta("{}"), &plain(80)).unwrap_err();
        assert!(e.contains("event 3/17 has no array descriptor"), "{e}");
        let mut d = array_data(&grid());
        d.size -= 1;
        let e = sel.eval(&meta("{}"), &d).unwrap_err();
        assert!(
            matches!(
                e,
                SelectError::SizeMismatch {
                    described: Some(80),
                    size: 79,
                    ..
                }
            ),
            "{e:?}"
        );
        let bad = Selector::array(vec![AxisIndex::At(9)]);
        let e = bad.eval(&meta("{}"), &array_data(&grid())).unwrap_err();
        assert_eq!(
            e.to_string(),
            "index 9 is out of bounds for axis 0 with size 4"
        );
    }

    #[test]
    fn where_then_array_selects_only_matching_arrays() {
        let sel = Selector::where_then(
            Predicate::new("keep", CompareOp::Eq, json!(true)),
            Selector::array(vec![AxisIndex::FULL, AxisIndex::At(0)]),
        );
        let d = array_data(&grid());
        let p = sel.eval(&meta(r#"{"keep": true}"#), &d).unwrap();
        assert_eq!(p.layout.map(|l| l.shape), Some(vec![4]));
        let p = sel.eval(&meta(r#"{"keep": false}"#), &d).unwrap();
        assert_eq!(p, Picked::fixed(Selection::None));
        // A refused event is fetched as nothing through `select`.
        let refused = Selector::array(vec![AxisIndex::At(0)]);
        assert_eq!(refused.select(&meta("{}"), &plain(3)), Selection::None);
    }
}
