//! The checks of `strom verify`, as pure logic over `(partition, offset,
//! metadata)` in arrival order, so they are unit-tested without a server.
//!
//! Per device it keeps the partition it was first seen in, the next
//! expected `seq`, and the ranges of `seq` skipped so far (bounded per
//! device). An event with:
//! - `seq == next`: in order;
//! - `seq > next`: `next..seq` are missing for now (a gap);
//! - `seq < next` inside a missing range: it arrived late (order);
//! - `seq < next` otherwise: its `(device, seq)` was seen (duplicate).
//!
//! Gaps still open at the end are lost events. Events are expected from
//! `seq` 0, so a lost head is found; a lost tail is not (nothing says how
//! many a device sent). Duplicate `event_id`s are found within a window of
//! the most recent ids; `(device, seq)` duplicates are found exactly.

use std::collections::{HashMap, HashSet, VecDeque};

use serde_json::{json, Value};

use crate::gen::telemetry::{SchemaArgs, FIELDS};

/// Gap ranges remembered per device; past it, the oldest is settled as lost.
const MAX_GAPS_PER_DEVICE: usize = 64;
/// Examples kept per kind of violation.
const MAX_EXAMPLES: usize = 5;
/// Longest `device_id` accepted.
const MAX_DEVICE_ID: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Lost,
    Duplicate,
    Order,
    Schema,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Lost, Kind::Duplicate, Kind::Order, Kind::Schema];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Lost => "lost",
            Kind::Duplicate => "duplicate",
            Kind::Order => "order",
            Kind::Schema => "schema",
        }
    }
}

/// One violation, with where it was noticed.
#[derive(Clone, Debug)]
pub struct Violation {
    pub kind: Kind,
    pub partition: u32,
    pub offset: u64,
    pub detail: String,
}

/// A run of missing seqs `[from, to)`, found at `(partition, offset)`.
#[derive(Clone, Debug)]
struct Gap {
    from: u64,
    to: u64,
    offset: u64,
}

struct Device {
    partition: u32,
    next: u64,
    gaps: Vec<Gap>,
    /// Already reported in a second partition.
    split: bool,
}

/// The most recent `cap` event ids.
struct RecentIds {
    set: HashSet<u128>,
    order: VecDeque<u128>,
    cap: usize,
}

impl RecentIds {
    /// True if `id` is already in the window; adds it otherwise.
    fn seen(&mut self, id: u128) -> bool {
        if self.cap == 0 {
            return false;
        }
        if !self.set.insert(id) {
            return true;
        }
        self.order.push_back(id);
        if self.order.len() > self.cap {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        false
    }
}

pub struct Checker {
    schema: SchemaArgs,
    devices: HashMap<String, Device>,
    ids: RecentIds,
    pub events: u64,
    counts: [u64; 4],
    examples: Vec<Violation>,
}

/// What a valid event's identity fields say.
struct Ids {
    event_id: Option<u128>,
    device: Option<String>,
    seq: Option<u64>,
}

impl Checker {
    /// A checker of `schema`, remembering the last `id_window` event ids.
    pub fn new(schema: SchemaArgs, id_window: usize) -> Checker {
        Checker {
            schema,
            devices: HashMap::new(),
            ids: RecentIds {
                set: HashSet::new(),
                order: VecDeque::new(),
                cap: id_window,
            },
            events: 0,
            counts: [0; 4],
            examples: Vec::new(),
        }
    }

    pub fn devices(&self) -> usize {
        self.devices.len()
    }

    pub fn count(&self, kind: Kind) -> u64 {
        self.counts[kind as usize]
    }

    pub fn total_violations(&self) -> u64 {
        self.counts.iter().fold(0u64, |a, b| a.saturating_add(*b))
    }

    fn report(&mut self, kind: Kind, n: u64, partition: u32, offset: u64, detail: String) {
        let c = &mut self.counts[kind as usize];
        *c = c.saturating_add(n);
        if self.examples.iter().filter(|v| v.kind == kind).count() < MAX_EXAMPLES {
            self.examples.push(Violation {
                kind,
                partition,
                offset,
                detail,
            });
        }
    }

    /// Checks one event, in arrival order.
    pub fn check(&mut self, partition: u32, offset: u64, meta: &[u8]) {
        self.events += 1;
        let ids = match serde_json::from_slice::<Value>(meta) {
            Ok(v) => self.check_schema(&v, partition, offset),
            Err(e) => {
                let msg = format!("metadata is not JSON: {e}");
                self.report(Kind::Schema, 1, partition, offset, msg);
                return;
            }
        };
        let dup_id = ids.event_id.is_some_and(|id| self.ids.seen(id));
        let dup_seq = match (ids.device, ids.seq) {
            (Some(d), Some(s)) => self.check_seq(d, s, partition, offset),
            _ => false,
        };
        if dup_id && !dup_seq {
            let id = ids.event_id.map(uuid::Uuid::from_u128).unwrap_or_default();
            let msg = format!("event_id {id} seen before");
            self.report(Kind::Duplicate, 1, partition, offset, msg);
        }
    }

    /// Schema checks; returns the identity fields that are valid.
    fn check_schema(&mut self, v: &Value, partition: u32, offset: u64) -> Ids {
        let mut problems: Vec<String> = Vec::new();
        let Some(obj) = v.as_object() else {
            self.report(
                Kind::Schema,
                1,
                partition,
                offset,
                "not a JSON object".into(),
            );
            return Ids {
                event_id: None,
                device: None,
                seq: None,
            };
        };
        for f in FIELDS {
            if !obj.contains_key(f) {
                problems.push(format!("{f} missing"));
            }
        }
        let event_id = obj.get("event_id").and_then(|x| {
            let id = x.as_str().and_then(|s| uuid::Uuid::parse_str(s).ok());
            match id {
                Some(id) if id.get_version_num() == 4 => Some(id.as_u128()),
                _ => {
                    problems.push(format!("event_id {x} is not a UUID v4"));
                    None
                }
            }
        });
        let device = obj.get("device_id").and_then(|x| match x.as_str() {
            Some(s) if !s.is_empty() && s.len() <= MAX_DEVICE_ID => Some(s.to_string()),
            _ => {
                problems.push("device_id is not a non-empty string".to_string());
                None
            }
        });
        let seq = obj.get("seq").and_then(|x| {
            let s = x.as_u64();
            if s.is_none() {
                problems.push(format!("seq {x} is not an integer >= 0"));
            }
            s
        });
        if let Some(t) = obj.get("timestamp") {
            if !t.as_f64().is_some_and(|t| t.is_finite() && t > 0.0) {
                problems.push(format!("timestamp {t} is not a positive number"));
            }
        }
        let s = &self.schema;
        for (name, range) in [
            ("temperature", s.temperature),
            ("humidity", s.humidity),
            ("pressure", s.pressure),
        ] {
            if let Some(x) = obj.get(name) {
                if !x.as_f64().is_some_and(|x| range.contains(x)) {
                    problems.push(format!(
                        "{name} {x} is not a number in {}:{}",
                        range.min, range.max
                    ));
                }
            }
        }
        if let Some(x) = obj.get("status") {
            if !x.as_str().is_some_and(|st| s.status.contains(st)) {
                let allowed: Vec<&str> = s.status.names().collect();
                problems.push(format!("status {x} is not one of {}", allowed.join(",")));
            }
        }
        if !problems.is_empty() {
            self.report(Kind::Schema, 1, partition, offset, problems.join("; "));
        }
        Ids {
            event_id,
            device,
            seq,
        }
    }

    /// Sequence checks for one device; true if `(device, seq)` is a duplicate.
    fn check_seq(&mut self, device: String, seq: u64, partition: u32, offset: u64) -> bool {
        let d = self.devices.entry(device.clone()).or_insert(Device {
            partition,
            next: 0,
            gaps: Vec::new(),
            split: false,
        });
        if d.partition != partition && !d.split {
            d.split = true;
            let msg = format!(
                "device {device} is in partitions {} and {partition}: its order cannot be checked",
                d.partition
            );
            self.report(Kind::Order, 1, partition, offset, msg);
        }
        self.check_seq_in(device, seq, partition, offset)
    }

    fn check_seq_in(&mut self, device: String, seq: u64, partition: u32, offset: u64) -> bool {
        let Some(d) = self.devices.get_mut(&device) else {
            return false;
        };
        if seq >= d.next {
            if seq > d.next {
                d.gaps.push(Gap {
                    from: d.next,
                    to: seq,
                    offset,
                });
            }
            d.next = seq.saturating_add(1);
            if d.gaps.len() > MAX_GAPS_PER_DEVICE {
                let g = d.gaps.remove(0);
                self.report_gap(&device, &g, partition);
            }
            return false;
        }
        match d.gaps.iter().position(|g| g.from <= seq && seq < g.to) {
            Some(i) => {
                let g = d.gaps.remove(i);
                if g.from < seq {
                    d.gaps.push(Gap { to: seq, ..g });
                }
                if seq + 1 < g.to {
                    d.gaps.push(Gap { from: seq + 1, ..g });
                }
                let last = d.next - 1;
                let msg = format!("device {device}: seq {seq} arrived after seq {last}");
                self.report(Kind::Order, 1, partition, offset, msg);
                false
            }
            None => {
                let msg = format!("device {device}: seq {seq} seen before");
                self.report(Kind::Duplicate, 1, partition, offset, msg);
                true
            }
        }
    }

    fn report_gap(&mut self, device: &str, g: &Gap, partition: u32) {
        let msg = if g.to - g.from == 1 {
            format!("device {device}: seq {} missing", g.from)
        } else {
            format!("device {device}: seq {}..{} missing", g.from, g.to - 1)
        };
        self.report(Kind::Lost, g.to - g.from, partition, g.offset, msg);
    }

    /// Settles the gaps still open: those events are lost.
    pub fn finish(&mut self) {
        let mut open: Vec<(String, u32, Gap)> = Vec::new();
        for (name, d) in &mut self.devices {
            for g in d.gaps.drain(..) {
                open.push((name.clone(), d.partition, g));
            }
        }
        open.sort_by_key(|(_, p, g)| (*p, g.offset));
        for (name, p, g) in open {
            self.report_gap(&name, &g, p);
        }
    }

    /// The report as JSON.
    pub fn to_json(&self, end: &str, id_window: usize) -> Value {
        let counts: serde_json::Map<String, Value> = Kind::ALL
            .iter()
            .map(|k| (k.name().to_string(), json!(self.count(*k))))
            .collect();
        let examples: Vec<Value> = self
            .examples
            .iter()
            .map(|v| {
                json!({"kind": v.kind.name(), "partition": v.partition,
                       "offset": v.offset, "detail": v.detail})
            })
            .collect();
        json!({
            "ok": self.total_violations() == 0,
            "events": self.events,
            "devices": self.devices(),
            "end": end,
            "violations": counts,
            "examples": examples,
            "event_id_window": id_window,
        })
    }

    pub fn examples(&self) -> &[Violation] {
        &self.examples
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::telemetry::{parse_range, parse_status};

    fn schema() -> SchemaArgs {
        SchemaArgs {
            temperature: parse_range("-20:50").unwrap(),
            humidity: parse_range("0:100").unwrap(),
            pressure: parse_range("950:1050").unwrap(),
            status: parse_status("ok=0.97,warn=0.02,error=0.01").unwrap(),
        }
    }

    fn ev(id: u128, dev: &str, seq: u64) -> Vec<u8> {
        let id = uuid::Builder::from_random_bytes(id.to_le_bytes()).into_uuid();
        format!(
            "{{\"event_id\":\"{id}\",\"device_id\":\"{dev}\",\"timestamp\":1.5,\"seq\":{seq},\
             \"temperature\":20,\"humidity\":50,\"pressure\":1000,\"status\":\"ok\"}}"
        )
        .into_bytes()
    }

    fn run(events: &[(u32, Vec<u8>)]) -> Checker {
        let mut c = Checker::new(schema(), 1000);
        for (i, (p, m)) in events.iter().enumerate() {
            c.check(*p, i as u64, m);
        }
        c.finish();
        c
    }

    fn counts(c: &Checker) -> [u64; 4] {
        Kind::ALL.map(|k| c.count(k))
    }

    #[test]
    fn clean_interleaved_devices_pass() {
        let c = run(&[
            (0, ev(1, "a", 0)),
            (0, ev(2, "b", 0)),
            (0, ev(3, "a", 1)),
            (0, ev(4, "b", 1)),
        ]);
        assert_eq!(counts(&c), [0, 0, 0, 0]);
        assert_eq!(c.devices(), 2);
    }

    #[test]
    fn gaps_count_every_missing_seq_including_a_lost_head() {
        let c = run(&[(0, ev(1, "a", 2)), (0, ev(2, "a", 3)), (0, ev(3, "a", 7))]);
        assert_eq!(c.count(Kind::Lost), 2 + 3);
        assert_eq!(c.total_violations(), 5);
    }

    #[test]
    fn late_event_is_out_of_order_not_lost() {
        let c = run(&[(0, ev(1, "a", 0)), (0, ev(2, "a", 2)), (0, ev(3, "a", 1))]);
        assert_eq!(counts(&c), [0, 0, 1, 0]);
    }

    #[test]
    fn repeated_device_seq_or_event_id_is_a_duplicate_once() {
        let c = run(&[(0, ev(1, "a", 0)), (0, ev(1, "a", 0))]);
        assert_eq!(counts(&c), [0, 1, 0, 0]);
        let c = run(&[(0, ev(1, "a", 0)), (0, ev(1, "b", 0))]);
        assert_eq!(counts(&c), [0, 1, 0, 0]);
        let c = run(&[(0, ev(1, "a", 0)), (0, ev(2, "a", 0))]);
        assert_eq!(counts(&c), [0, 1, 0, 0]);
    }

    #[test]
    fn device_in_two_partitions_is_an_order_violation() {
        let c = run(&[(0, ev(1, "a", 0)), (1, ev(2, "a", 1))]);
        assert_eq!(counts(&c), [0, 0, 1, 0]);
    }

    #[test]
    fn schema_violations_are_named() {
        let bad = [
            b"not json".to_vec(),
            b"[1]".to_vec(),
            String::from_utf8(ev(1, "a", 0))
                .unwrap()
                .replace("\"ok\"", "\"melting\"")
                .into_bytes(),
            String::from_utf8(ev(2, "b", 0))
                .unwrap()
                .replace("\"temperature\":20", "\"temperature\":99")
                .into_bytes(),
            String::from_utf8(ev(3, "c", 0))
                .unwrap()
                .replace(",\"humidity\":50", "")
                .into_bytes(),
            String::from_utf8(ev(4, "d", 0))
                .unwrap()
                .replace("\"seq\":0", "\"seq\":-1")
                .into_bytes(),
        ];
        let c = run(&bad.iter().map(|m| (0, m.clone())).collect::<Vec<_>>());
        assert_eq!(counts(&c), [0, 0, 0, 6]);
        let details: Vec<&str> = c.examples().iter().map(|v| v.detail.as_str()).collect();
        assert!(details.iter().any(|d| d.contains("status")), "{details:?}");
    }

    #[test]
    fn event_id_window_is_bounded() {
        let mut c = Checker::new(schema(), 2);
        for (i, id) in [1u128, 2, 3, 1].iter().enumerate() {
            c.check(0, i as u64, &ev(*id, "a", i as u64));
        }
        // id 1 left the window of 2 before it came again.
        assert_eq!(c.count(Kind::Duplicate), 0);
        assert!(c.ids.set.len() <= 2);
    }
}
