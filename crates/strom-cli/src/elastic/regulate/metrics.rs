//! `strom regulate --metrics-listen ADDR`: the regulator's own metrics in
//! the Prometheus text format (0.0.4) at `GET /metrics`, served on its own
//! thread through the same bounded listener as the servers' HTTP endpoint
//! (`strom_http::listener`). [`Metrics`] is what the loop updates.

use std::fmt::Write;
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use super::decide::Load;
use super::policy::Policy;

/// The values exported.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    pub members: u32,
    pub draining: u32,
    pub started: u32,
    /// Decisions by action: hold, add, drain.
    pub decisions: [u64; 3],
    /// Launches or drains that failed.
    pub failures: u64,
    /// The group's load at the last sample (totals).
    pub load: Option<Load>,
    pub min_members: u32,
    pub max_members: u32,
    pub targets: Vec<(&'static str, f64)>,
}

pub type Shared = Arc<Mutex<Metrics>>;

impl Metrics {
    pub fn new(p: &Policy) -> Metrics {
        Metrics {
            min_members: p.min_members,
            max_members: p.max_members,
            targets: p.targets.set(),
            ..Metrics::default()
        }
    }

    /// The Prometheus text.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let mut gauge = |name: &str, help: &str, v: f64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        gauge(
            "strom_regulator_members",
            "Members alive and not draining.",
            f64::from(self.members),
        );
        gauge(
            "strom_regulator_draining_members",
            "Members being drained.",
            f64::from(self.draining),
        );
        gauge(
            "strom_regulator_started_members",
            "Members the regulator started that are still in the group.",
            f64::from(self.started),
        );
        gauge(
            "strom_regulator_min_members",
            "The policy's minimum.",
            f64::from(self.min_members),
        );
        gauge(
            "strom_regulator_max_members",
            "The policy's maximum.",
            f64::from(self.max_members),
        );
        if let Some(l) = self.load {
            for (name, help, v) in [
                (
                    "produce_bytes_per_second",
                    "Bytes produced per second, the whole group.",
                    l.produce_bytes_per_s,
                ),
                (
                    "consume_bytes_per_second",
                    "Bytes consumed per second, the whole group.",
                    l.consume_bytes_per_s,
                ),
                (
                    "consumer_lag_events",
                    "Events consumer names are behind, the whole group.",
                    l.lag_events,
                ),
                (
                    "stored_bytes",
                    "Bytes stored, every copy, the whole group.",
                    l.disk_bytes,
                ),
            ] {
                gauge(&format!("strom_regulator_{name}"), help, v);
            }
        }
        let _ = writeln!(
            s,
            "# HELP strom_regulator_target Load per member the policy aims at.\n\
             # TYPE strom_regulator_target gauge"
        );
        for (name, t) in &self.targets {
            let _ = writeln!(s, "strom_regulator_target{{metric=\"{name}\"}} {t}");
        }
        let _ = writeln!(
            s,
            "# HELP strom_regulator_decisions_total Decisions taken, by action.\n\
             # TYPE strom_regulator_decisions_total counter"
        );
        for (action, n) in ["hold", "add", "drain"].iter().zip(self.decisions) {
            let _ = writeln!(
                s,
                "strom_regulator_decisions_total{{action=\"{action}\"}} {n}"
            );
        }
        let _ = writeln!(
            s,
            "# HELP strom_regulator_failures_total Launches and drains that failed.\n\
             # TYPE strom_regulator_failures_total counter\n\
             strom_regulator_failures_total {}",
            self.failures
        );
        s
    }
}

/// Binds `addr` now (a bad address fails the command at once), prints the
/// bound address on stderr, and serves on a background thread.
pub fn spawn(addr: &str, shared: Shared) -> anyhow::Result<SocketAddr> {
    let listener =
        TcpListener::bind(addr).with_context(|| format!("binding --metrics-listen {addr}"))?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the metrics endpoint's runtime")?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .with_state(shared);
    std::thread::Builder::new()
        .name("regulate-metrics".into())
        .spawn(move || {
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!(error = %e, "metrics endpoint");
                        return;
                    }
                };
                // Never stopped: it lives as long as the process.
                let (_keep, never) = tokio::sync::watch::channel(false);
                strom_http::listener::serve(
                    listener,
                    app,
                    strom_http::listener::Limits::default(),
                    "regulate-metrics",
                    None,
                    never,
                )
                .await;
            })
        })
        .context("starting the metrics endpoint's thread")?;
    eprintln!("regulator metrics on http://{bound}/metrics");
    Ok(bound)
}

async fn metrics(State(m): State<Shared>) -> impl IntoResponse {
    let text = match m.lock() {
        Ok(m) => m.render(),
        Err(p) => p.into_inner().render(),
    };
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_has_help_and_type_and_the_values_show() {
        let m = Metrics {
            members: 2,
            decisions: [5, 1, 0],
            load: Some(Load {
                produce_bytes_per_s: 1500.0,
                ..Load::default()
            }),
            targets: vec![("produce_bytes_per_s", 1000.0)],
            ..Metrics::default()
        };
        let text = m.render();
        assert!(text.contains("strom_regulator_members 2\n"), "{text}");
        assert!(text.contains("strom_regulator_decisions_total{action=\"add\"} 1\n"));
        assert!(text.contains("strom_regulator_produce_bytes_per_second 1500\n"));
        assert!(text.contains("strom_regulator_target{metric=\"produce_bytes_per_s\"} 1000\n"));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(
                text.contains(&format!("# TYPE {name} ")),
                "no TYPE for {name}"
            );
        }
    }
}
