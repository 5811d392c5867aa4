//! `strom demo`: an embedded server, a producer and a consumer moving events
//! with data parts through a file-backed topic, then a short summary.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use clap::Args;
use strom_client::{Driver, Next, Selection, TopicSpec};

#[derive(Args)]
pub struct DemoArgs {
    /// Events to move.
    #[arg(long, default_value_t = 20000)]
    events: u64,
    /// Bytes of data per event.
    #[arg(long, default_value_t = 16384)]
    data_size: usize,
    /// Partitions of the demo topic.
    #[arg(long, default_value_t = 4)]
    partitions: u32,
    /// Keep the data here instead of a temporary directory.
    #[arg(long)]
    dir: Option<PathBuf>,
}

pub fn run(a: DemoArgs) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = a.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    let driver = Driver::embedded(&dir)?;
    println!(
        "strom demo: embedded server at {} (data in {})",
        driver.master_addr(),
        dir.display()
    );
    let name = format!("demo-{}", std::process::id());
    let topic = driver.create_topic(TopicSpec {
        validator: "json".into(),
        ..TopicSpec::new(&name, a.partitions)
    })?;

    let payload: Vec<Bytes> = (0..16u8)
        .map(|k| {
            Bytes::from(
                (0..a.data_size)
                    .map(|i| (i as u8).wrapping_mul(31).wrapping_add(k))
                    .collect::<Vec<u8>>(),
            )
        })
        .collect();
    let producer = topic.producer()?;
    let t0 = Instant::now();
    let mut futures = Vec::with_capacity(a.events as usize);
    for i in 0..a.events {
        let meta = format!("{{\"event\":{i},\"kind\":\"demo\",\"variant\":{}}}", i % 16);
        futures.push(producer.push(meta, payload[(i % 16) as usize].clone())?);
    }
    producer.flush()?;
    for f in futures {
        f.wait()?;
    }
    producer.close()?;
    let produce_s = t0.elapsed().as_secs_f64();

    let consumer = topic.consumer_with(
        "demo-consumer",
        strom_client::ConsumerOptions {
            selector: Arc::new(Selection::All),
            ..Default::default()
        },
    )?;
    let t1 = Instant::now();
    let (mut n, mut bytes, mut bad) = (0u64, 0u64, 0u64);
    let mut last_ack = Vec::new();
    while let Next::Event(ev) = consumer.pull().wait()? {
        let v = ev.json()?;
        let variant = v["variant"].as_u64().unwrap_or(99) as usize;
        if payload.get(variant).map(|p| &p[..]) != Some(ev.data()) {
            bad += 1;
        }
        bytes += ev.data().len() as u64;
        n += 1;
        if n % 1000 == 0 {
            last_ack.push(ev.ack());
        }
    }
    for a in last_ack {
        a.wait()?;
    }
    let consume_s = t1.elapsed().as_secs_f64();
    let total = (a.events as f64) * (a.data_size as f64);
    println!(
        "produced {} events x {} B in {:.3} s: {:.0} events/s, {:.1} MB/s",
        a.events,
        a.data_size,
        produce_s,
        a.events as f64 / produce_s,
        total / produce_s / 1e6
    );
    println!(
        "consumed {n} events, {bytes} data bytes in {consume_s:.3} s: {:.0} events/s, {:.1} MB/s",
        n as f64 / consume_s,
        bytes as f64 / consume_s / 1e6
    );
    println!("end of stream reached; {bad} events with wrong data");
    // Before the temporary directory goes: the server's last sync needs it.
    drop((consumer, topic));
    driver.stop_embedded();
    if n != a.events || bad != 0 {
        anyhow::bail!(
            "demo verification failed: expected {} intact events, got {n} ({bad} wrong)",
            a.events
        );
    }
    Ok(())
}
