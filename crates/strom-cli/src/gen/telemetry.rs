//! The telemetry event schema shared by `strom gen` and `strom verify`:
//! metric ranges and the status mix (command-line options both commands
//! take, so the verifier checks what the generator was told to make), and
//! the generator's event encoding.
//!
//! An event's metadata is one JSON object:
//! `{"event_id":"<uuid v4>","device_id":"dev-000042","timestamp":1763919667.123456,
//! "seq":5,"temperature":21.5,"humidity":40.25,"pressure":1001.75,"status":"ok"}`.
//! `timestamp` is the generation time in seconds since the UNIX epoch, with
//! microsecond resolution (a number, cheap to make and to compare).

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Args;
use rand::rngs::SmallRng;
use rand::RngExt;

/// Longest status name accepted, and most statuses in a mix.
const MAX_STATUS_LEN: usize = 64;
const MAX_STATUSES: usize = 32;
/// How far the status probabilities may sum from 1.
const SUM_TOLERANCE: f64 = 0.001;

/// The fields every telemetry event carries.
pub const FIELDS: [&str; 8] = [
    "event_id",
    "device_id",
    "timestamp",
    "seq",
    "temperature",
    "humidity",
    "pressure",
    "status",
];

/// An inclusive range of a metric, `MIN:MAX`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Range {
    pub min: f64,
    pub max: f64,
}

impl Range {
    pub fn contains(&self, v: f64) -> bool {
        v >= self.min && v <= self.max
    }
}

/// Parses `MIN:MAX` (finite numbers, MIN <= MAX).
pub fn parse_range(s: &str) -> Result<Range, String> {
    let (a, b) = s
        .split_once(':')
        .ok_or_else(|| format!("'{s}' is not MIN:MAX"))?;
    let num = |t: &str| -> Result<f64, String> {
        match t.trim().parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(v),
            _ => Err(format!("'{t}' in '{s}' is not a finite number")),
        }
    };
    let r = Range {
        min: num(a)?,
        max: num(b)?,
    };
    if r.min > r.max {
        return Err(format!("'{s}': MIN is above MAX"));
    }
    Ok(r)
}

/// Statuses with their probabilities, in the order given.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusMix {
    /// (name, cumulative probability up to and including this status)
    entries: Vec<(String, f64)>,
}

impl StatusMix {
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(n, _)| n.as_str())
    }

    pub fn contains(&self, name: &str) -> bool {
        self.names().any(|n| n == name)
    }

    /// The status for a uniform draw `u` in [0, 1).
    pub fn pick(&self, u: f64) -> &str {
        let total = self.entries.last().map_or(1.0, |e| e.1);
        let x = u * total;
        self.entries
            .iter()
            .find(|(_, cum)| x < *cum)
            .or(self.entries.last())
            .map_or("ok", |(n, _)| n.as_str())
    }
}

/// Parses `NAME=P,NAME=P,...`: names of `[A-Za-z0-9_-]`, each once,
/// probabilities in [0, 1] summing to 1 (within 0.001).
pub fn parse_status(s: &str) -> Result<StatusMix, String> {
    let mut entries: Vec<(String, f64)> = Vec::new();
    let mut sum = 0.0;
    for item in s.split(',') {
        let (name, p) = item
            .split_once('=')
            .ok_or_else(|| format!("'{item}' is not NAME=PROBABILITY"))?;
        let name = name.trim();
        let valid = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
        if name.is_empty() || name.len() > MAX_STATUS_LEN || !name.chars().all(valid) {
            return Err(format!(
                "status name '{name}' must be 1 to {MAX_STATUS_LEN} letters, digits, '_' or '-'"
            ));
        }
        if entries.iter().any(|(n, _)| n == name) {
            return Err(format!("status '{name}' is given twice"));
        }
        if entries.len() == MAX_STATUSES {
            return Err(format!("at most {MAX_STATUSES} statuses"));
        }
        let p: f64 = match p.trim().parse() {
            Ok(p) if (0.0..=1.0).contains(&p) => p,
            _ => {
                return Err(format!(
                    "probability of '{name}' must be in [0, 1], not '{p}'"
                ))
            }
        };
        sum += p;
        entries.push((name.to_string(), sum));
    }
    if (sum - 1.0).abs() > SUM_TOLERANCE {
        return Err(format!("status probabilities sum to {sum}, not 1"));
    }
    Ok(StatusMix { entries })
}

/// The event schema's options, taken by both `gen` and `verify`.
#[derive(Args, Clone, Debug)]
pub struct SchemaArgs {
    /// Temperature range (°C), MIN:MAX.
    #[arg(long, default_value = "-20:50", value_parser = parse_range, allow_hyphen_values = true)]
    pub temperature: Range,
    /// Relative humidity range (%), MIN:MAX.
    #[arg(long, default_value = "0:100", value_parser = parse_range, allow_hyphen_values = true)]
    pub humidity: Range,
    /// Pressure range (hPa), MIN:MAX.
    #[arg(long, default_value = "950:1050", value_parser = parse_range, allow_hyphen_values = true)]
    pub pressure: Range,
    /// Statuses and their probabilities (summing to 1); the verifier
    /// accepts exactly these names.
    #[arg(long, default_value = "ok=0.97,warn=0.02,error=0.01", value_parser = parse_status)]
    pub status: StatusMix,
}

/// Writes one device's event into `out` (cleared first).
pub struct EventWriter<'a> {
    pub schema: &'a SchemaArgs,
    pub prefix: &'a str,
}

impl EventWriter<'_> {
    pub fn write(&self, rng: &mut SmallRng, device: u64, seq: u64, out: &mut String) {
        out.clear();
        let id = uuid::Builder::from_random_bytes(rng.random()).into_uuid();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let s = self.schema;
        let draw = |rng: &mut SmallRng, r: Range| {
            if r.min == r.max {
                r.min
            } else {
                rng.random_range(r.min..=r.max)
            }
        };
        let (t, h, p) = (
            draw(rng, s.temperature),
            draw(rng, s.humidity),
            draw(rng, s.pressure),
        );
        let status = s.status.pick(rng.random::<f64>());
        // Writing to a String cannot fail.
        let _ = write!(
            out,
            "{{\"event_id\":\"{id}\",\"device_id\":\"{}{device:06}\",\"timestamp\":{}.{:06},\
             \"seq\":{seq},\"temperature\":{t},\"humidity\":{h},\"pressure\":{p},\
             \"status\":\"{status}\"}}",
            self.prefix,
            now.as_secs(),
            now.subsec_micros()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn range_parses_negative_and_rejects_inverted_or_nan() {
        assert_eq!(
            parse_range("-20:50"),
            Ok(Range {
                min: -20.0,
                max: 50.0
            })
        );
        assert!(parse_range("5:1").is_err());
        assert!(parse_range("nan:1").is_err());
        assert!(parse_range("1").is_err());
        assert!(parse_range("1:inf").is_err());
    }

    #[test]
    fn status_mix_must_sum_to_one_and_picks_by_probability() {
        let m = parse_status("ok=0.5,warn=0.25,error=0.25").unwrap();
        assert_eq!(m.pick(0.0), "ok");
        assert_eq!(m.pick(0.6), "warn");
        assert_eq!(m.pick(0.99), "error");
        assert!(parse_status("ok=0.5,warn=0.2").is_err());
        assert!(parse_status("ok=1,ok=0").is_err());
        assert!(parse_status("ok=2").is_err());
        assert!(parse_status("o\"k=1").is_err());
        assert!(parse_status("ok").is_err());
    }

    #[test]
    fn written_event_is_json_with_every_field_in_range() {
        let schema = SchemaArgs {
            temperature: parse_range("-1:1").unwrap(),
            humidity: parse_range("5:5").unwrap(),
            pressure: parse_range("0:10").unwrap(),
            status: parse_status("ok=1").unwrap(),
        };
        let w = EventWriter {
            schema: &schema,
            prefix: "x-",
        };
        let mut rng = SmallRng::seed_from_u64(7);
        let mut s = String::new();
        w.write(&mut rng, 42, 3, &mut s);
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        for f in FIELDS {
            assert!(v.get(f).is_some(), "{f} missing in {s}");
        }
        assert_eq!(v["device_id"], "x-000042");
        assert_eq!(v["seq"], 3);
        assert_eq!(v["humidity"], 5.0);
        assert!(schema
            .temperature
            .contains(v["temperature"].as_f64().unwrap()));
        let id = uuid::Uuid::parse_str(v["event_id"].as_str().unwrap()).unwrap();
        assert_eq!(id.get_version_num(), 4);
    }
}
